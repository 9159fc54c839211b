#!/usr/bin/env python3
"""The soak test behind scripts/soak.sh (which finds the binaries and stops what is left over).

For each store (memory, then a six-node Redis Cluster at `durability: replica`) it starts the fake
tool (examples/fake_tool.rs), the real toolgate binary and, for Redis, examples/redis_cluster; then
a few worker threads drive a steady mixed load for the given minutes through /v1/invoke,
/tools/{tool} and /mcp on keep-alive connections, every call with the outcome its class must have:

    search      READY/EVIDENCE_FOUND (a projection of /search; envelope, intercept and MCP forms)
    empty       READY/NO_EVIDENCE (/empty)
    too_large   RESULT_TOO_LARGE (/big: about 2 MiB, over the tool's raw_bytes of 64 KiB; a
                MiB-sized limit would make the RSS swing by more than the 5 % the check allows)
    timeout     TOOL_TIMEOUT (/slow asked to sleep 1 s, tool timeout_ms 100)
    duplicate   DUPLICATE_TOOL_CALL (an id this run already answered, sent again)
    unknown     UNKNOWN_TOOL;  bad_token UNAUTHENTICATED;  schema INVALID_INPUT;
    mismatch    RUN_MISMATCH (another run's id);  inactive RUN_INACTIVE (a run already ended)

Runs rotate: a few are open at a time, each takes calls for a few seconds, is then ended, and its
end is checked at once: the facts hold exactly its READY calls (per-worker order kept), every call
answered READY or with an execution error has its record (200, same status, code and evidence),
and sampled rejected ids have none. Rotating keeps the memory store at a steady size (its records
expire after a short TTL, so its RSS can be judged); Redis keeps every record for the whole soak,
and at the end every record of the runs whose shard failed over is read again, plus a sample of
the rest. Redis only: at mid-soak the primary of an open run's slot is killed (SIGKILL), the
replica takes over, the node is restarted and comes back as a replica; during that window calls
may fail with STORE_UNAVAILABLE and nothing else, and no acknowledged record may be lost.

toolgate's RSS (/proc/PID/status) is sampled about four times a second, with jitter. Its growth
after warm-up is judged from the level just after the warm-up (the first 20 % of the time, at least
30 s) to the level at the end of the load, each the mean over a window of 30 s (5 % of the time
when that is longer): a mean, because a run's end materializes its records and makes the RSS saw
by a few MiB; and the first window starts after the warm-up, because the first 25 s or so still
ramp up (the memory store fills for one record TTL, the allocator's pages settle). A 2-minute soak
compares 30-60 s with 90-120 s. A soak too short for two windows after its warm-up (under 90 s)
fails its RSS check, saying so.

The growth allowed is 5 %, in a soak of any length. toolgate runs without transparent huge
pages (src/main.rs), so its heap moves in 4 KiB pages, not 2 MiB ones: over 674 pairs of windows
placed as a 2-minute soak places them, taken from a 30-minute soak on each store, the growth had a
mean of +0.08-0.14 % and a standard deviation of 0.84-0.87 %, and none passed +2.1 %. (With huge pages the
deviation was 2.0-2.8 %, and the kernel's background collapse raised the RSS by 3-4 MiB about 11
minutes in.) A 5 % limit catches a leak of about 130 bytes per call in a 2-minute soak.

Prints one summary per store; exit status 0 when every check held, 1 when one failed, 2 when the
harness itself could not run. Standard library only.
"""

import argparse
import collections
import faulthandler
import http.client
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time

SCRIPTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS_DIR)
from ports import free_ports  # noqa: E402  (the scripts' one port helper)
from procs import Procs, log_tail  # noqa: E402  (and their process handling)
from wait import wait_http  # noqa: E402  (and their one wait for a server)

RAW_MARKER = "RAW-SECRET-MARKER-7f3a"  # tests/support/fake_tool.rs: never in an agent's answer
MIB = 1024 * 1024
# RSS growth allowed after warm-up, in %, and the shortest window a level is the mean of, in s
# (the module docstring says why).
RSS_LIMIT, RSS_WINDOW_S = 5.0, 30.0


# The HTTP status of each code this soak can meet (docs/api.md, error codes).
HTTP_STATUS = {
    "UNAUTHENTICATED": 401, "INVALID_INPUT": 400, "INVALID_TOOL_CALL_ID": 400, "RUN_MISMATCH": 403,
    "UNKNOWN_TOOL": 404, "UNAUTHORIZED": 403, "DUPLICATE_TOOL_CALL": 409, "RUN_INACTIVE": 409,
    "RUN_DEADLINE_EXCEEDED": 409, "BUDGET_EXHAUSTED": 429, "RUN_CANCELLED": 409,
    "TOOL_EXECUTION_FAILED": 502, "TOOL_TIMEOUT": 504, "RESULT_TOO_LARGE": 502,
    "PROJECTION_FAILED": 502, "RECORD_EXPIRED": 503, "STORE_UNAVAILABLE": 503,
    "SHUTTING_DOWN": 503, "OVERLOADED": 503, "INTERNAL": 500, "REQUEST_TOO_LARGE": 413,
    "POLICY_DENIED": 403,
}

FOUND, EMPTY = "READY/EVIDENCE_FOUND", "READY/NO_EVIDENCE"
# class: (weight, expected outcome, touches the store). The weights are percentages.
CLASSES = {
    "search": (44, FOUND, True),
    "search_tools": (10, FOUND, True),
    "search_mcp": (5, FOUND, True),
    "empty": (12, EMPTY, True),
    "too_large": (2, "RESULT_TOO_LARGE", True),
    "timeout": (2, "TOOL_TIMEOUT", True),
    "duplicate": (10, "DUPLICATE_TOOL_CALL", True),
    "unknown": (4, "UNKNOWN_TOOL", False),
    "bad_token": (4, "UNAUTHENTICATED", False),
    "schema": (4, "INVALID_INPUT", False),
    "mismatch": (2, "RUN_MISMATCH", False),
    "inactive": (1, "RUN_INACTIVE", True),
}
# Outcomes that leave a record: the reservation succeeded, finalize wrote READY or ERROR.
RECORDED = {FOUND, EMPTY, "RESULT_TOO_LARGE", "TOOL_TIMEOUT"}
# Rejections whose fresh id must leave no trace.
NO_TRACE = {"unknown", "bad_token", "schema", "mismatch"}


class Failure(Exception):
    """The harness itself could not run (not a failed check)."""


# ----------------------------------------------------------------------------------------------
# Processes.

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise OSError(f"no VmRSS for {pid}")


# ----------------------------------------------------------------------------------------------
# Redis.

def redis_cli(port, *args, timeout=5):
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--raw", *args],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise Failure(f"redis-cli -p {port} {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def redis_try(port, *args):
    try:
        return redis_cli(port, *args, timeout=3)
    except (Failure, subprocess.TimeoutExpired, OSError):
        return ""


def crc16(data):
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def run_slot(run_id):
    """The hash slot of every key of a run: its id is the hash tag."""
    return crc16(run_id.encode()) % 16384


def cluster_nodes(port):
    """[(node id, port, flags, [(first, last) slot ranges])] as `port` sees the cluster."""
    return parse_cluster_nodes(redis_try(port, "cluster", "nodes"))


def parse_cluster_nodes(text):
    """`CLUSTER NODES` text as [(node id, port, flags, [(first, last) slot ranges])]."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        nport = int(f[1].split("@")[0].rsplit(":", 1)[1])
        ranges = []
        for r in f[8:]:
            if r.startswith("["):
                continue  # a slot being migrated
            a, _, b = r.partition("-")
            ranges.append((int(a), int(b or a)))
        out.append((f[0], nport, f[2].split(","), ranges))
    return out


def owner_of(slot, nodes):
    for _, port, flags, ranges in nodes:
        if "master" in flags and "fail" not in flags and any(a <= slot <= b for a, b in ranges):
            return port, ranges
    return None, []


# ----------------------------------------------------------------------------------------------
# HTTP.

class Conn:
    """One keep-alive connection; reopened after an error or an answer that closes it, and before
    the server's 30 s idle limit could close it under us."""

    def __init__(self, port, timeout=30):
        self.port, self.timeout = port, timeout
        self.c, self.used = None, 0.0

    def request(self, method, path, body=None, headers=None):
        if self.c is not None and time.monotonic() - self.used > 20:
            self.close()
        if self.c is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            self.c.request(method, path, body=body, headers=headers or {})
            r = self.c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        self.used = time.monotonic()
        if r.will_close:
            self.close()
        return r.status, data

    def close(self):
        if self.c is not None:
            self.c.close()
        self.c = None


# ----------------------------------------------------------------------------------------------
# State.

class Run:
    def __init__(self, run_id, token, created):
        self.id, self.token, self.created = run_id, token, created
        self.lock = threading.Lock()
        self.accepting = True
        self.inflight = 0
        self.calls = []        # (call_id, outcome, worker, seq, sent, answered, tool) with a record
        self.unavailable = set()  # ids answered STORE_UNAVAILABLE: their record may or may not be
        self.rejected = []     # fresh ids rejected before the reservation (a sample)
        self.dup_pool = collections.deque(maxlen=64)  # (call_id, tool, input, form) answered
        self.shard_failed = False


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_code = collections.Counter()
        self.by_class = collections.defaultdict(collections.Counter)
        self.unexpected = collections.Counter()
        self.examples = []
        self.problems = collections.Counter()
        self.problem_examples = []
        self.calls = 0
        self.in_window = 0
        self.window_codes = collections.Counter()
        self.admin_retries = 0
        self.leaks = 0

    def outcome(self, cls, outcome, ok, detail=""):
        with self.lock:
            self.calls += 1
            self.by_code[outcome] += 1
            self.by_class[cls][outcome] += 1
            if not ok:
                self.unexpected[f"{cls} -> {outcome}"] += 1
                if len(self.examples) < 10:
                    self.examples.append(f"{cls} -> {outcome} {detail[:300]}")

    def problem(self, kind, detail=""):
        with self.lock:
            self.problems[kind] += 1
            if len(self.problem_examples) < 20:
                self.problem_examples.append(f"{kind}: {detail[:300]}")


# ----------------------------------------------------------------------------------------------
# The soak of one store.

class Soak:
    def __init__(self, args, store, procs, log):
        self.args, self.store, self.procs, self.log = args, store, procs, log
        self.seconds = args.minutes * 60
        self.warmup = max(0.2 * self.seconds, 30.0)
        self.stats = Stats()
        self.weights = {c: w for c, (w, _, _) in CLASSES.items()}
        for kv in filter(None, (args.weights or "").split(",")):
            k, _, v = kv.partition("=")
            if k not in CLASSES:
                raise Failure(f"--weights: unknown class {k!r} (classes: {', '.join(CLASSES)})")
            self.weights[k] = float(v)
        self.admin_token = secrets.token_urlsafe(32)
        self.rng = random.Random(args.seed)
        self.runs_lock = threading.Lock()
        self.active = []
        self.ended = collections.deque(maxlen=4)   # (run_id, token) of runs already ended
        self.all_runs = []
        self.stop = threading.Event()
        self.abort = threading.Event()
        self.abort_why = ""
        self.verify_q = collections.deque()
        self.verify_cv = threading.Condition()
        self.verifying_done = False
        self.rss = []
        self.records_checked = 0
        self.records_lost = 0
        self.records_mismatch = 0
        self.records_late = 0
        self.notrace_checked = 0
        self.facts_runs = 0
        self.end_result = None
        self.window = None          # (start, end) monotonic of the failover, Redis only
        self.failover = None
        self.run_seq = 0
        self.counts_lock = threading.Lock()
        # Memory: records must expire so that the store (inside toolgate) reaches a steady size;
        # every run is checked within this TTL. Redis: records outlive the soak.
        if store == "memory":
            self.record_ttl_ms = args.memory_ttl_s * 1000
            self.run_timeout_ms = int((args.run_life_s + 4) * 1000)
        else:
            self.record_ttl_ms = int(max(3600, 2 * self.seconds + 1800) * 1000)
            self.run_timeout_ms = int((self.seconds + 1800) * 1000)

    # --- setup ----------------------------------------------------------------------------------

    def start(self):
        args, wd = self.args, self.args.workdir
        tag = self.store
        tool_port, agent, admin, telemetry = free_ports(4)
        tool = self.procs.spawn(f"{tag}-fake_tool", [args.tool, "--listen", f"127.0.0.1:{tool_port}",
                                                     "--threads", "1"])
        if why := wait_http(f"http://127.0.0.1:{tool_port}/healthz", 30, tool, "fake_tool"):
            raise Failure(why)
        self.redis_ports = []
        if self.store == "memory":
            store_yaml = f"store: {{kind: memory, record_ttl_ms: {self.record_ttl_ms}}}"
        else:
            cluster = self.procs.spawn(f"{tag}-redis-cluster", [args.redis_cluster], pipes=True)
            line = cluster.stdout.readline()
            urls = line.split()
            if len(urls) != 6 or not all(u.startswith("redis://127.0.0.1:") for u in urls):
                raise Failure(f"the Redis Cluster did not form: {log_tail(wd, tag + '-redis-cluster')}")
            self.redis_ports = [int(u.rsplit(":", 1)[1]) for u in urls]
            nodes = ", ".join(f'"{u}"' for u in urls)
            # A store timeout of 2 s, not 500 ms: on a machine busy with other builds a WAIT 1
            # can take longer than 500 ms, and this soak judges what is lost, not latency.
            store_yaml = (f"store: {{kind: redis-cluster, nodes: [{nodes}], durability: replica, "
                          f"record_ttl_ms: {self.record_ttl_ms}, timeout_ms: 2000}}")
            self.log(f"Redis Cluster on {' '.join(urls)}")
        base = f"http://127.0.0.1:{tool_port}"
        cfg = os.path.join(wd, f"{tag}-toolgate.yaml")
        with open(cfg, "w") as f:
            f.write(f"""# generated by scripts/soak.py
listen: {{agent: "127.0.0.1:{agent}", admin: "127.0.0.1:{admin}", telemetry: "127.0.0.1:{telemetry}"}}
{store_yaml}
runs: {{max_timeout_ms: 86400000}}
tools:
  - name: search
    upstream: {base}/search
    read_only: true
    timeout_ms: 5000
    input_schema: {{type: object, required: [q], properties: {{q: {{type: string, maxLength: 256}}}}}}
    projection: {{select: /results, max_items: 5, fields: [title, url, snippet]}}
  - name: lookup
    upstream: {base}/empty
    read_only: true
    projection: {{select: /results}}
  - name: bulk
    upstream: {base}/big
    read_only: true
    limits: {{raw_bytes: {self.args.bulk_raw_bytes}}}
  - name: slow
    upstream: {base}/slow
    read_only: true
    timeout_ms: 100
""")
        env = dict(os.environ, TOOLGATE_ADMIN_TOKEN=self.admin_token)
        for k in ("TOOLGATE_CONFIG", "TOOLGATE_TOKEN_KEY"):
            env.pop(k, None)
        env.setdefault("TOOLGATE_LOG", "warn")
        self.tg = self.procs.spawn(f"{tag}-toolgate", [args.toolgate, "serve", "--config", cfg],
                                   env=env)
        if why := wait_http(f"http://127.0.0.1:{telemetry}/readyz", 30, self.tg, "toolgate"):
            raise Failure(why)
        self.ports = {"agent": agent, "admin": admin, "telemetry": telemetry}
        self.log(f"toolgate pid {self.tg.pid} ({self.store} store): agent :{agent}, admin :{admin}, "
                 f"telemetry :{telemetry}; fake tool :{tool_port}; record TTL "
                 f"{self.record_ttl_ms / 1000:g}s")

    # --- admin ----------------------------------------------------------------------------------

    def admin(self, conn, method, path, body=None, retry_503=True):
        """One admin request; a 503 (or a dropped connection) is retried while a failover is
        under way or expected, and counted when it never clears."""
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, raw = conn.request(method, path, data, headers)
            except (OSError, http.client.HTTPException) as e:
                status, raw = None, str(e).encode()
            if status not in (None, 503) or not retry_503:
                return status, raw
            if not self.failover_pending() and time.monotonic() > deadline:
                return status, raw
            with self.stats.lock:
                self.stats.admin_retries += 1
            time.sleep(0.2)

    def failover_pending(self):
        """True from a bit before the kill until its window closed (Redis only)."""
        if self.store == "memory":
            return False
        if self.window is None:
            return self.failover is not None and self.failover.get("armed", False)
        return time.monotonic() < self.window[1] + 30

    def create_run(self, conn):
        while not self.stop.is_set() or not self.active:
            with self.counts_lock:
                self.run_seq += 1
                run_id = f"soak-{self.store}-{self.run_seq:05d}-{secrets.token_hex(3)}"
            status, raw = self.admin(conn, "POST", "/v1/runs", {
                "run_id": run_id, "timeout_ms": self.run_timeout_ms,
                "budget": {"max_calls": 1_000_000_000, "max_record_bytes": 1_000_000_000_000},
            }, retry_503=False)
            if status == 201:
                body = json.loads(raw)
                return Run(run_id, body["run_token"], time.monotonic())
            if status == 503 and self.in_window(time.monotonic(), time.monotonic()):
                time.sleep(0.1)  # its shard is failing over: another id lands elsewhere
                continue
            self.stats.problem("create run failed", f"{status} {raw[:200]!r}")
            if status != 503 or self.abort.is_set():
                raise Failure(f"POST /v1/runs answered {status}: {raw[:200]!r}")
            time.sleep(0.5)
        return None

    def in_window(self, sent, answered):
        w = self.window
        if self.store == "memory":
            return False
        if w is None:
            # Between the kill and the window's end being known, everything is "in the window".
            f = self.failover
            return f is not None and f.get("killed_at") is not None and answered >= f["killed_at"]
        return answered >= w[0] and sent <= w[1]

    # --- load -----------------------------------------------------------------------------------

    def pick_run(self, rng):
        with self.runs_lock:
            runs = list(self.active)
        rng.shuffle(runs)
        for run in runs:
            with run.lock:
                if run.accepting:
                    run.inflight += 1
                    return run
        return None

    def worker(self, w):
        rng = random.Random(self.args.seed * 1000 + w + (self.store == "redis") * 500)
        conn = Conn(self.ports["agent"])
        interval = self.args.workers / self.args.rate
        classes = list(CLASSES)
        weights = [self.weights[c] for c in classes]
        seq = 0
        next_at = time.monotonic()
        while not self.stop.is_set() and not self.abort.is_set():
            now = time.monotonic()
            if next_at > now:
                time.sleep(next_at - now)
            next_at += interval
            if next_at < time.monotonic() - 1:
                next_at = time.monotonic()  # fell behind: no burst to catch up
            run = self.pick_run(rng)
            if run is None:
                time.sleep(0.01)
                continue
            try:
                cls = rng.choices(classes, weights)[0]
                seq += 1
                self.one_call(conn, rng, run, cls, w, seq)
            finally:
                with run.lock:
                    run.inflight -= 1
        conn.close()

    def one_call(self, conn, rng, run, cls, w, seq):
        call_id = f"call_{w}_{seq:07d}_{rng.randrange(1 << 24):06x}"
        token, run_id = run.token, run.id
        form = "invoke" if rng.random() < 0.7 else "tools"
        tool, inp = "search", {"q": f"soak {seq}"}
        target = run
        if cls == "search":
            form = "invoke"
        elif cls == "search_tools":
            form = "tools"
        elif cls == "search_mcp":
            form = "mcp"
        elif cls == "empty":
            tool = "lookup"
        elif cls == "too_large":
            tool = "bulk"
        elif cls == "timeout":
            tool, inp = "slow", {"q": "slow", "sleep_ms": 1000}
        elif cls == "duplicate":
            with run.lock:
                prior = rng.choice(run.dup_pool) if run.dup_pool else None
            if prior is None:
                cls = "search"
            else:
                call_id, tool, inp, form = prior
        elif cls == "unknown":
            tool = "no_such_tool"
        elif cls == "bad_token":
            token = run_id + "." + "A" * 43
        elif cls == "schema":
            inp = {"q": 7}
        elif cls == "mismatch":
            run_id = run_id + "-other"
        elif cls == "inactive":
            with self.runs_lock:
                ended = rng.choice(self.ended) if self.ended else None
            if ended is None:
                cls = "search"
            else:
                run_id, token = ended
                target = None
        expected = CLASSES[cls][1]
        sent = time.monotonic()
        outcome, detail = self.send(conn, form, token, run_id, call_id, tool, inp, seq)
        answered = time.monotonic()
        ok = outcome == expected
        if not ok and outcome == "STORE_UNAVAILABLE" and CLASSES[cls][2] and \
                self.in_window(sent, answered):
            ok = True
        if self.store != "memory" and self.in_window(sent, answered):
            with self.stats.lock:
                self.stats.in_window += 1
                self.stats.window_codes[outcome] += 1
        self.stats.outcome(cls, outcome, ok, f"{form} {tool} {call_id} run {run_id}: {detail}")
        if target is None or cls == "duplicate":
            return
        if outcome in RECORDED:
            with run.lock:
                run.calls.append((call_id, outcome, w, seq, sent, answered, tool))
                run.dup_pool.append((call_id, tool, inp, form))
        elif outcome == "STORE_UNAVAILABLE":
            with run.lock:
                run.unavailable.add(call_id)
        elif cls in NO_TRACE and outcome == expected:
            with run.lock:
                if len(run.rejected) < self.args.notrace_per_run:
                    run.rejected.append(call_id)

    def send(self, conn, form, token, run_id, call_id, tool, inp, seq):
        """One tool call; returns (outcome, detail): READY/<evidence>, an error code, or a
        description of what was wrong with the answer."""
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if form == "invoke":
            path = "/v1/invoke"
            body = json.dumps({"run_id": run_id, "tool_call_id": call_id, "tool": tool, "input": inp})
        elif form == "tools":
            path = f"/tools/{tool}"
            headers["X-Run-Id"] = run_id
            headers["X-Tool-Call-Id"] = call_id
            body = json.dumps(inp)
        else:
            path = "/mcp"
            headers["Accept"] = "application/json, text/event-stream"
            body = json.dumps({"jsonrpc": "2.0", "id": seq, "method": "tools/call", "params": {
                "name": tool, "arguments": inp,
                "_meta": {"toolgate.dev/run_id": run_id, "toolgate.dev/tool_call_id": call_id}}})
        try:
            status, raw = conn.request("POST", path, body.encode(), headers)
        except (OSError, http.client.HTTPException) as e:
            return "TRANSPORT_ERROR", f"{type(e).__name__}: {e}"
        text = raw.decode(errors="replace")
        if RAW_MARKER in text:
            with self.stats.lock:
                self.stats.leaks += 1
            return "RAW_LEAKED", text[:200]
        try:
            doc = json.loads(text)
        except ValueError:
            return f"HTTP_{status}_NOT_JSON", text[:200]
        if form == "mcp" and status == 200:
            res = doc.get("result") if isinstance(doc, dict) else None
            if not isinstance(res, dict):
                return "MCP_NO_RESULT", text[:200]
            if res.get("isError") is False:
                ev = (res.get("_meta") or {}).get("toolgate.dev/evidence_status")
                if (res.get("_meta") or {}).get("toolgate.dev/tool_call_id") != call_id:
                    return "WRONG_TOOL_CALL_ID", text[:200]
                return f"READY/{ev}", ""
            doc = res.get("structuredContent") or {}
            code = (doc.get("error") or {}).get("code")
            return (code or "MCP_ERROR_WITHOUT_CODE"), text[:200]
        if not isinstance(doc, dict):
            return f"HTTP_{status}_NOT_AN_OBJECT", text[:200]
        if doc.get("tool_call_id") != call_id:
            return "WRONG_TOOL_CALL_ID", text[:200]
        if doc.get("status") == "READY":
            if status != 200:
                return f"READY_WITH_HTTP_{status}", text[:200]
            ev = doc.get("evidence_status")
            res = doc.get("result") or {}
            if ev == "EVIDENCE_FOUND" and tool == "search":
                items = res.get("items") or []
                if res.get("total_items") != 7 or len(items) != 5 or \
                        any(sorted(i) != ["snippet", "title", "url"] for i in items):
                    return "BAD_PROJECTION", text[:200]
            if ev == "NO_EVIDENCE" and (res.get("scope") or {}).get("tool") != tool:
                return "BAD_SCOPE", text[:200]
            return f"READY/{ev}", ""
        code = (doc.get("error") or {}).get("code") or "ERROR_WITHOUT_CODE"
        if HTTP_STATUS.get(code) != status:
            return f"{code}_WITH_HTTP_{status}", text[:200]
        return code, text[:200]

    # --- runs: rotation and checks --------------------------------------------------------------

    def manager(self):
        """Keeps `runs_open` runs taking calls; every run_life / runs_open seconds the oldest one
        is retired (no new calls) and queued for its check, and a new one is opened."""
        conn = Conn(self.ports["admin"])
        every = self.args.run_life_s / self.args.runs_open
        try:
            for _ in range(self.args.runs_open):
                run = self.create_run(conn)
                with self.runs_lock:
                    self.active.append(run)
                    self.all_runs.append(run)
            next_at = time.monotonic() + every
            while not self.stop.is_set() and not self.abort.is_set():
                self.stop.wait(max(0.0, next_at - time.monotonic()))
                if self.stop.is_set():
                    break
                next_at += every
                run = self.create_run(conn)
                if run is None:
                    break
                with self.runs_lock:
                    old = self.active.pop(0)
                    self.active.append(run)
                    self.all_runs.append(run)
                self.retire(old)
        except Failure as e:
            self.abort_why = str(e)
            self.abort.set()
        finally:
            with self.runs_lock:
                rest, self.active = self.active, []
            for run in rest:
                self.retire(run)
            conn.close()

    def retire(self, run):
        with run.lock:
            run.accepting = False
        with self.verify_cv:
            self.verify_q.append(run)
            self.verify_cv.notify()

    def verifier(self):
        conn = Conn(self.ports["admin"])
        while True:
            with self.verify_cv:
                while not self.verify_q and not self.verifying_done:
                    self.verify_cv.wait(1)
                if not self.verify_q:
                    break
                run = self.verify_q.popleft()
            try:
                self.check_run(conn, run)
            except Exception as e:  # noqa: BLE001  (a harness defect must not hang the soak)
                self.stats.problem("run check crashed", f"{run.id}: {type(e).__name__}: {e}")
        conn.close()

    def check_run(self, conn, run, again=False):
        """The run's end (first time) or facts (again), and then each of its records."""
        deadline = time.monotonic() + 30
        while run.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        if run.inflight:
            self.stats.problem("calls still in flight at a run's end", run.id)
        if again:
            status, raw = self.admin(conn, "GET", f"/v1/runs/{run.id}/facts")
        else:
            status, raw = self.admin(conn, "POST", f"/v1/runs/{run.id}/end")
            with self.runs_lock:
                self.ended.append((run.id, run.token))
        if status != 200:
            self.stats.problem("facts unreadable", f"{run.id}: {status} {raw[:200]!r}")
            return
        body = json.loads(raw)
        self.check_facts(run, body)
        for call in list(run.calls):
            self.check_record(conn, run, call)
        if not again:
            for call_id in run.rejected:
                self.check_no_trace(conn, run, call_id)

    def check_facts(self, run, body):
        with run.lock:
            calls = list(run.calls)
            unavailable = set(run.unavailable)
        facts = body.get("facts") or []
        ids = [f.get("tool_call_id") for f in facts]
        pos = {cid: i for i, cid in enumerate(ids)}
        ready = {c[0]: c for c in calls if c[1].startswith("READY/")}
        errors = [c for c in calls if not c[1].startswith("READY/")]
        with self.counts_lock:
            self.facts_runs += 1
        if len(pos) != len(ids):
            self.stats.problem("facts list an id twice", run.id)
        missing = [cid for cid in ready if cid not in pos]
        if missing:
            self.stats.problem("facts miss READY calls (lost)",
                               f"{run.id}: {len(missing)}, e.g. {missing[:3]}")
        extra = [cid for cid in ids if cid not in ready]
        bad_extra = [cid for cid in extra if cid not in unavailable]
        if bad_extra:
            self.stats.problem("facts hold calls not answered READY",
                               f"{run.id}: {len(bad_extra)}, e.g. {bad_extra[:3]}")
        for f in facts:
            c = ready.get(f.get("tool_call_id"))
            if c and f"READY/{f.get('evidence_status')}" != c[1]:
                self.stats.problem("fact evidence differs from the answer", f"{run.id} {c[0]}")
            if c and f.get("tool") != c[6]:
                self.stats.problem("fact tool differs", f"{run.id} {c[0]}")
            if RAW_MARKER in json.dumps(f):
                self.stats.problem("raw response in facts", f"{run.id} {f.get('tool_call_id')}")
        # Each worker calls one after another: its READY calls complete in the order it sent them.
        by_worker = collections.defaultdict(list)
        for c in sorted(ready.values(), key=lambda c: (c[2], c[3])):
            if c[0] in pos:
                by_worker[c[2]].append(pos[c[0]])
        for w, ps in by_worker.items():
            if any(a > b for a, b in zip(ps, ps[1:], strict=False)):
                self.stats.problem("facts out of a worker's completion order", f"{run.id} worker {w}")
        excluded = body.get("excluded")
        lo, hi = len(errors), len(errors) + len(unavailable)
        if not isinstance(excluded, int) or not lo <= excluded <= hi:
            self.stats.problem("facts' excluded count", f"{run.id}: {excluded}, expected {lo}..{hi}")

    def check_record(self, conn, run, call):
        call_id, outcome, _, _, sent, _, tool = call
        if self.store == "memory" and time.monotonic() - sent > self.record_ttl_ms / 1000 - 1:
            with self.counts_lock:
                self.records_late += 1  # it may have expired by design: not checked
            return
        status, raw = self.admin(conn, "GET", f"/v1/runs/{run.id}/invocations/{call_id}")
        with self.counts_lock:
            self.records_checked += 1
        if status == 404:
            with self.counts_lock:
                self.records_lost += 1
            self.stats.problem("record lost", f"{run.id}/{call_id} answered {outcome}")
            return
        if status != 200:
            self.stats.problem("record unreadable", f"{run.id}/{call_id}: {status} {raw[:200]!r}")
            return
        rec = json.loads(raw)
        want_status, _, want = outcome.partition("/")
        if want_status != "READY":
            want_status, want = "ERROR", outcome
        got = (rec.get("status"), rec.get("evidence_status") if want_status == "READY"
               else rec.get("error_code"), rec.get("tool"), rec.get("run_id"), rec.get("tool_call_id"))
        if got != (want_status, want, tool, run.id, call_id):
            with self.counts_lock:
                self.records_mismatch += 1
            self.stats.problem("record differs from the answer",
                               f"{run.id}/{call_id}: answered {outcome} {tool}, record {got[:3]}")

    def check_no_trace(self, conn, run, call_id):
        status, raw = self.admin(conn, "GET", f"/v1/runs/{run.id}/invocations/{call_id}")
        with self.counts_lock:
            self.notrace_checked += 1
        if status != 404:
            self.stats.problem("a rejected call left a record", f"{run.id}/{call_id}: {status}")

    # --- RSS ------------------------------------------------------------------------------------

    def sampler(self, t0):
        while not self.stop.is_set() and not self.abort.is_set():
            if self.tg.poll() is not None:
                self.abort_why = f"toolgate exited with {self.tg.returncode}"
                self.abort.set()
                return
            try:
                self.rss.append((time.monotonic() - t0, rss_kib(self.tg.pid)))
            except OSError:
                pass
            # Jittered, so the samples do not lock onto the runs' rotation.
            self.stop.wait(self.args.sample_s * random.uniform(0.5, 1.5))

    def write_rss(self):
        with open(os.path.join(self.args.workdir, f"{self.store}-rss.tsv"), "w") as f:
            f.write("seconds\trss_kib\n")
            for t, kib in self.rss:
                f.write(f"{t:.1f}\t{kib}\n")

    def rss_levels(self):
        """Mean RSS over the window just after the warm-up and over the one at the end of the load
        (their lowest samples are reported too), and the trend after the warm-up. The windows are
        None when the soak is too short for both to fit after the warm-up without overlapping."""
        span = max(RSS_WINDOW_S, 0.05 * self.seconds)
        warm_at, end_at = (self.warmup, self.warmup + span), (self.seconds - span, self.seconds + 1)

        def window(a, b):
            return [kib / 1024 for t, kib in self.rss if a <= t <= b]
        fits = warm_at[1] <= end_at[0]
        warm_w, end_w = (window(*warm_at), window(*end_at)) if fits else ([], [])
        after = [(t, kib / 1024) for t, kib in self.rss if t >= self.warmup]
        slope = None
        if len(after) >= 3:
            ts, ms = [t for t, _ in after], [m for _, m in after]
            tm, mm = statistics.fmean(ts), statistics.fmean(ms)
            den = sum((t - tm) ** 2 for t in ts)
            slope = sum((t - tm) * (m - mm) for t, m in after) / den * 3600 if den else None
        return {
            "span": span, "warm_at": warm_at, "fits": fits,
            "warm": statistics.fmean(warm_w) if warm_w else None,
            "end": statistics.fmean(end_w) if end_w else None,
            "warm_floor": min(warm_w, default=None), "end_floor": min(end_w, default=None),
            "slope": slope, "peak": max((kib for _, kib in self.rss), default=0) / 1024,
        }

    # --- failover (Redis) -----------------------------------------------------------------------

    def failover_thread(self, t0):
        at = t0 + self.seconds / 2
        self.failover = {"armed": False}
        while time.monotonic() < at - 2:
            if self.stop.wait(0.5) or self.abort.is_set():
                return
        self.failover["armed"] = True
        try:
            self.do_failover(at)
        except Failure as e:
            self.failover["error"] = str(e)
            self.stats.problem("failover", str(e))
            if self.window is None:
                self.window = (self.failover.get("killed_at") or time.monotonic(), time.monotonic())

    def do_failover(self, at):
        f = self.failover
        while time.monotonic() < at:
            time.sleep(0.05)
        with self.runs_lock:
            runs = [r for r in self.active if r.accepting]
        if not runs:
            raise Failure("no open run at mid-soak")
        run = random.Random(self.args.seed).choice(runs)
        live = self.redis_ports
        nodes = cluster_nodes(live[0])
        slot = run_slot(run.id)
        check = redis_try(live[0], "cluster", "keyslot", f"toolgate:{{{run.id}}}:run").strip()
        if check != str(slot):
            raise Failure(f"hash slot of {run.id}: computed {slot}, Redis says {check!r}")
        port, ranges = owner_of(slot, nodes)
        if port is None:
            raise Failure(f"no primary owns slot {slot}: {nodes}")
        cfg = {}
        for key in ("port", "bind", "cluster-config-file", "cluster-node-timeout",
                    "repl-diskless-sync-delay", "save", "appendonly", "dir", "logfile"):
            out = redis_cli(port, "config", "get", key).split("\n")
            cfg[key] = out[1] if len(out) > 1 else ""
        info = redis_cli(port, "info", "server")
        pid = int(next(line.split(":", 1)[1] for line in info.splitlines()
                       if line.startswith("process_id:")))
        replica = next((p for _, p, fl, _ in nodes if "slave" in fl and p != port and
                        f"master_port:{port}" in redis_try(p, "info", "replication")), None)
        f.update(run=run.id, slot=slot, port=port, pid=pid, replica=replica, ranges=ranges)
        self.log(f"failover: run {run.id} is in slot {slot}, primary 127.0.0.1:{port} (pid {pid}), "
                 f"replica :{replica}; SIGKILL")
        f["killed_at"] = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        others = [p for p in live if p != port]
        deadline = time.monotonic() + 60
        while True:
            views = [cluster_nodes(p) for p in others]
            done = all(any(n[1] == port and "fail" in n[2] for n in v) for v in views) and all(
                "cluster_state:ok" in redis_try(p, "cluster", "info") for p in others)
            if done and owner_of(slot, views[0])[0] == replica:
                break
            if time.monotonic() > deadline:
                raise Failure(f"no failover of :{port} within 60s")
            time.sleep(0.1)
        f["promoted_at"] = time.monotonic()
        self.log(f"failover: :{replica} took slot {slot} over after "
                 f"{f['promoted_at'] - f['killed_at']:.1f}s; restarting :{port}")
        argv = ["redis-server", "--port", cfg["port"], "--bind", *cfg["bind"].split(),
                "--cluster-enabled", "yes", "--cluster-config-file", cfg["cluster-config-file"],
                "--cluster-node-timeout", cfg["cluster-node-timeout"],
                "--repl-diskless-sync-delay", cfg["repl-diskless-sync-delay"],
                "--save", cfg["save"], "--appendonly", cfg["appendonly"], "--daemonize", "no",
                "--dir", cfg["dir"], "--logfile", cfg["logfile"]]
        self.procs.spawn(f"{self.store}-redis-restarted-{port}", argv)
        deadline = time.monotonic() + 120
        while True:
            role = redis_try(port, "role").split("\n")
            repl = redis_try(port, "info", "replication")
            if role[0] == "slave" and "master_link_status:up" in repl and \
                    f"master_port:{replica}" in repl:
                break
            if time.monotonic() > deadline:
                raise Failure(f":{port} did not come back as a synced replica of :{replica}: "
                              f"{role[:1]} {repl[:200]!r}")
            time.sleep(0.1)
        f["rejoined_at"] = time.monotonic()
        if why := wait_http(f"http://127.0.0.1:{self.ports['telemetry']}/readyz", 60, self.tg, "toolgate"):
            raise Failure(why)
        f["ready_at"] = time.monotonic()
        grace = 3.0
        self.window = (f["killed_at"], f["ready_at"] + grace)
        self.log(f"failover: :{port} is a replica of :{replica} again after "
                 f"{f['rejoined_at'] - f['killed_at']:.1f}s; toolgate ready; window "
                 f"{self.window[1] - self.window[0]:.1f}s (with {grace:g}s grace)")

    def end_pass(self):
        """Redis: after the soak, every record of the runs whose shard failed over, and a sample
        of the others, read again; and those runs' facts."""
        ranges, end = self.failover.get("ranges", []), self.window[1]
        for r in self.all_runs:
            r.shard_failed = r.created <= end and any(a <= run_slot(r.id) <= b for a, b in ranges)
        failed_runs = [r for r in self.all_runs if r.shard_failed]
        rest = [(r, c) for r in self.all_runs if not r.shard_failed for c in r.calls]
        must = [(r, c) for r in failed_runs for c in r.calls]
        sample = rest if len(rest) + len(must) <= self.args.end_all_max else \
            random.Random(self.args.seed).sample(rest, min(len(rest), self.args.end_sample))
        todo = must + sample
        before = (self.records_checked, self.records_lost, self.records_mismatch)
        self.log(f"end pass: {len(must)} records of {len(failed_runs)} runs on the failed-over "
                 f"shard, {len(sample)} of {len(rest)} others")
        lock = threading.Lock()

        def work():
            conn = Conn(self.ports["admin"])
            while True:
                with lock:
                    if not todo:
                        break
                    r, c = todo.pop()
                self.check_record(conn, r, c)
            conn.close()

        conn = Conn(self.ports["admin"])
        for r in failed_runs:
            status, raw = self.admin(conn, "GET", f"/v1/runs/{r.id}/facts")
            if status != 200:
                self.stats.problem("facts unreadable at the end", f"{r.id}: {status}")
            else:
                self.check_facts(r, json.loads(raw))
        conn.close()
        threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.end_result = {
            "failed_over_runs": len(failed_runs), "records": len(must) + len(sample),
            "failed_over_records": len(must), "sampled": len(sample), "of_others": len(rest),
            "lost": self.records_lost - before[1], "mismatched": self.records_mismatch - before[2],
        }

    def stall(self, why):
        """The soak stopped making progress: say where every thread is, and stop."""
        self.log(f"{why}; the threads of this program:")
        faulthandler.dump_traceback(all_threads=True)
        self.abort_why = why
        self.abort.set()

    # --- the whole soak -------------------------------------------------------------------------

    def run(self):
        self.start()
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.sampler, args=(t0,), daemon=True),
                   threading.Thread(target=self.manager, daemon=True)]
        verifiers = [threading.Thread(target=self.verifier, daemon=True)
                     for _ in range(self.args.verifiers)]
        workers = [threading.Thread(target=self.worker, args=(w,), daemon=True)
                   for w in range(self.args.workers)]
        if self.store != "memory":
            threads.append(threading.Thread(target=self.failover_thread, args=(t0,), daemon=True))
        for t in threads + verifiers:
            t.start()
        while not self.active and not self.abort.is_set():
            if time.monotonic() - t0 > 60:
                self.stall("no run could be created within 60 s")
            time.sleep(0.01)
        for t in workers:
            t.start()
        last = t0
        seen, seen_at = 0, time.monotonic()
        while time.monotonic() - t0 < self.seconds and not self.abort.is_set():
            time.sleep(0.5)
            if self.stats.calls != seen:
                seen, seen_at = self.stats.calls, time.monotonic()
            elif time.monotonic() - seen_at > 60:
                self.stall("no call was answered for 60 s")
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                rss = self.rss[-1][1] / 1024 if self.rss else 0
                self.log(f"{time.monotonic() - t0:5.0f}s: {self.stats.calls} calls, "
                         f"{sum(self.stats.unexpected.values())} unexpected, RSS {rss:.1f} MiB, "
                         f"{self.records_checked} records checked")
        load_s = time.monotonic() - t0
        self.stop.set()
        for t in workers:
            t.join()
        calls = self.stats.calls
        for t in threads:
            t.join(timeout=300)
        with self.verify_cv:
            self.verifying_done = True
            self.verify_cv.notify_all()
        for t in verifiers:
            t.join()
        self.at_run_end = (self.records_checked, self.records_lost, self.records_mismatch)
        if self.store != "memory" and not self.abort.is_set():
            if self.window is None:
                self.stats.problem("failover", (self.failover or {}).get("error", "did not happen"))
            else:
                self.end_pass()
        return self.summary(load_s, calls)

    def summary(self, load_s, calls):
        s = self.stats
        self.write_rss()
        r = self.rss_levels()
        warm, end = r["warm"], r["end"]
        growth = (end - warm) / warm * 100 if warm and end else None
        lines = []
        ok = True

        def line(text, good=None):
            nonlocal ok
            mark = "" if good is None else ("ok   " if good else "FAIL ")
            if good is False:
                ok = False
            lines.append(f"  {mark}{text}")

        lines.append(f"soak {self.store}" + (" (Redis Cluster, durability: replica)"
                                             if self.store != "memory" else "") +
                     f": {load_s:.0f} s of load, {self.args.workers} workers, {len(self.all_runs)} runs "
                     f"of {self.args.run_life_s:g} s, record TTL {self.record_ttl_ms / 1000:g} s")
        if self.abort.is_set():
            line(f"aborted: {self.abort_why}", False)
        line(f"calls: {calls}, {calls / load_s:.1f} calls/s")
        line("by code: " + ", ".join(f"{k} {v}" for k, v in sorted(s.by_code.items())))
        unexpected = sum(s.unexpected.values())
        line(f"unexpected outcomes: {unexpected}" +
             ("" if not unexpected else " (" + ", ".join(f"{k}: {v}" for k, v in
                                                        s.unexpected.most_common()) + ")"),
             unexpected == 0)
        for e in s.examples[:5]:
            line(f"    e.g. {e}")
        line(f"raw responses seen by the agent: {s.leaks}", s.leaks == 0)
        if not r["fits"]:
            line(f"RSS: not judged, the soak is too short: {self.warmup + 2 * r['span']:.0f} s are "
                 f"needed for the warm-up and two {r['span']:.0f} s windows after it", False)
        elif warm is None or end is None:
            line("RSS: not enough samples", False)
        else:
            floor = (r["end_floor"] - r["warm_floor"]) / r["warm_floor"] * 100
            wa, wb = r["warm_at"]
            line(f"RSS: after warm-up {warm:.1f} MiB (mean of {wa:.0f}-{wb:.0f} s), end {end:.1f} MiB "
                 f"(mean of the last {r['span']:.0f} s), growth {growth:+.2f} % "
                 f"(limit {RSS_LIMIT:g} %)", growth <= RSS_LIMIT)
            line(f"     floor {r['warm_floor']:.1f} -> {r['end_floor']:.1f} MiB ({floor:+.2f} %), peak "
                 f"{r['peak']:.1f} MiB, trend after warm-up {r['slope']:+.1f} MiB/h, "
                 f"{len(self.rss)} samples about every {self.args.sample_s:g} s")
        checked, lost, mismatch = self.at_run_end
        line(f"records at each run's end: {checked} checked (every call answered READY or with an "
             f"execution error), {lost} lost, {mismatch} differing from the answer" +
             (f", {self.records_late} not checked within their TTL" if self.records_late else ""),
             lost == 0 and mismatch == 0 and self.records_late == 0)
        line(f"facts: {self.facts_runs} run ends/facts checked against the READY answers; "
             f"{self.notrace_checked} rejected ids checked to have no record; "
             f"{s.admin_retries} admin reads retried on 503")
        if self.store != "memory":
            f = self.failover or {}
            if "killed_at" in f and self.window:
                line(f"failover: SIGKILL of primary :{f['port']} (slot {f['slot']} of run {f['run']}), "
                     f"replica :{f['replica']} promoted after {f['promoted_at'] - f['killed_at']:.1f} s"
                     if "promoted_at" in f else f"failover: SIGKILL of :{f['port']}, no promotion",
                     "promoted_at" in f)
                if "rejoined_at" in f:
                    line(f"failover: :{f['port']} restarted, a synced replica after "
                         f"{f['rejoined_at'] - f['killed_at']:.1f} s; window "
                         f"{self.window[1] - self.window[0]:.1f} s, {s.in_window} calls in it: " +
                         ", ".join(f"{k} {v}" for k, v in sorted(s.window_codes.items())))
            else:
                line(f"failover: did not happen ({f.get('error', 'not reached')})", False)
            if self.end_result:
                e = self.end_result
                line(f"end pass: {e['records']} records read again ({e['failed_over_records']} of "
                     f"{e['failed_over_runs']} runs on the failed-over shard, {e['sampled']} of "
                     f"{e['of_others']} others): {e['lost']} lost, {e['mismatched']} differing; "
                     f"acknowledged records lost in all: {self.records_lost}",
                     e["lost"] == 0 and e["mismatched"] == 0)
        probs = sum(s.problems.values())
        line(f"other problems: {probs}" + ("" if not probs else " (" + ", ".join(
            f"{k}: {v}" for k, v in s.problems.most_common()) + ")"), probs == 0)
        for e in s.problem_examples[:8]:
            line(f"    e.g. {e}")
        lines.append(f"  result: {'PASS' if ok else 'FAIL'}")
        return ok, "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="minutes of load per store")
    ap.add_argument("--store", choices=["memory", "redis", "both"], default="both")
    ap.add_argument("--toolgate", required=True)
    ap.add_argument("--tool", required=True, help="examples/fake_tool binary")
    ap.add_argument("--redis-cluster", required=True, help="examples/redis_cluster binary")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rate", type=float, default=300, help="target calls/s, all workers together")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--verifiers", type=int, default=2)
    ap.add_argument("--runs-open", type=int, default=3, help="runs taking calls at a time")
    ap.add_argument("--run-life-s", type=float, default=2, help="how long a run takes calls")
    ap.add_argument("--memory-ttl-s", type=int, default=15, help="memory store record TTL")
    ap.add_argument("--sample-s", type=float, default=0.25, help="RSS sampling period")
    ap.add_argument("--notrace-per-run", type=int, default=10)
    ap.add_argument("--end-all-max", type=int, default=200_000,
                    help="Redis end pass: read every record when there are at most this many")
    ap.add_argument("--end-sample", type=int, default=50_000,
                    help="Redis end pass: else every failed-over shard's record and this many others")
    ap.add_argument("--bulk-raw-bytes", type=int, default=65536,
                    help="raw_bytes of the oversize tool (its answer is about 2 MiB)")
    ap.add_argument("--weights", help="override class weights, e.g. too_large=0,search=50")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    if args.minutes <= 0:
        ap.error("--minutes must be > 0")
    started = time.monotonic()

    def log(msg):
        print(f"soak [{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where is it stuck?
    stores = ["memory", "redis"] if args.store == "both" else [args.store]
    log(f"{args.minutes:g} min per store ({', '.join(stores)}), {args.rate:g} calls/s target, "
        f"{args.workers} workers, seed {args.seed}")
    results = []
    for store in stores:
        procs = Procs(args.workdir)
        try:
            results.append(Soak(args, store, procs, log).run())
        except Failure as e:
            results.append((None, f"soak {store}: could not run: {e}"))
        finally:
            procs.stop_all()
    print()
    for _, text in results:
        print(text)
    if any(ok is None for ok, _ in results):
        return 2
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
