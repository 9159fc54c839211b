#!/usr/bin/env python3
"""The benchmark driver behind bench/run.sh (which builds the binaries and installs the tools).

Starts, all on 127.0.0.1: the fake tool (examples/fake_tool.rs, its /bench route), nginx as a plain
reverse proxy in front of it, a six-node Redis Cluster (examples/redis_cluster.rs), and one
toolgate per toolgate path (store setup, and /v1/invoke or MCP's POST /mcp). Then drives every path
with wrk, interleaved round by round, and prints one table plus a JSON file. Standard library only.
"""

import argparse
import base64
import datetime
import http.client
import http.server
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
from ports import free_port, free_ports  # noqa: E402  (the scripts' one port helper)
from procs import Procs, log_tail, stop  # noqa: E402  (and their process handling)

LUA = os.path.join(BENCH_DIR, "call.lua")
ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024

# Paths in table order. "store" is None for the paths without toolgate; "front" is how the agent
# calls toolgate: "invoke" (POST /v1/invoke) or "mcp" (a tools/call on POST /mcp); "otel": the
# toolgate traces every call and exports its spans to a local OTLP/HTTP sink.
PATHS = [
    {"name": "direct", "store": None},
    {"name": "nginx", "store": None},
    {"name": "toolgate-memory", "store": "memory", "front": "invoke"},
    {"name": "toolgate-mcp", "store": "memory", "front": "mcp"},
    {"name": "toolgate-otel", "store": "memory", "front": "invoke", "otel": True},
    {"name": "toolgate-redis-primary", "store": "primary", "front": "invoke"},
    {"name": "toolgate-redis-replica", "store": "replica", "front": "invoke"},
]
ENDPOINTS = {"invoke": "/v1/invoke", "mcp": "/mcp"}
# The MCP path is compared with the same call on /v1/invoke, same store, paired per round.
MCP_PATH, INVOKE_PATH = "toolgate-mcp", "toolgate-memory"
# --callgrind's name for the Redis primary's side of toolgate-redis-primary's calls.
REDIS_NODE = "redis-primary-node"

# Commands that are not part of a tool call: the cluster client's topology refresh, probes, and
# this script's own markers and reads.
NOT_CALL_COMMANDS = {
    "info", "cluster", "ping", "echo", "monitor", "config", "client", "command", "replconf",
    "hello", "readonly", "readwrite", "auth", "select", "llen", "slowlog", "latency",
}


class Failure(Exception):
    """Something in the harness itself went wrong (not a measured request)."""


class OtlpSink:
    """A local OTLP/HTTP trace receiver for the otel path: every POST /v1/traces is answered 200
    with an empty ExportTraceServiceResponse (zero bytes of protobuf), and counted. It decodes
    nothing (the integration tests check the spans): here only toolgate's side of the cost counts.
    """

    def __init__(self):
        sink = self
        self.requests = 0
        self.bytes = 0
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (the http.server hook's name)
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                with sink.lock:
                    sink.requests += 1
                    sink.bytes += n
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stats(self):
        with self.lock:
            return {"export_requests": self.requests, "export_bytes": self.bytes}


# ----------------------------------------------------------------------------------------------
# Processes and ports.

def wait_http(url, proc, what, timeout=30, headers=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=1) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise Failure(f"{what} did not answer at {url} within {timeout}s")


def wait_tcp(port, proc, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise Failure(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise Failure(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


def post_json(url, body, token):
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def rss_mib(pid):
    """(VmRSS, VmHWM) in MiB."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                vals[k] = int(v.split()[0]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / CLK_TCK


def child_pids(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(entry))
            except OSError:
                pass
    return out


# ----------------------------------------------------------------------------------------------
# Redis.

def redis_cli(port, *args, check=True):
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                       capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise Failure(f"redis-cli -p {port} {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def redis_primaries(ports):
    return [p for p in ports if "role:master" in redis_cli(p, "info", "replication")]


def commandstats(port):
    stats = {}
    for line in redis_cli(port, "info", "commandstats").splitlines():
        m = re.match(r"cmdstat_([^:]+):calls=(\d+)", line)
        if m:
            stats[m.group(1)] = int(m.group(2))
    return stats


def redis_pids(ports):
    pids = []
    for port in ports:
        m = re.search(r"^process_id:(\d+)", redis_cli(port, "info", "server"), re.M)
        if m:
            pids.append(int(m.group(1)))
    return pids


# ----------------------------------------------------------------------------------------------
# wrk.

def wrk(url, threads, conns, seconds, mode, prefix, run_id="", token=None, stop_after=0,
        pace_ms=0):
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s",
            "-H", "Content-Type: application/json", "-s", LUA]
    if token:
        argv += ["-H", f"Authorization: Bearer {token}"]
    argv += [url, "--", mode, prefix, run_id or "-", str(stop_after), str(pace_ms)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    for line in r.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            out = json.loads(line[len("BENCHJSON "):])
            errs = out["errors"]
            out["socket_errors"] = errs["connect"] + errs["read"] + errs["write"] + errs["timeout"]
            out["rps"] = out["requests"] / (out["duration_us"] / 1e6)
            return out
    raise Failure(f"wrk gave no result (exit {r.returncode}): {r.stderr.strip() or r.stdout[-500:]}")


def failed_of(result):
    """Requests that were not a good answer, plus socket errors."""
    return result["not_good"] + result["socket_errors"]


# ----------------------------------------------------------------------------------------------
# Setting up the paths.

def start_tool(procs, tool_bin, result_bytes=None, name="fake_tool"):
    """The fake tool, its /bench route answering ~1 KiB, or `result_bytes` bytes when given."""
    port = free_port()
    size = ["--result-bytes", str(result_bytes)] if result_bytes else []
    p = procs.spawn(name, [tool_bin, "--listen", f"127.0.0.1:{port}", "--threads", "1", *size])
    wait_tcp(port, p, name)
    return {"port": port, "pid": p.pid, "url": f"http://127.0.0.1:{port}/bench"}


def stop_spawned(procs, pid, timeout=60):
    """Stops one process `procs` started (SIGTERM, SIGKILL after `timeout` s) and reaps it."""
    for _, p in procs.children:
        if p.pid == pid and p.poll() is None:
            stop(p, timeout)


def start_nginx(procs, workdir, tool_port):
    d = os.path.join(workdir, "nginx")
    os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
    os.chmod(d, 0o755)
    port = free_port()
    conf = f"""worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    upstream tool {{
        server 127.0.0.1:{tool_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://tool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(conf)
    nginx = os.environ.get("NGINX", "nginx")
    p = procs.spawn("nginx", [nginx, "-p", d, "-e", f"{d}/error.log", "-c", "nginx.conf",
                              "-g", "daemon off;"])
    wait_tcp(port, p, "nginx")
    time.sleep(0.2)  # let the workers come up before counting them
    workers = child_pids(p.pid)
    return {"port": port, "pid": p.pid, "cpu_pids": workers, "rss_pids": [p.pid] + workers,
            "url": f"http://127.0.0.1:{port}/bench", "workers": len(workers)}


def toolgate_config(ports, tool_url, store, redis_ports, record_ttl_ms, otel_endpoint=None,
                    sized=False, store_timeout_ms=500):
    """The generated config. `sized`: the answer-size leg's tool, whose limits take a 1 MiB
    answer and whose projection shows the agent SIZE_MAX_ITEMS items."""
    listen = (f'listen: {{agent: "127.0.0.1:{ports["agent"]}", admin: "127.0.0.1:{ports["admin"]}", '
              f'telemetry: "127.0.0.1:{ports["telemetry"]}"}}')
    if store == "memory":
        # The benchmark keeps every record for its TTL: lift the store's default bound.
        store_yaml = f"store: {{kind: memory, record_ttl_ms: {record_ttl_ms}, memory_max_bytes: 17179869184}}"
    else:
        nodes = ", ".join(f'"redis://127.0.0.1:{p}"' for p in redis_ports)
        store_yaml = (f"store: {{kind: redis-cluster, nodes: [{nodes}], durability: {store}, "
                      f"record_ttl_ms: {record_ttl_ms}, timeout_ms: {store_timeout_ms}}}")
    otel = f"otel: {{endpoint: \"{otel_endpoint}\", service_name: toolgate-bench}}\n" \
        if otel_endpoint else ""
    tool = "    projection: {select: /results}\n"
    if sized:
        tool = (f"    timeout_ms: {SIZE_TOOL_TIMEOUT_MS}\n"
                f"    limits: {{raw_bytes: {SIZE_RAW_BYTES}, record_bytes: {SIZE_RECORD_BYTES}}}\n"
                f"    projection: {{select: /results, max_items: {SIZE_MAX_ITEMS}}}\n")
    return f"""# generated by bench/bench.py
{listen}
{store_yaml}
{otel}runs: {{max_timeout_ms: 86400000}}
tools:
  - name: bench
    upstream: {tool_url}
    read_only: true
{tool}"""


def start_toolgate(procs, workdir, name, toolgate_bin, tool_url, store, redis_ports, args,
                   front="invoke", wrapper=(), ready_timeout=20, otel_endpoint=None,
                   record_ttl_ms=None, run_id=None, sized=False, store_timeout_ms=500):
    ports = {k: free_port() for k in ("agent", "admin", "telemetry")}
    cfg = os.path.join(workdir, f"{name}.yaml")
    with open(cfg, "w") as f:
        f.write(toolgate_config(ports, tool_url, store, redis_ports,
                                record_ttl_ms or args.record_ttl_ms, otel_endpoint, sized,
                                store_timeout_ms))
    env = dict(os.environ, TOOLGATE_ADMIN_TOKEN=ADMIN_TOKEN)
    env.pop("TOOLGATE_CONFIG", None)
    env.pop("TOOLGATE_TOKEN_KEY", None)
    for kv in args.toolgate_env or []:
        k, _, v = kv.partition("=")
        env[k] = v
    p = procs.spawn(name, [*wrapper, toolgate_bin, "serve", "--config", cfg], env=env)
    try:
        ready = wait_http(f"http://127.0.0.1:{ports['telemetry']}/readyz", p, name,
                          timeout=ready_timeout)
    except Failure as e:
        return None, f"{e}; log: {log_tail(workdir, name)}"
    if not ready:
        return None, f"exited with {p.returncode}; log: {log_tail(workdir, name)}"
    run_id = run_id or f"bench-{store}"
    status, body = post_json(f"http://127.0.0.1:{ports['admin']}/v1/runs", {
        "run_id": run_id,
        "timeout_ms": args.run_timeout_ms,
        "budget": {"max_calls": 100_000_000, "max_record_bytes": 1_000_000_000_000},
    }, ADMIN_TOKEN)
    if status != 201:
        return None, f"POST /v1/runs answered {status}: {body}; log: {log_tail(workdir, name)}"
    return {"pid": p.pid, "cpu_pids": [p.pid], "rss_pids": [p.pid],
            "url": f"http://127.0.0.1:{ports['agent']}{ENDPOINTS[front]}", "front": front,
            "run_id": run_id, "token": body["run_token"], "ports": ports}, None


def start_redis(procs, workdir, cluster_bin, hz=None):
    """examples/redis_cluster: it prints the node URLs once the cluster is healthy, and stops
    the nodes on SIGTERM (Procs.stop_all) or when its stdin, a pipe from here, closes.

    Every node's latency monitor is on from 1 ms (`latency-monitor-threshold`), so that each
    Redis leg can say which of the cluster's own pauses (an expire cycle, a slow command) it
    met; `hz` (the server's background task rate) is Redis's default unless given."""
    p = procs.spawn("redis-cluster", [cluster_bin], pipes=True)
    line = p.stdout.readline()
    urls = line.split()
    if len(urls) != 6 or not all(u.startswith("redis://127.0.0.1:") for u in urls):
        raise Failure(f"Redis Cluster did not start: {log_tail(workdir, 'redis-cluster', 10)}")
    ports = [int(u.rsplit(":", 1)[1]) for u in urls]
    for port in ports:
        redis_cli(port, "config", "set", "latency-monitor-threshold", "1")
        if hz is not None:
            redis_cli(port, "config", "set", "hz", str(hz))
    got = redis_cli(ports[0], "config", "get", "hz").split()
    return {"ports": ports, "primaries": redis_primaries(ports), "pids": redis_pids(ports),
            "hz": int(got[1]) if len(got) == 2 else None}


def slot_roles(redis, run_id):
    """For each node, in `redis["ports"]` order: `primary` or `replica` if it holds the hash slot
    of the run's keys (a run's keys all share one slot), else `other`."""
    slot = redis_cli(redis["ports"][0], "cluster", "keyslot", f"toolgate:{{{run_id}}}:run").strip()
    roles = []
    for port in redis["ports"]:
        if int(redis_cli(port, "cluster", "countkeysinslot", slot).strip() or 0) == 0:
            roles.append("other")
        elif "role:master" in redis_cli(port, "info", "replication"):
            roles.append("primary")
        else:
            roles.append("replica")
    return roles


def cluster_stalls(ports):
    """The longest pause of each kind any node's latency monitor saw since its last reset, in
    ms (`LATENCY LATEST`: event, time, latest, max for each event, one per line here)."""
    stalls = {}
    for port in ports:
        lines = redis_cli(port, "latency", "latest").split()
        for i in range(0, len(lines) - 3, 4):
            event, worst = lines[i], int(lines[i + 3])
            stalls[event] = max(stalls.get(event, 0), worst)
    return dict(sorted(stalls.items()))


# ----------------------------------------------------------------------------------------------
# Scheduling waits (--sched-waits): how long woken processes waited for a CPU during a leg.

# The waits counted, in ms.
SCHED_WAITS_MS = (0.25, 1.0)
# One row of `perf sched timehist`: time, [cpu], task, wait time, sch delay, run time (ms).
TIMEHIST_ROW = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def sched_record(fname, seconds):
    """`perf sched record` of every CPU for `seconds`, in the background."""
    return subprocess.Popen(["perf", "sched", "record", "-a", "-o", fname, "--", "sleep",
                             str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def sched_waits(recorder, fname, calls_per_s):
    """What a `perf sched record` of a leg saw (`timehist_figures`), `calls_per_s` the leg's
    rate."""
    _, err = recorder.communicate(timeout=120)
    if recorder.returncode != 0:
        raise Failure(f"perf sched record failed (exit {recorder.returncode}): {err.strip()[-500:]}")
    r = subprocess.run(["perf", "sched", "timehist", "-i", fname], capture_output=True, text=True,
                       timeout=300)
    os.unlink(fname)
    if r.returncode != 0:
        raise Failure(f"perf sched timehist failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    return timehist_figures(r.stdout, calls_per_s, os.cpu_count() or 1)


def timehist_figures(text, calls_per_s, cpus):
    """From `perf sched timehist` output (a row each time a task leaves a CPU): how busy the
    CPUs were, how many times a process was given a CPU per call, and how many times per call a
    woken process waited more than each of SCHED_WAITS_MS for its CPU ("sch delay")."""
    first = last = None
    busy_ms, runs, over = 0.0, 0, dict.fromkeys(SCHED_WAITS_MS, 0)
    for line in text.splitlines():
        m = TIMEHIST_ROW.match(line)
        if not m:
            continue
        t = float(m[1])
        first = t if first is None else first
        last = t
        if m[3].startswith("<idle>"):
            continue
        busy_ms += float(m[6])
        runs += 1
        for ms in SCHED_WAITS_MS:
            over[ms] += float(m[5]) > ms
    span = (last - first) if first is not None else 0.0
    calls = calls_per_s * span
    if not calls:
        raise Failure(f"perf sched saw no calls ({runs} rows over {span:.1f} s)")
    return {"seconds": span, "cpus_busy": busy_ms / 1000 / (span * cpus),
            "runs_per_call": runs / calls,
            "waits_over_ms_per_call": {str(ms): n / calls for ms, n in over.items()}}


def sched_text(w):
    """One --sched-waits result, as the log line and the summary print it."""
    waits = ", ".join(f"> {ms} ms {n * 100:.2f}" for ms, n in w["waits_over_ms_per_call"].items())
    return (f"CPUs {w['cpus_busy']:.0%} busy, {w['runs_per_call']:.1f} runs a call, "
            f"waits per 100 calls {waits}")


def reset_stalls(ports):
    for port in ports:
        redis_cli(port, "latency", "reset")


# ----------------------------------------------------------------------------------------------
# Measuring.

def leg(path, threads, conns, seconds, prefix, pace_ms=0, sched_file=None):
    """One wrk leg on one path, with the proxy's CPU time over the leg; with `sched_file`, also
    what `perf sched` saw of the machine meanwhile (`sched_waits`)."""
    recorder = sched_record(sched_file, seconds) if sched_file else None
    pids = path.get("cpu_pids", [])
    extra = path.get("extra_cpu_pids", [])
    cpu0, extra0 = cpu_seconds(pids), cpu_seconds(extra)
    node0 = [cpu_seconds([p]) for p in path.get("redis_pids", [])]
    mode = path.get("front", "tool")
    try:
        out = wrk(path["url"], threads, conns, seconds, mode, prefix, path.get("run_id", ""),
                  path.get("token"), pace_ms=pace_ms)
    except BaseException:
        if recorder:
            recorder.kill()
        raise
    out["cpu_s"] = cpu_seconds(pids) - cpu0 if pids else None
    out["extra_cpu_s"] = cpu_seconds(extra) - extra0 if extra else None
    nodes = path.get("redis_pids", [])
    if nodes:
        out["redis_node_cpu_s"] = [cpu_seconds([p]) - c for p, c in zip(nodes, node0, strict=True)]
    if recorder:
        out["sched_waits"] = sched_waits(recorder, sched_file, out["rps"])
    return out


def start_monitor(port, fname):
    """`redis-cli monitor` on one node, into `fname`; returns once a marker proves it attached."""
    f = open(fname, "w")
    m = subprocess.Popen(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "monitor"], stdout=f,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while True:
        redis_cli(port, "echo", "bench-monitor-start")
        with open(fname) as fh:
            if "bench-monitor-start" in fh.read():
                return m, f
        if time.time() > deadline:
            stop_monitors([(m, f)])
            raise Failure(f"redis-cli monitor on {port} did not attach")
        time.sleep(0.05)


def stop_monitors(monitors):
    for m, f in monitors:
        m.terminate()
        m.wait()
        f.close()


def round_trips(path, redis, seconds, calls):
    """Store commands per call: MONITOR on every primary over `calls` sequential calls."""
    prim = redis["primaries"]
    progress_key = f"toolgate:{{{path['run_id']}}}:progress"
    llen0 = int(redis_cli(redis["ports"][0], "-c", "llen", progress_key).strip() or 0)
    stats0 = {p: commandstats(p) for p in prim}
    files = [os.path.join(path["workdir"], f"monitor-{path['name']}-{p}.txt") for p in prim]
    monitors = []
    try:
        for p, fname in zip(prim, files, strict=True):
            monitors.append(start_monitor(p, fname))
        res = wrk(path["url"], 1, 1, seconds, "invoke", f"rt{int(time.time())}", path["run_id"],
                  path["token"], stop_after=calls)
        time.sleep(0.5)  # anything still in flight lands in the streams
    finally:
        stop_monitors(monitors)
    llen1 = int(redis_cli(redis["ports"][0], "-c", "llen", progress_key).strip() or 0)
    stats1 = {p: commandstats(p) for p in prim}
    finalized = llen1 - llen0
    by_cmd = {}
    line_re = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]*)"')
    for fname in files:
        with open(fname, errors="replace") as fh:
            for line in fh:
                m = line_re.match(line)
                if not m or m.group(1) == "lua":
                    continue  # commands run inside a script are not round trips
                cmd = m.group(2).lower()
                if cmd in NOT_CALL_COMMANDS:
                    continue
                by_cmd[cmd] = by_cmd.get(cmd, 0) + 1
    inner = 0
    for p in prim:
        for cmd, n in stats1[p].items():
            if cmd.split("|")[0] not in NOT_CALL_COMMANDS:
                inner += n - stats0[p].get(cmd, 0)
    denom = finalized if finalized > 0 else max(1, res["requests"])
    return {
        "calls": res["requests"],
        "finalized_calls": finalized,
        "failed": failed_of(res),
        "statuses": res["statuses"],
        "round_trips_per_call": sum(by_cmd.values()) / denom,
        "round_trips_by_command": {k: round(v / denom, 3) for k, v in sorted(by_cmd.items())},
        "redis_commands_per_call_incl_scripts": inner / denom,
    }


def live_records(args, procs, workdir, tool, rounds, lat_s, rps, log):
    """The memory store's latency while it holds `args.live_records` live records: a toolgate of
    its own whose records outlive the phase is filled at 32 connections, then measured at 4
    connections as the latency rounds are, and stopped (it holds a few GiB). wrk runs for its
    whole duration even when its threads stop early, so the fill lasts what the memory path's
    throughput (`rps`) says it needs, with a margin, and stops at the count."""
    name = "toolgate-memory-live"
    tg, why = start_toolgate(procs, workdir, name, args.toolgate, tool["url"], "memory", [], args,
                             record_ttl_ms=3600 * 1000)
    if tg is None:
        raise Failure(f"{name}: {why}")
    tg["front"] = "invoke"
    per_thread = -(-args.live_records // 2)
    t0 = time.time()
    seconds = min(600, int(args.live_records / max(rps, 1000) * 1.25) + 3)
    fill = wrk(tg["url"], 2, 32, seconds, "invoke", "f", tg["run_id"], tg["token"],
               stop_after=per_thread)
    failed = failed_of(fill)
    log(f"live records: {fill['requests']} calls within {time.time() - t0:.0f} s, "
        f"RSS {rss_mib(tg['pid'])[0]:.0f} MiB"
        + (f"  FAILED {failed}" if failed else ""))
    p99 = []
    for rnd in range(rounds):
        r = leg(tg, 1, 4, lat_s, f"l{rnd}", args.latency_pace_ms)
        failed += failed_of(r)
        p99.append(r["latency_us"]["p99"] / 1000)
        log(f"latency    {name:24} {r['rps']:9.0f} req/s  p50 {r['latency_us']['p50'] / 1000:.3f} ms"
            f"  p99 {p99[-1]:.3f} ms")
    rss = rss_mib(tg["pid"])[0]
    os.kill(tg["pid"], signal.SIGTERM)
    return {"records": fill["requests"] - failed_of(fill),
            "p99_ms": {"median": median(p99), "rounds": p99}, "rss_mib": rss, "failed": failed}


def sequential_calls(path, n, prefix):
    """n calls one after another on one keep-alive connection; returns how many were not READY
    (on MCP: not an "isError":false result)."""
    import http.client
    port = int(path["url"].split(":")[2].split("/")[0])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {path['token']}"}
    mcp = path["front"] == "mcp"
    bad = 0
    for i in range(n):
        call_id = f"{prefix}-{i}"
        if mcp:
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                "name": "bench", "arguments": {"q": "x"},
                "_meta": {"toolgate.dev/run_id": path["run_id"],
                          "toolgate.dev/tool_call_id": call_id}}})
        else:
            body = json.dumps({"run_id": path["run_id"], "tool_call_id": call_id,
                               "tool": "bench", "input": {"q": "x"}})
        conn.request("POST", ENDPOINTS[path["front"]], body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        good = b'"isError":false' if mcp else b'"status":"READY"'
        if r.status != 200 or good not in data:
            bad += 1
    conn.close()
    return bad


# ----------------------------------------------------------------------------------------------
# Signed evidence: GET …/evidence next to GET …/facts on one run of EVIDENCE_FACTS facts.

# The paths whose store the evidence leg measures, each with a toolgate of its own.
EVIDENCE_PATHS = ("toolgate-memory", "toolgate-redis-primary")
EVIDENCE_FACTS = 100
# Untimed requests of each endpoint before the timed ones (checked all the same).
EVIDENCE_WARMUP = 20
EVIDENCE_ENDPOINTS = {"facts": "/v1/runs/{run_id}/facts", "evidence": "/v1/runs/{run_id}/evidence"}


def b64url_json(part):
    """The JSON value an unpadded base64url part of a JWS encodes."""
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def facts_problem(doc, run_id, n):
    """Why a facts body (or a bundle's statement) is not run_id's n facts, none excluded, or None."""
    if doc.get("run_id") != run_id:
        return f"run_id {doc.get('run_id')!r}, not {run_id!r}"
    facts = doc.get("facts")
    if not isinstance(facts, list) or len(facts) != n:
        return f"{len(facts) if isinstance(facts, list) else facts!r} facts, not {n}"
    if doc.get("excluded") != 0 or doc.get("tampered") != 0:
        return f"excluded {doc.get('excluded')!r}, tampered {doc.get('tampered')!r}, not 0"
    return None


def check_facts(status, body, run_id, n):
    """Why a `GET …/facts` answer is not a good one (200, run_id's n facts, none excluded), or None."""
    if status != 200:
        return f"facts: status {status}: {body[:200]!r}"
    try:
        problem = facts_problem(json.loads(body), run_id, n)
    except (ValueError, AttributeError) as e:
        return f"facts: malformed: {e}"
    return problem and f"facts: {problem}"


def check_bundle(status, body, run_id, n):
    """Why a `GET …/evidence` answer is not a good one, or None: 200, a JWS in the General JSON
    Serialization with exactly one signature, the protected header toolgate's, and a statement of
    run_id's n facts (seq 1..n), none excluded, in an ENDED run. The signature itself is checked
    once per leg, by `toolgate verify` (verify_bundle)."""
    if status != 200:
        return f"evidence: status {status}: {body[:200]!r}"
    try:
        jws = json.loads(body)
        if set(jws) != {"payload", "signatures"} or len(jws["signatures"]) != 1:
            return f"evidence: not a JWS with one signature: members {sorted(jws)}"
        sig = jws["signatures"][0]
        header = b64url_json(sig["protected"])
        if header.get("alg") != "EdDSA" or header.get("typ") != "toolgate-evidence+json" \
                or not header.get("kid") or not sig.get("signature"):
            return f"evidence: protected header {header}"
        statement = b64url_json(jws["payload"])
        if statement.get("typ") != "toolgate.evidence.v1" or statement.get("state") != "ENDED":
            return (f"evidence: statement typ {statement.get('typ')!r}, state "
                    f"{statement.get('state')!r}")
        problem = facts_problem(statement, run_id, n)
        if problem:
            return f"evidence: {problem}"
        if [f.get("seq") for f in statement["facts"]] != list(range(1, n + 1)):
            return "evidence: seq is not 1..n"
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return f"evidence: malformed: {e!r}"
    return None


def percentile(xs, q):
    """The q-th percentile of xs by nearest rank (the smallest x with at least q % of xs at or
    below it); None for no xs."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def ms(us):
    return None if us is None else us / 1000


def endpoint_figures(blocks):
    """One endpoint's figures from its timed blocks, one block a round (`timed_gets` and the CPU
    over it): p50 and p99 of each round and their median over rounds, the proxy's and the
    store's CPU per request over every block, and the failures."""
    p50 = [ms(percentile(b["latency_us"], 50)) for b in blocks]
    p99 = [ms(percentile(b["latency_us"], 99)) for b in blocks]
    reqs = sum(b["requests"] for b in blocks)
    store = [b["store_cpu_s"] for b in blocks]
    return {
        "latency_ms": {"p50": {"median": median(p50), "rounds": p50},
                       "p99": {"median": median(p99), "rounds": p99},
                       "max": ms(max((max(b["latency_us"]) for b in blocks if b["latency_us"]),
                                     default=None))},
        "requests": reqs,
        "failed": sum(b["failed"] for b in blocks),
        "errors": [e for b in blocks for e in b["errors"]][:3],
        "cpu_us_per_request": sum(b["cpu_s"] for b in blocks) / reqs * 1e6 if reqs else None,
        "store_cpu_us_per_request": sum(store) / reqs * 1e6
        if reqs and None not in store else None,
        "body_bytes": blocks[-1]["body_bytes"] if blocks else None,
    }


def paired_added(xs, ys):
    """The median over rounds of x - y, each round's pair with both measured."""
    return median([x - y for x, y in zip(xs, ys, strict=False) if x is not None and y is not None])


def evidence_vs_facts(ev, facts):
    """evidence next to facts (endpoint_figures each): p50 and p99 added, paired per round, and
    the ratio of the proxy's CPU per request."""
    e, f = ev["latency_ms"], facts["latency_ms"]
    ec, fc = ev["cpu_us_per_request"], facts["cpu_us_per_request"]
    return {"p50_added_ms": paired_added(e["p50"]["rounds"], f["p50"]["rounds"]),
            "p99_added_ms": paired_added(e["p99"]["rounds"], f["p99"]["rounds"]),
            "cpu_ratio": ec / fc if ec is not None and fc else None}


def timed_gets(conn, target, n, check):
    """n GETs of `target` with the admin token, one after another on the keep-alive `conn`, each
    answer checked by `check(status, body)` once its time is taken. Returns the latencies in us
    (from sending the request to the last byte of the answer, on this client), how many failed,
    the first few reasons, and the last answer's size in bytes."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    lat, failed, why, size = [], 0, [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            conn.request("GET", target, headers=headers)
            r = conn.getresponse()
            body = r.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()  # the next request opens a new connection
            failed += 1
            if len(why) < 3:
                why.append(f"{target}: {e!r}")
            continue
        lat.append((time.perf_counter() - t0) * 1e6)
        problem = check(r.status, body)
        if problem:
            failed += 1
            if len(why) < 3:
                why.append(problem)
        size = len(body)
    return lat, failed, why, size


def verify_bundle(toolgate_bin, admin, run_id, workdir, name):
    """One bundle of the run and the JWK Set, checked with `toolgate verify`: its line, and
    whether it says the bundle is valid with EVIDENCE_FACTS facts."""
    files = {}
    for what, target, headers in (
            ("bundle", EVIDENCE_ENDPOINTS["evidence"].format(run_id=run_id),
             {"Authorization": f"Bearer {ADMIN_TOKEN}"}),
            ("jwks", "/.well-known/jwks.json", {})):
        files[what] = os.path.join(workdir, f"{name}-{what}.json")
        try:
            with urllib.request.urlopen(urllib.request.Request(admin + target, headers=headers),
                                        timeout=30) as r, open(files[what], "wb") as f:
                f.write(r.read())
        except (urllib.error.URLError, OSError) as e:
            return f"GET {target}: {e}", False
    r = subprocess.run([toolgate_bin, "verify", "--bundle", files["bundle"], "--jwks",
                        files["jwks"]], capture_output=True, text=True, timeout=60)
    line = (r.stdout.strip() or r.stderr.strip()).splitlines()[-1:] or [f"exit {r.returncode}"]
    ok = r.returncode == 0 and line[0].startswith(f"valid: run {run_id}, {EVIDENCE_FACTS} facts,")
    return line[0], ok


def evidence_leg(args, procs, workdir, tool, redis, name, requests, rounds, log):
    """`GET …/evidence` next to `GET …/facts` on `name`'s store, with a toolgate of its own
    (records kept an hour, so none expires during the leg): EVIDENCE_FACTS READY calls through
    the agent listener, the run ended, EVIDENCE_WARMUP untimed requests of each endpoint, then
    `requests` of each endpoint in `rounds` blocks, one request at a time on one keep-alive
    connection to the admin listener, the two endpoints' blocks alternated and their order
    rotated every round; the toolgate's CPU (and on Redis the six nodes') over each block. Last,
    one bundle goes through `toolgate verify`. Every answer is checked (check_facts,
    check_bundle); the entry's `failed` counts every call, request or check that failed."""
    spec = next(p for p in PATHS if p["name"] == name)
    store, tg_name, run_id = spec["store"], f"{name}-evidence", f"bench-evidence-{spec['store']}"
    on_redis = store != "memory"
    tg, why = start_toolgate(procs, workdir, tg_name, args.toolgate, tool["url"], store,
                             redis["ports"] if on_redis else [], args, record_ttl_ms=3600 * 1000,
                             run_id=run_id)
    if tg is None:
        if args.allow_unavailable:
            log(f"{tg_name}: UNAVAILABLE: {why}")
            return {"unavailable": why}
        raise Failure(f"{tg_name}: {why}")
    entry = {"store": store, "run_id": run_id, "facts_per_run": EVIDENCE_FACTS}
    try:
        failed = sequential_calls(tg, EVIDENCE_FACTS, "ev")
        admin = f"http://127.0.0.1:{tg['ports']['admin']}"
        status, body = post_json(f"{admin}/v1/runs/{run_id}/end", {}, ADMIN_TOKEN)
        ended = status == 200 and isinstance(body, dict) and \
            facts_problem(body, run_id, EVIDENCE_FACTS) is None
        if failed or not ended:
            entry.update(failed=failed + (not ended), error=(
                f"{failed} of {EVIDENCE_FACTS} calls not READY; POST …/end answered {status}: "
                f"{str(body)[:200]}"))
            log(f"evidence   {name}: FAILED before timing: {entry['error']}")
            return entry
        conn = http.client.HTTPConnection("127.0.0.1", tg["ports"]["admin"], timeout=30)
        targets = {k: v.format(run_id=run_id) for k, v in EVIDENCE_ENDPOINTS.items()}
        checks = {"facts": check_facts, "evidence": check_bundle}
        warm = {k: timed_gets(conn, targets[k], EVIDENCE_WARMUP,
                              lambda st, b, k=k: checks[k](st, b, run_id, EVIDENCE_FACTS))
                for k in targets}
        nodes = redis["pids"] if on_redis else []
        per_round = -(-requests // rounds)
        blocks = {k: [] for k in targets}
        for rnd in range(rounds):
            for k in rotate(list(targets), rnd):
                cpu0, nodes0 = cpu_seconds([tg["pid"]]), cpu_seconds(nodes)
                lat, f, why, size = timed_gets(
                    conn, targets[k], per_round,
                    lambda st, b, k=k: checks[k](st, b, run_id, EVIDENCE_FACTS))
                b = {"latency_us": lat, "requests": per_round, "failed": f, "errors": why,
                     "cpu_s": cpu_seconds([tg["pid"]]) - cpu0,
                     "store_cpu_s": cpu_seconds(nodes) - nodes0 if on_redis else None,
                     "body_bytes": size}
                blocks[k].append(b)
                log(f"evidence   {name + ' ' + k:32} p50 {fmt(ms(percentile(lat, 50)), '.3f')} ms"
                    f"  p99 {fmt(ms(percentile(lat, 99)), '.3f')} ms  CPU "
                    f"{b['cpu_s'] / per_round * 1e6:.0f} us/request  {size} bytes"
                    + (f"  FAILED {f}: {why[0]}" if f else ""))
        conn.close()
        line, ok = verify_bundle(args.toolgate, admin, run_id, workdir, tg_name)
        log(f"evidence   {name}: toolgate verify: {line}")
        for k in targets:
            # The warm-up's failures count with the endpoint's, and a bundle that does not
            # verify as one failed evidence request.
            entry[k] = endpoint_figures(blocks[k])
            entry[k]["endpoint"] = "GET " + EVIDENCE_ENDPOINTS[k]
            entry[k]["failed"] += warm[k][1]
            entry[k]["errors"] = (warm[k][2] + entry[k]["errors"])[:3]
        entry["evidence"]["failed"] += not ok
        entry["evidence_vs_facts"] = evidence_vs_facts(entry["evidence"], entry["facts"])
        entry["verify"] = {"line": line, "ok": ok}
        entry["failed"] = entry["facts"]["failed"] + entry["evidence"]["failed"]
        return entry
    finally:
        os.kill(tg["pid"], signal.SIGTERM)


def print_evidence(ev):
    """Below the table: GET …/facts and GET …/evidence on the same run, each store."""
    if not ev:
        return
    print()
    print(f"GET …/facts and GET …/evidence (signed) on one ended run of {ev['facts_per_run']} facts, "
          f"on the admin listener, one request at a time\non one connection: {ev['rounds']} "
          f"round(s) x {ev['requests_per_round']} requests of each, interleaved; medians over "
          f"rounds; +p50/+p99: evidence minus facts,\npaired per round; CPU us: toolgate's per "
          f"request; others us: the Redis nodes' per request; KiB: the answer's size")
    cols = [("path", 32), ("p50 ms", 7), ("p99 ms", 7), ("+p50 ms", 8), ("+p99 ms", 8),
            ("CPU us", 8), ("/facts CPU", 10), ("others us", 9), ("KiB", 7), ("failed", 7)]
    head = " ".join(n.ljust(w) if i == 0 else n.rjust(w) for i, (n, w) in enumerate(cols))
    print(head)
    print("-" * len(head))
    for name, e in ev["paths"].items():
        if e.get("unavailable") or e.get("error"):
            why = e.get("unavailable") or e["error"]
            print(f"{name.ljust(32)} {'unavailable' if e.get('unavailable') else 'FAILED'}: "
                  f"{why[:95]}")
            continue
        vs = e["evidence_vs_facts"]
        for k in ("facts", "evidence"):
            r = e[k]
            ev_row = k == "evidence"
            cells = [f"{name} {k}", fmt(r["latency_ms"]["p50"]["median"], ".3f"),
                     fmt(r["latency_ms"]["p99"]["median"], ".3f"),
                     fmt(vs["p50_added_ms"] if ev_row else None, "+.3f"),
                     fmt(vs["p99_added_ms"] if ev_row else None, "+.3f"),
                     fmt(r["cpu_us_per_request"], ".0f"),
                     fmt(vs["cpu_ratio"] if ev_row else None, ".2f"),
                     fmt(r["store_cpu_us_per_request"], ".0f"),
                     fmt(r["body_bytes"] / 1024 if r["body_bytes"] else None, ".1f"),
                     str(r["failed"])]
            print(" ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, (_, w)) in
                           enumerate(zip(cells, cols, strict=True))))
        print(f"{'':32} toolgate verify: {e['verify']['line']}")


def callgrind_dump(pid, workdir, prefix):
    """Has the callgrind'ed process `pid` write its counters since the last dump or zeroing
    (which it then zeroes), and returns the file, named `prefix`.N in `workdir`."""
    before = set(os.listdir(workdir))
    subprocess.run(["callgrind_control", "--dump=measured", str(pid)], check=True,
                   capture_output=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        new = [f for f in set(os.listdir(workdir)) - before if f.startswith(prefix)]
        if new:
            time.sleep(1)  # let callgrind finish writing
            return os.path.join(workdir, new[0])
        time.sleep(0.2)
    raise Failure("callgrind wrote no dump")


def callgrind(args, procs, started):
    """Counts toolgate's instructions per call on one path under valgrind's callgrind; with
    --result-bytes, at each answer size in turn (callgrind_sizes)."""
    def log(msg):
        print(f"[{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    name = args.callgrind
    spec = next((p for p in PATHS if p["name"] == name and p["store"]), None)
    if spec is None:
        raise Failure(f"--callgrind takes a toolgate path, not {name!r}")
    redis = start_redis(procs, args.workdir, args.redis_cluster) if spec["store"] != "memory" \
        else None
    if args.result_bytes:
        return callgrind_sizes(args, procs, spec, redis, log)
    tool = start_tool(procs, args.tool)
    sink = OtlpSink() if spec.get("otel") else None
    n = args.calls or 2000
    warm = args.warmup_calls or 200
    keep = os.path.join(BENCH_DIR, "results", f"callgrind-{name}.out")
    bad = callgrind_calls(args, procs, spec, tool, redis, keep, warm, n, log,
                          otel_endpoint=sink.endpoint if sink else None)
    total, rows = callgrind_inclusive(keep)
    print()
    print(f"callgrind, {name}: {n} calls, {total / n:,.0f} instructions per call in toolgate "
          f"(user space), {bad} not READY"
          + (f"; OTLP sink: {sink.stats()}" if sink else ""))
    print(f"top inclusive costs per call (file:function); the whole file: {keep}")
    for line in callgrind_top(rows, total, n, args.top):
        print(line)
    return 1 if bad else 0


def callgrind_calls(args, procs, spec, tool, redis, keep, warm, n, log, otel_endpoint=None,
                    sized=False, label=""):
    """Starts `spec`'s toolgate under callgrind against `tool`, makes `warm` calls, zeroes the
    counters, makes `n` sequential calls, keeps the profile of those in `keep`, and stops the
    toolgate. Returns how many calls were not READY."""
    name = spec["name"] + (f"-{label}" if label else "")
    out = os.path.join(args.workdir, f"callgrind-{name}.out")
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    # Under valgrind a large answer's store operation takes far longer than in a deployment.
    tg, why = start_toolgate(procs, args.workdir, name, args.toolgate, tool["url"], spec["store"],
                             redis["ports"] if redis else [], args, spec["front"], wrapper,
                             ready_timeout=120, otel_endpoint=otel_endpoint,
                             record_ttl_ms=SIZE_RECORD_TTL_MS if sized else None,
                             run_id=f"bench-{spec['store']}-{label}" if label else None,
                             sized=sized, store_timeout_ms=30_000 if sized else 500)
    if tg is None:
        raise Failure(f"{name} did not start under valgrind: {why}")
    try:
        log(f"{name} under callgrind: {warm} warm-up calls")
        bad = sequential_calls(tg, warm, "cgw")
        subprocess.run(["callgrind_control", "--zero", str(tg["pid"])], check=True,
                       capture_output=True)
        log(f"{n} measured calls")
        bad += sequential_calls(tg, n, "cgm")
        dump = callgrind_dump(tg["pid"], args.workdir, os.path.basename(out))
        os.makedirs(os.path.dirname(keep), exist_ok=True)
        shutil.copyfile(dump, keep)
    finally:
        stop_spawned(procs, tg["pid"])
    return bad


def callgrind_inclusive(path):
    """The total and the inclusive cost of every function of a callgrind profile, highest first,
    as `callgrind_annotate` gives them: (total, [(instructions, "file:function"), ...])."""
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = None
    rows = []
    for line in ann.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        ir = int(m.group(1).replace(",", ""))
        what = m.group(2)
        if what.startswith("PROGRAM TOTALS"):
            total = ir
            continue
        what = re.sub(r"/root/\.cargo/registry/src/[^/]+/|/rustc/[0-9a-f]+/|\s*\[[^\]]*\]$", "",
                      what).replace(REPO_ROOT + "/", "")
        rows.append((ir, what))
    return total, rows


def callgrind_top(rows, total, n, top):
    """The lines of the top inclusive costs per call: toolgate's functions, the allocator,
    serde_json and logging, each function once."""
    seen = set()
    lines = []
    for ir, what in rows:
        fn = what.split(":", 1)[-1]
        if fn in seen or not re.search(r"toolgate::|malloc|free|serde_json::(ser|de)|"
                                       r"tracing_subscriber.*event|Clone>::clone$", what):
            continue
        seen.add(fn)
        lines.append(f"  {ir / n:10,.0f}  {ir / total:6.1%}  {what[:150]}")
        if len(lines) >= top:
            break
    return lines


# ----------------------------------------------------------------------------------------------
# Answer sizes: what a larger tool answer costs.

# The stores the size leg measures, each with a toolgate of its own per size.
SIZE_PATHS = ("toolgate-memory", "toolgate-redis-primary")
SIZES = (1024, 64 * 1024, MIB)
QUICK_SIZES = (64 * 1024,)
# The size leg's tool: limits that take a 1 MiB answer (its record holds the answer and the
# request), a projection showing the agent SIZE_MAX_ITEMS items, and a timeout for valgrind.
SIZE_MAX_ITEMS = 5
SIZE_RAW_BYTES = 2 * MIB
SIZE_RECORD_BYTES = 3 * MIB
SIZE_TOOL_TIMEOUT_MS = 60_000
# Records of up to 1 MiB at hundreds of calls a second: kept 1 s, so that the store holds a
# second's worth and not a minute's (the memory store keeps them in toolgate's own memory).
SIZE_RECORD_TTL_MS = 1000
# How often the toolgate's VmRSS is read while 32 calls are in flight.
RSS_SAMPLE_S = 0.02
# Targets (reported, not asserted): instructions per byte of answer on the memory path between
# the two largest sizes, and the Redis path's RSS peak above idle at the largest size.
SIZE_SLOPE_TARGET = 4.0
SIZE_RSS_TARGET_MIB = 96


def parse_sizes(text):
    """Byte counts from "1k,64k,1m" (k: KiB, m: MiB, else bytes); none for "0" or ""."""
    sizes = []
    for part in (text or "").split(","):
        part = part.strip().lower().removesuffix("ib").removesuffix("b")
        if not part:
            continue
        unit = {"k": 1024, "m": MIB}.get(part[-1], 1)
        try:
            n = int(part[:-1] if unit > 1 else part) * unit
        except ValueError:
            raise Failure(f"--result-bytes: {text!r} is not a list of sizes such as 1k,64k,1m") \
                from None
        if n < 0:
            raise Failure(f"--result-bytes: {text!r} has a negative size")
        if n:
            sizes.append(n)
    return sorted(set(sizes))


def size_label(n):
    """1024 → "1k", 1048576 → "1m", 1000 → "1000"."""
    if n % MIB == 0:
        return f"{n // MIB}m"
    if n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def body_size(url):
    """The size of the answer a POST of {"q":"x"} to `url` gets."""
    req = urllib.request.Request(url, data=b'{"q":"x"}', method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return len(r.read())


class RssSampler:
    """Reads a process's VmRSS every RSS_SAMPLE_S in a thread until stopped; `stop()` gives the
    highest value seen, in MiB."""

    def __init__(self, pid):
        self.pid, self.peak = pid, 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.pid)[0])
            except OSError:
                return
            self.done.wait(RSS_SAMPLE_S)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak


def slope(a, b):
    """Instructions per byte between two sizes' (bytes, instructions per call)."""
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] != a[0] else None


def size_leg(args, procs, workdir, redis, sizes, names, rounds, lat_s, load_s, warm_s, log):
    """The answer-size leg: size_point at each size, on the stores of `names`."""
    section = {"settings": {
        "sizes": sizes, "rounds": rounds, "latency_seconds": lat_s, "latency_connections": 4,
        "latency_pace_ms": args.latency_pace_ms, "load_seconds": load_s, "load_connections": 32,
        "warmup_seconds": warm_s, "record_ttl_ms": SIZE_RECORD_TTL_MS,
        "limits": {"raw_bytes": SIZE_RAW_BYTES, "record_bytes": SIZE_RECORD_BYTES},
        "projection": {"select": "/results", "max_items": SIZE_MAX_ITEMS},
        "rss_sample_ms": RSS_SAMPLE_S * 1000}, "sizes": {}, "failed": 0}
    for size in sizes:
        entry = size_point(args, procs, workdir, redis, size, names, rounds, lat_s, load_s,
                           warm_s, log)
        section["sizes"][str(size)] = entry
        section["failed"] += entry["direct"]["failed"] + sum(
            e.get("failed", 0) for e in entry["paths"].values())
    return section


def size_point(args, procs, workdir, redis, size, names, rounds, lat_s, load_s, warm_s, log):
    """One size: a fake tool answering `size` bytes and, on each store of `names`, a toolgate of
    its own (SIZE_* settings). Every path, the direct call included, gets a warm-up at 32
    connections; then latency legs at 4 connections, paced as in the latency phase, interleaved
    with the direct call and rotated every round; then each toolgate gets `load_s` at 32
    connections while its VmRSS is sampled (RssSampler). Its RSS idle is read before any call;
    its peak is the larger of VmHWM after the load and the highest sample. The toolgates and the
    tool are stopped before the next size."""
    label = size_label(size)
    tool = start_tool(procs, args.tool, size, name=f"fake_tool-{label}")
    entry = {"label": label, "body_bytes": body_size(tool["url"]), "paths": {}}
    log(f"size {label}: fake_tool answers {entry['body_bytes']} bytes on {tool['url']}")
    paths = {"direct": {"name": "direct", "url": tool["url"], "cpu_pids": [],
                        "extra_cpu_pids": [tool["pid"]]}}
    idle, rss = {}, {}
    legs = {"direct": {"warmup": [], "latency": [], "load": []}}

    def run(phase, n, threads, conns, seconds, pace_ms=0):
        r = leg(paths[n], threads, conns, seconds, f"s{label}{phase}{len(legs[n][phase])}",
                pace_ms)
        legs[n][phase].append(r)
        bad = failed_of(r)
        log(f"size {label:5} {phase:8} {n:24} {r['rps']:8.0f} req/s  p50 "
            f"{r['latency_us']['p50'] / 1000:.3f} ms  p99 {r['latency_us']['p99'] / 1000:.3f} ms"
            + (f"  FAILED {bad} {r['statuses']}" if bad else ""))

    try:
        for n in names:
            spec = next(p for p in PATHS if p["name"] == n)
            on_redis = spec["store"] != "memory"
            tg, why = start_toolgate(procs, workdir, f"{n}-{label}", args.toolgate, tool["url"],
                                     spec["store"], redis["ports"] if on_redis else [], args,
                                     record_ttl_ms=SIZE_RECORD_TTL_MS,
                                     run_id=f"bench-size-{spec['store']}-{label}", sized=True)
            if tg is None:
                if not args.allow_unavailable:
                    raise Failure(f"{n} ({label}): {why}")
                log(f"size {label}: {n}: UNAVAILABLE: {why}")
                entry["paths"][n] = {"unavailable": why}
                continue
            tg.update(name=n, extra_cpu_pids=[tool["pid"]] + (redis["pids"] if on_redis else []))
            paths[n] = tg
            legs[n] = {"warmup": [], "latency": [], "load": []}
            idle[n] = rss_mib(tg["pid"])[0]
        for n in paths:
            run("warmup", n, 2, 32, warm_s)
        for rnd in range(rounds):
            for n in rotate(list(paths), rnd):
                run("latency", n, 1, 4, lat_s, args.latency_pace_ms)
        for n in idle:
            sampler = RssSampler(paths[n]["pid"])
            try:
                run("load", n, 2, 32, load_s)
            finally:
                sampled = sampler.stop()
            now, hwm = rss_mib(paths[n]["pid"])
            peak = max(hwm, sampled)
            rss[n] = {"idle": idle[n], "load": now, "peak": peak, "peak_sampled": sampled,
                      "peak_above_idle": peak - idle[n]}
    finally:
        for n in idle:
            stop_spawned(procs, paths[n]["pid"])
        stop_spawned(procs, tool["pid"])
    entry["direct"] = size_figures(legs["direct"], None)
    for n in idle:
        entry["paths"][n] = size_figures(legs[n], legs["direct"])
        entry["paths"][n]["rss_mib"] = rss[n]
    return entry


def size_figures(legs, direct):
    """One path's figures at one size from its legs (and the direct call's, paired per round):
    latency medians over rounds, the added latency, the load leg's throughput and CPU per call,
    and the failed requests over every leg."""
    p50 = [r["latency_us"]["p50"] / 1000 for r in legs["latency"]]
    p99 = [r["latency_us"]["p99"] / 1000 for r in legs["latency"]]
    every = legs["warmup"] + legs["latency"] + legs["load"]
    out = {"latency_ms": {"p50": {"median": median(p50), "rounds": p50},
                          "p99": {"median": median(p99), "rounds": p99}},
           "requests": sum(r["requests"] for r in every),
           "failed": sum(failed_of(r) for r in every)}
    statuses = {}
    for r in every:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    out["by_status"] = statuses
    if direct is not None:
        d50 = [r["latency_us"]["p50"] / 1000 for r in direct["latency"]]
        d99 = [r["latency_us"]["p99"] / 1000 for r in direct["latency"]]
        out["p50_added_ms_vs_direct"] = paired_added(p50, d50)
        out["p99_added_ms_vs_direct"] = paired_added(p99, d99)
    if legs["load"]:
        r = legs["load"][-1]

        def per_call(cpu):
            return cpu / r["requests"] * 1e6 if cpu is not None and r["requests"] else None

        out["load"] = {"rps": r["rps"], "p50_ms": r["latency_us"]["p50"] / 1000,
                       "p99_ms": r["latency_us"]["p99"] / 1000,
                       "cpu_us_per_call": per_call(r["cpu_s"]),
                       "tool_and_store_cpu_us_per_call": per_call(r["extra_cpu_s"])}
    return out


def size_targets(section, cg):
    """The size leg's targets: the Redis path's RSS peak above idle at the largest size measured
    (32 calls in flight), and, when the file holds the memory path's callgrind sweep, its
    instructions per byte between its two largest sizes."""
    out = []
    if section and section.get("sizes"):
        biggest = max(section["sizes"], key=int)
        e = section["sizes"][biggest]["paths"].get("toolgate-redis-primary") or {}
        delta = (e.get("rss_mib") or {}).get("peak_above_idle")
        out.append({"target": f"redis primary RSS peak above idle, 32 concurrent "
                              f"{size_label(int(biggest))} calls (MiB)",
                    "goal": f"<= {SIZE_RSS_TARGET_MIB}", "measured": delta,
                    "met": None if delta is None else delta <= SIZE_RSS_TARGET_MIB})
    mem = (cg or {}).get("toolgate-memory") or {}
    s = mem.get("slope_instructions_per_byte")
    if s is not None:
        out.append({"target": f"memory instructions per byte of answer, {mem['slope_between']} "
                              f"(callgrind at {mem.get('commit')})",
                    "goal": f"<= {SIZE_SLOPE_TARGET:g}", "measured": s,
                    "met": s <= SIZE_SLOPE_TARGET})
    return out


def print_size(section):
    """Below the table: the answer-size leg, one row per size and path."""
    if not section:
        return
    st = section["settings"]
    print()
    print(f"answer sizes: a toolgate of its own per size and store (projection "
          f"select /results, max_items {SIZE_MAX_ITEMS}; records kept {st['record_ttl_ms']} ms); "
          f"latency: {st['rounds']} x {st['latency_seconds']}s at 4 connections, interleaved "
          f"with the direct call;\n+p50/+p99: paired per round against it; load: "
          f"{st['load_seconds']}s at 32 connections, CPU us per call (others: the tool's and on "
          f"Redis the six nodes')\nand RSS peak (VmHWM or the highest {st['rss_sample_ms']:g} ms "
          f"sample) during it")
    cols = [("size", 6), ("path", 24), ("p50 ms", 7), ("p99 ms", 7), ("+p50 ms", 8),
            ("+p99 ms", 8), ("load req/s", 10), ("CPU us", 8), ("others us", 9),
            ("RSS idle", 9), ("RSS peak", 9), ("+RSS", 7), ("failed", 7)]
    head = " ".join(n.ljust(w) if i < 2 else n.rjust(w) for i, (n, w) in enumerate(cols))
    print(head)
    print("-" * len(head))
    for _, entry in sorted(section["sizes"].items(), key=lambda kv: int(kv[0])):
        rows = [("direct", entry["direct"])] + list(entry["paths"].items())
        for name, r in rows:
            if r.get("unavailable"):
                print(f"{entry['label']:6} {name:24} unavailable: {r['unavailable'][:80]}")
                continue
            rss, load = r.get("rss_mib") or {}, r.get("load") or {}
            cells = [entry["label"], name, fmt(r["latency_ms"]["p50"]["median"], ".3f"),
                     fmt(r["latency_ms"]["p99"]["median"], ".3f"),
                     fmt(r.get("p50_added_ms_vs_direct"), "+.3f"),
                     fmt(r.get("p99_added_ms_vs_direct"), "+.3f"), fmt(load.get("rps"), ".0f"),
                     fmt(load.get("cpu_us_per_call"), ".0f"),
                     fmt(load.get("tool_and_store_cpu_us_per_call"), ".0f"),
                     fmt(rss.get("idle"), ".1f"),
                     fmt(rss.get("peak"), ".1f"), fmt(rss.get("peak_above_idle"), "+.1f"),
                     str(r["failed"])]
            print(" ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, (_, w)) in
                           enumerate(zip(cells, cols, strict=True))))


def size_json_merge(path, key, entries):
    """Sets `entries` in the object `key` of the JSON object in `path` (a new file when it is
    missing), keeping the rest: each callgrind sweep owns its path's entry of size.json's
    `callgrind`, and the size leg the rest of the file. Returns the object now under `key`."""
    doc = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    doc.setdefault(key, {}).update(entries)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return doc[key]


# Self costs named like these are SHA-256's block function (ring's assembly), reported apart:
# under valgrind it runs the AVX code, since valgrind's CPU has no SHA extensions.
SHA256_FN = re.compile(r"sha256_block_data_order")


# Copies, whose callers size_growth lists; a copy made by the allocator (a buffer grown by
# reallocation) is put on the first caller outside the allocator's and Vec's frames.
COPY_FNS = re.compile(r"^__mem(cpy|move)_|^memcpy$|^memmove$")
ALLOC_FRAMES = re.compile(r"^_?mi_|^alloc::raw_vec::|^__rust_realloc$|^__rdl_realloc$|^realloc$")


def size_growth(a, b, span):
    """What grows from point `a` to point `b` (callgrind_sizes' figures per call, `span` bytes
    of answer apart), in instructions per byte of answer, highest first: self and inclusive
    costs by function, and the copies by the function that made them (`via`: the allocator's
    frames in between, when a buffer grew by reallocation) with that function's main caller."""
    def per_byte(ka, kb):
        rows = sorted(((kb.get(f, 0) - ka.get(f, 0)) / span, f) for f in set(ka) | set(kb))
        return [(x, f) for x, f in reversed(rows) if x >= 0.01]

    grow = {kind: [{"function": f, "instructions_per_byte": x,
                    f"at_{a['label']}": a[f"_{kind}"].get(f, 0),
                    f"at_{b['label']}": b[f"_{kind}"].get(f, 0)}
                   for x, f in per_byte(a[f"_{kind}"], b[f"_{kind}"])]
            for kind in ("self", "inclusive")}
    ca, cb = a["_calls"], b["_calls"]

    def callers(fn):
        """fn's callers and the growth of their calls to it, per byte, growing ones only."""
        edges = [(c, (cb[(c, t)] - ca.get((c, t), 0)) / span) for c, t in cb
                 if t == fn and c != fn]
        return [(c, g) for c, g in edges if g > 0]

    def outside_allocator(fn, x, via, depth=0):
        """x spread over fn's callers by their share, up through the allocator's frames."""
        edges = callers(fn)
        total = sum(g for _, g in edges)
        out = {}
        for c, g in edges:
            share = x * g / total
            if ALLOC_FRAMES.search(c) and depth < 10:
                for k, v in outside_allocator(c, share, c, depth + 1).items():
                    out[k] = out.get(k, 0) + v
            else:
                out[(c, via)] = out.get((c, via), 0) + share
        return out

    copies = {}
    for (c, to), _ in list(cb.items()):
        if not COPY_FNS.search(to or "") or c == to:
            continue
        g = (cb[(c, to)] - ca.get((c, to), 0)) / span
        if g <= 0:
            continue
        found = outside_allocator(c, g, c, 1) if ALLOC_FRAMES.search(c) else {(c, None): g}
        for k, v in found.items():
            copies[k] = copies.get(k, 0) + v
    grow["copies"] = []
    for (c, via), x in sorted(copies.items(), key=lambda kv: -kv[1]):
        if x < 0.01:
            continue
        up = max(callers(c), key=lambda e: e[1], default=(None, 0))[0]
        grow["copies"].append({"function": c, "via": via, "called_from": up,
                               "instructions_per_byte": x})
    return grow


def callgrind_sizes(args, procs, spec, redis, log):
    """--callgrind PATH --result-bytes SIZES: the path's instructions per call at each answer
    size (a fake tool and a toolgate under callgrind of their own per size; `--calls` measured
    calls each, by default 2000 at 1 KiB and fewer for larger answers), the instructions per KiB,
    the slope in instructions per byte between consecutive sizes, and the functions whose self
    and inclusive costs grow between the two largest sizes, per byte. Each size's profile goes to
    bench/results/callgrind-size-PATH-SIZE.out and its summary to the .txt beside it; the figures
    go to the `callgrind` object of bench/results/size.json (`--out`), under the path's name."""
    name = spec["name"]
    sizes = args.result_bytes
    points = []
    for size in sizes:
        label = size_label(size)
        n = args.calls or max(50, min(2000, 2000 * 1024 // size))
        warm = args.warmup_calls or max(10, min(200, n // 5))
        tool = start_tool(procs, args.tool, size, name=f"fake_tool-{label}")
        try:
            body = body_size(tool["url"])
            keep = os.path.join(BENCH_DIR, "results", f"callgrind-size-{name}-{label}.out")
            bad = callgrind_calls(args, procs, spec, tool, redis, keep, warm, n, log, sized=True,
                                  label=label)
        finally:
            stop_spawned(procs, tool["pid"])
        total, rows = callgrind_inclusive(keep)
        self_costs, inclusive, calls = callgrind_costs(keep)
        sha = sum(v for k, v in self_costs.items() if SHA256_FN.search(k))
        lines = [f"callgrind, {name}, answers of {body} bytes ({label}): {n} calls, "
                 f"{total / n:,.0f} instructions per call in toolgate (user space), "
                 f"{total / n / (body / 1024):,.0f} per KiB of answer, {bad} not READY; "
                 f"SHA-256 blocks {sha / n:,.0f} a call",
                 f"top inclusive costs per call (file:function); the whole file: "
                 f"{os.path.relpath(keep, REPO_ROOT)}",
                 *callgrind_top(rows, total, n, args.top)]
        with open(keep.removesuffix(".out") + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        print()
        print("\n".join(lines))
        points.append({"label": label, "result_bytes": size, "body_bytes": body, "calls": n,
                       "warmup_calls": warm, "not_ready": bad,
                       "instructions_per_call": total / n,
                       "instructions_per_kib": total / n / (body / 1024),
                       "sha256_instructions_per_call": sha / n,
                       "profile": os.path.relpath(keep, REPO_ROOT),
                       "_self": {k: v / n for k, v in self_costs.items()},
                       "_inclusive": {k: v / n for k, v in inclusive.items()},
                       "_calls": {k: v / n for k, v in calls.items()}})
    result = {"commit": machine_info()["toolgate_commit"], "sizes": {}, "slopes": []}
    for a, b in zip(points, points[1:], strict=False):
        result["slopes"].append({
            "between": f"{a['label']} and {b['label']}",
            "instructions_per_byte": slope((a["body_bytes"], a["instructions_per_call"]),
                                           (b["body_bytes"], b["instructions_per_call"])),
            "sha256_instructions_per_byte": slope(
                (a["body_bytes"], a["sha256_instructions_per_call"]),
                (b["body_bytes"], b["sha256_instructions_per_call"]))})
    print()
    print(f"callgrind, {name}, by answer size (instructions per call, per KiB of answer):")
    for p in points:
        print(f"  {p['label']:>5} {p['body_bytes']:>9} bytes  {p['instructions_per_call']:>14,.0f} "
              f"a call  {p['instructions_per_kib']:>10,.0f} a KiB  (SHA-256 "
              f"{p['sha256_instructions_per_call']:,.0f} a call)")
    for s in result["slopes"]:
        print(f"  slope {s['between']}: {s['instructions_per_byte']:.2f} instructions per byte "
              f"(SHA-256 blocks {s['sha256_instructions_per_byte']:.2f} of them)")
    if len(points) >= 2:
        a, b = points[-2], points[-1]
        span = b["body_bytes"] - a["body_bytes"]
        result["slope_between"] = f"{a['label']} and {b['label']}"
        result["slope_instructions_per_byte"] = result["slopes"][-1]["instructions_per_byte"]
        grow = size_growth(a, b, span)
        result["growth"] = grow
        print(f"\nwhat grows with the answer, {a['label']} to {b['label']}, in instructions per byte "
              f"of answer:")
        print("  self costs (the function's own instructions):")
        for g in grow["self"][:args.top]:
            print(f"    {g['instructions_per_byte']:7.3f}  {g['function'][:130]}")
        print("  inclusive costs of toolgate's functions (with what they call):")
        for g in [g for g in grow["inclusive"] if "toolgate::" in g["function"]][:args.top]:
            print(f"    {g['instructions_per_byte']:7.3f}  {g['function'][:130]}")
        print("  copies (memcpy), by the function that made them (under valgrind a copy of "
              "more than a few KiB counts one instruction a byte):")
        for g in grow["copies"][:args.top]:
            via = " by reallocation (a buffer grown)" if g["via"] else ""
            print(f"    {g['instructions_per_byte']:7.3f}  {g['function'][:80]}{via}, called from "
                  f"{(g['called_from'] or '-')[:80]}")
    for p in points:
        result["sizes"][str(p["result_bytes"])] = {k: v for k, v in p.items()
                                                   if not k.startswith("_")}
    out = args.out or os.path.join(BENCH_DIR, "results", "size.json")
    cg = size_json_merge(out, "callgrind", {name: result})
    for t in size_targets(None, cg):
        if t["target"].startswith("memory") and name == "toolgate-memory":
            print_targets([t])
    print(f"\nwritten: {out} (callgrind.{name})")
    return 1 if any(p["not_ready"] for p in points) else 0


# ----------------------------------------------------------------------------------------------
# The Redis side of a call, in instructions.

LUA_DIR = os.path.join(REPO_ROOT, "src", "store", "redis", "lua")


class Resp:
    """A minimal binary-safe RESP2 client, one command at a time (DUMP and RESTORE carry bytes
    that redis-cli's text mode would mangle)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.buf = b""

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise Failure("Redis closed the connection")
        self.buf += data

    def _reply(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise Failure(f"Redis: {rest.decode(errors='replace')}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise Failure(f"unexpected Redis reply {line[:40]!r}")


MONITOR_LINE = re.compile(rb"^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$")
MONITOR_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
MONITOR_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)")
ESCAPED = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def monitor_command(line):
    """The client and the arguments (bytes) of one `MONITOR` line, or None. Each argument is
    quoted there and escaped as Redis escapes it (`\\"`, `\\\\`, `\\n`, …, `\\xHH`)."""
    m = MONITOR_LINE.match(line.rstrip(b"\n"))
    if not m:
        return None

    def unescape(e):
        e = e.group(1)
        return bytes([int(e[1:], 16)]) if len(e) == 3 else ESCAPED.get(e, e)

    return m.group(1), [MONITOR_ESCAPE.sub(unescape, a) for a in MONITOR_ARG.findall(m.group(2))]


def callgrind_self_costs(path):
    """Instructions by function (self cost) in a callgrind file, and the total."""
    costs, _, _ = callgrind_costs(path)
    return costs, sum(costs.values())


def callgrind_costs(path):
    """A callgrind file's costs by function name (the parts of a function inlined from other
    files counted together): self costs, inclusive costs (self plus every call it makes but to
    itself), and the cost of each (caller, callee) pair of calls."""
    names, costs, calls = {}, {}, {}
    fn, callee, after_call = None, None, False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(2):
                    names[m.group(1)] = m.group(2)
                name = names.get(m.group(1)) if m else line.split("=", 1)[1].strip()
                if line.startswith("fn="):
                    fn = name
                else:
                    callee = name
            elif line.startswith("calls="):
                after_call = True  # the next cost line is the call's inclusive cost
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) < 2 or fn is None:
                    after_call = False
                elif after_call:
                    after_call = False
                    calls[(fn, callee)] = calls.get((fn, callee), 0) + int(parts[1])
                else:
                    costs[fn] = costs.get(fn, 0) + int(parts[1])
    inclusive = dict(costs)
    for (caller, to), ir in calls.items():
        if caller != to:
            inclusive[caller] = inclusive.get(caller, 0) + ir
    return costs, inclusive, calls


def callgrind_redis(args, procs, started):
    """Counts what the Redis primary spends on a tool call's two scripts. toolgate makes
    `--calls` sequential calls on the Redis Cluster store while MONITOR records the commands the
    run's primary receives; those (reserve and finalize, with their real keys and records) are
    replayed against a standalone redis-server under callgrind, with one replica attached, that
    holds the run's hash (DUMP and RESTORE) and the scripts of src/store/redis/lua/."""
    def log(msg):
        print(f"[{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    tool = start_tool(procs, args.tool)
    redis = start_redis(procs, args.workdir, args.redis_cluster)
    spec = next(p for p in PATHS if p["name"] == "toolgate-redis-primary")
    tg, why = start_toolgate(procs, args.workdir, spec["name"], args.toolgate, tool["url"],
                             spec["store"], redis["ports"], args, spec["front"])
    if tg is None:
        raise Failure(f"{spec['name']} did not start: {why}")
    bad = sequential_calls(tg, 50, "crw")  # the scripts are loaded, the connections open
    primary = redis["ports"][slot_roles(redis, tg["run_id"]).index("primary")]
    capture = os.path.join(args.workdir, "monitor-replay.txt")
    n = args.calls or 2000
    log(f"{n} calls on {spec['name']}, recorded by MONITOR on the run's primary ({primary})")
    monitors = [start_monitor(primary, capture)]
    try:
        bad += sequential_calls(tg, n, "crm")
        time.sleep(0.5)  # anything still in flight lands in the stream
    finally:
        stop_monitors(monitors)
    if bad:
        raise Failure(f"{bad} of the recorded calls were not READY")
    run_key = f"toolgate:{{{tg['run_id']}}}:run"
    source = Resp(primary)
    run_dump, run_pttl = source.call("DUMP", run_key), source.call("PTTL", run_key)

    scripts = {}
    with open(capture, "rb") as f:
        commands = [c[1] for c in map(monitor_command, f)
                    if c and c[0] != b"lua" and c[1] and c[1][0].upper() == b"EVALSHA"]
    port, replica_port = free_ports(2)
    out_prefix = "callgrind-redis.out"
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", args.workdir,
              "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
    node = procs.spawn("redis-callgrind", [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={args.workdir}/{out_prefix}",
        "redis-server", "--port", str(port), "--dbfilename", "callgrind.rdb", *common])
    wait_tcp(port, node, "redis-server under callgrind", timeout=120)
    replica = procs.spawn("redis-replica", [
        "redis-server", "--port", str(replica_port), "--dbfilename", "replica.rdb",
        "--replicaof", "127.0.0.1", str(port), *common])
    wait_tcp(replica_port, replica, "the replica")
    target = Resp(port)
    deadline = time.time() + 120
    while b"master_link_status:up" not in Resp(replica_port).call("INFO", "replication"):
        if time.time() > deadline:
            raise Failure("the replica did not attach to the node under callgrind")
        time.sleep(0.5)
    target.call("RESTORE", run_key, max(run_pttl, 0), run_dump)
    for name in sorted(os.listdir(LUA_DIR)):
        with open(os.path.join(LUA_DIR, name), "rb") as f:
            scripts[target.call("SCRIPT", "LOAD", f.read()).decode()] = name.removesuffix(".lua")
    by_script = {}
    for c in commands:
        sha = c[1].decode()
        if sha not in scripts:
            raise Failure(f"EVALSHA {sha} is none of {LUA_DIR}: toolgate built from other sources?")
        by_script.setdefault(scripts[sha], []).append(c)
    reserves, finalizes = by_script.get("reserve", []), by_script.get("finalize", [])
    if len(reserves) != n or len(finalizes) != n or len(by_script) != 2:
        raise Failure(f"recorded {len(reserves)} reserve and {len(finalizes)} finalize scripts "
                      f"({sorted(by_script)}) for {n} calls")
    for c in finalizes:
        # ARGV[1] is the record and ARGV[2] its size in bytes, as toolgate counted them: a check
        # that MONITOR's escaping was undone byte for byte.
        keys = int(c[2])
        if len(c[3 + keys]) != int(c[4 + keys]):
            raise Failure(f"a recorded finalize's record decodes to {len(c[3 + keys])} bytes, "
                          f"not the {int(c[4 + keys])} toolgate sent")
    warm = n // 5

    def replay(batch):
        codes = [target.call(*c) for c in batch]
        refused = [x for x in codes if x != 0]
        if refused:
            raise Failure(f"{len(refused)} of {len(batch)} replayed scripts returned "
                          f"{sorted(set(refused))}, not 0")

    replay([c for pair in zip(reserves[:warm], finalizes[:warm], strict=True) for c in pair])
    subprocess.run(["callgrind_control", "--zero", str(node.pid)], check=True,
                   capture_output=True)
    measured = n - warm
    log(f"replaying {warm} calls' scripts as warm-up, then {measured} reserve and {measured} "
        "finalize scripts measured")
    replay(reserves[warm:])
    dumps = [callgrind_dump(node.pid, args.workdir, out_prefix)]
    replay(finalizes[warm:])
    dumps.append(callgrind_dump(node.pid, args.workdir, out_prefix))
    keep = [os.path.join(BENCH_DIR, "results", f"callgrind-{REDIS_NODE}-{script}.out")
            for script in ("reserve", "finalize")]
    for dump, path in zip(dumps, keep, strict=True):
        shutil.copyfile(dump, path)
    costs, totals = {}, []
    for d in dumps:
        c, t = callgrind_self_costs(d)
        totals.append(t)
        for k, v in c.items():
            costs[k] = costs.get(k, 0) + v
    version = redis_cli(port, "info", "server")
    version = re.search(r"redis_version:(\S+)", version).group(1)
    print()
    print(f"callgrind, the Redis primary (redis-server {version}, one replica attached): "
          f"{measured} calls' scripts, instructions per call: reserve {totals[0] / measured:,.0f}, "
          f"finalize {totals[1] / measured:,.0f}, both {sum(totals) / measured:,.0f}")
    print(f"top self costs per call, both scripts (a bare address: a function without a symbol "
          f"in this build); the profiles: "
          f"{', '.join(os.path.relpath(k, REPO_ROOT) for k in keep)}")
    for fn, ir in sorted(costs.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {ir / measured:10,.0f}  {ir / sum(totals):6.1%}  {fn[:120]}")
    return 0


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rotate(xs, k):
    if not xs:
        return []
    k %= len(xs)
    return xs[k:] + xs[:k]


# ----------------------------------------------------------------------------------------------
# Report.

def machine_info():
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def version(argv):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None

    try:
        r = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        commit = r.stdout.strip() if r.returncode == 0 else None
    except OSError:
        commit = None
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu": model,
        "kernel": platform.release(),
        "nginx": version([os.environ.get("NGINX", "nginx"), "-v"]),
        "wrk": version(["wrk", "-v"]),
        "redis": version(["redis-server", "--version"]),
        "toolgate_commit": commit,
    }


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def print_table(report):
    cols = [("path", 24), ("req/s", 9), ("/direct", 8), ("/nginx", 7), ("p50 ms", 7),
            ("p99 ms", 7), ("+p99 ms", 8), ("RSS idle", 9), ("RSS load", 9), ("CPU s/10k", 10),
            ("CPU us", 7), ("/nginx CPU", 10), ("others us", 9), ("RT/call", 8), ("failed", 7)]
    head = " ".join(n.ljust(w) if i == 0 else n.rjust(w) for i, (n, w) in enumerate(cols))
    print(head)
    print("-" * len(head))
    for name, r in report["paths"].items():
        if r.get("unavailable"):
            print(f"{name.ljust(24)} unavailable: {r['unavailable'][:95]}")
            continue
        ratios = r["ratios"]
        rss = r.get("rss_mib") or {}
        store = r.get("store") or {}
        cells = [
            name,
            fmt(r["throughput_rps"]["median"], ".0f"),
            fmt(ratios.get("throughput_vs_direct"), ".2f"),
            fmt(ratios.get("throughput_vs_nginx"), ".2f"),
            fmt(r["latency_ms"]["p50"]["median"], ".3f"),
            fmt(r["latency_ms"]["p99"]["median"], ".3f"),
            fmt(ratios.get("p99_added_ms_vs_direct"), "+.3f"),
            fmt(rss.get("idle"), ".1f"),
            fmt(rss.get("load"), ".1f"),
            fmt(r.get("cpu_s_per_10k_calls"), ".2f"),
            fmt(r.get("proxy_cpu_us_per_call"), ".1f"),
            fmt(ratios.get("cpu_vs_nginx"), ".2f"),
            fmt(r.get("tool_and_store_cpu_us_per_call"), ".1f"),
            fmt(store.get("round_trips_per_call"), ".2f"),
            str(r["requests"]["failed"]),
        ]
        print(" ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, (_, w)) in
                       enumerate(zip(cells, cols, strict=True))))


def print_cluster(report):
    """Below the table, for each Redis path: the cluster's CPU per call by node, and its own
    pauses in each latency round."""
    rows = [(n, r["cluster_stalls_ms"]["latency"]) for n, r in report["paths"].items()
            if r.get("cluster_stalls_ms")]
    if not rows:
        return
    print("\nthe Redis Cluster's CPU per call over the throughput phase (us), by node: the run's "
          "slot's primary, its replica, the other four nodes:")
    for name, _ in rows:
        c = report["paths"][name]["store_cpu_us_per_call"]
        print(f"  {name:24} primary {fmt(c['primary'], '.1f')}, replica {fmt(c['replica'], '.1f')}"
              f", others {fmt(c['other_nodes'], '.1f')}")
    print("\nthe Redis Cluster's own pauses in each latency round (LATENCY LATEST, the longest "
          "of each kind on any node, ms; none: no pause of 1 ms or more):")
    for name, rounds in rows:
        cells = [", ".join(f"{k} {v}" for k, v in r.items()) or "none" for r in rounds]
        print(f"  {name:24} " + " | ".join(cells))


def print_sched(report):
    """Below the table, with --sched-waits: what `perf sched` saw in each latency round."""
    rows = [(n, r["sched_waits"]) for n, r in report["paths"].items() if r.get("sched_waits")]
    if not rows:
        return
    print("\nthe machine in each latency round (perf sched; runs: times a process was given a "
          "CPU; waits: a woken process waiting longer than that for its CPU):")
    for name, rounds in rows:
        for i, w in enumerate(rounds):
            print(f"  {name if i == 0 else '':24} {sched_text(w)}")


def mcp_vs_invoke(report):
    """The MCP path next to the same call on /v1/invoke (memory store), or None without both."""
    mcp, inv = report["paths"].get(MCP_PATH), report["paths"].get(INVOKE_PATH)
    if not mcp or not inv or mcp.get("unavailable") or inv.get("unavailable"):
        return None

    def figures(name, e):
        return {"path": name, "endpoint": e["endpoint"],
                "throughput_rps": e["throughput_rps"]["median"],
                "p50_ms": e["latency_ms"]["p50"]["median"],
                "p99_ms": e["latency_ms"]["p99"]["median"]}

    return {"mcp": figures(MCP_PATH, mcp), "invoke": figures(INVOKE_PATH, inv),
            "throughput_ratio": mcp["ratios"].get("throughput_vs_invoke"),
            "p99_added_ms": mcp["ratios"].get("p99_added_ms_vs_invoke")}


def print_mcp_vs_invoke(c):
    if not c:
        return
    m, i = c["mcp"], c["invoke"]
    print()
    print(f"MCP tools/call vs /v1/invoke, memory store ({m['path']} vs {i['path']}; the ratio "
          f"and the difference paired per round):")
    print(f"  throughput {fmt(m['throughput_rps'], '.0f')} vs {fmt(i['throughput_rps'], '.0f')} "
          f"req/s (x{fmt(c['throughput_ratio'], '.2f')}); p99 {fmt(m['p99_ms'], '.3f')} vs "
          f"{fmt(i['p99_ms'], '.3f')} ms ({fmt(c['p99_added_ms'], '+.3f')} ms)")


def targets(report):
    out = []
    p = report["paths"].get("toolgate-redis-primary", {})
    rep = report["paths"].get("toolgate-redis-replica", {})

    def add(name, target, measured, ok):
        out.append({"target": name, "goal": target, "measured": measured,
                    "met": None if measured is None else ok})

    mem = report["paths"].get("toolgate-memory", {})
    if mem and not mem.get("unavailable"):
        r = mem["ratios"]
        t = r.get("throughput_vs_nginx")
        add("memory throughput vs nginx", ">= 0.6", t, t is not None and t >= 0.6)
        a = r.get("p99_added_ms_vs_direct")
        add("memory added p99 vs direct, 4 connections (ms)", "<= 0.5", a,
            a is not None and a <= 0.5)
        c = r.get("cpu_vs_nginx")
        add("memory toolgate CPU per call vs nginx's", "<= 2.5", c, c is not None and c <= 2.5)
    live = report.get("live_records")
    if live:
        m = live["p99_ms"]["median"]
        add(f"memory p99 with {live['records']:,} live records, 4 connections (ms)", "<= 2", m,
            m is not None and m <= 2)
    if p and not p.get("unavailable"):
        r = p["ratios"]
        t = r.get("throughput_vs_nginx")
        add("redis primary throughput vs nginx", ">= 0.4", t, t is not None and t >= 0.4)
        a = r.get("p99_added_ms_vs_direct")
        add("redis primary added p99 vs direct, 4 connections (ms)", "<= 1.0", a,
            a is not None and a <= 1.0)
        c = r.get("cpu_vs_nginx")
        add("redis primary toolgate CPU per call vs nginx's", "<= 2.5", c,
            c is not None and c <= 2.5)
        rt = (p.get("store") or {}).get("round_trips_per_call")
        add("redis primary store round trips per call", "2", rt,
            rt is not None and abs(rt - 2) < 0.05)
        rss = p.get("rss_mib") or {}
        add("redis primary RSS idle (MiB)", "<= 30", rss.get("idle"),
            rss.get("idle") is not None and rss["idle"] <= 30)
        add("redis primary RSS under 32-connection load (MiB)", "<= 60", rss.get("load"),
            rss.get("load") is not None and rss["load"] <= 60)
    elif report["paths"]:
        out.append({"target": "Redis Cluster targets", "goal": "measured",
                    "measured": "path unavailable", "met": None})
    if rep and not rep.get("unavailable"):
        rt = (rep.get("store") or {}).get("round_trips_per_call")
        add("redis replica store round trips per call", "3", rt,
            rt is not None and abs(rt - 3) < 0.05)
    failed = report["failed_requests"]
    add("failed or non-READY responses", "0", failed, failed == 0)
    return out


def print_targets(ts):
    print()
    print("targets:")
    for t in ts:
        mark = {True: "met ", False: "MISS", None: "n/a "}[t["met"]]
        m = t["measured"]
        m = f"{m:.3f}" if isinstance(m, float) else str(m)
        print(f"  [{mark}] {t['target']}: goal {t['goal']}, measured {m}")


# ----------------------------------------------------------------------------------------------
# Main.

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--toolgate", required=True, help="toolgate binary")
    ap.add_argument("--tool", required=True, help="fake_tool binary (examples/fake_tool.rs)")
    ap.add_argument("--workdir", required=True, help="scratch directory (logs, configs)")
    ap.add_argument("--redis-cluster", required=True,
                    help="redis_cluster binary (examples/redis_cluster.rs)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", help="JSON output (default bench/results/latest.json, "
                    "quick: bench/results/quick.json, --sched-waits: bench/results/sched.json)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--throughput-seconds", type=int)
    ap.add_argument("--latency-seconds", type=int)
    ap.add_argument("--warmup-seconds", type=int)
    ap.add_argument("--rt-calls", type=int, help="sequential calls for the round-trip count")
    ap.add_argument("--paths", help="comma-separated subset of: " +
                    ",".join(p["name"] for p in PATHS))
    ap.add_argument("--allow-unavailable", action="store_true",
                    help="a toolgate path that cannot start is reported, not fatal")
    ap.add_argument("--latency-pace-ms", type=int, default=1,
                    help="latency phase: wait between a response and the connection's next "
                    "request (0: closed loop at full speed)")
    ap.add_argument("--callgrind", metavar="PATH",
                    help="instead of the benchmark: count toolgate's instructions per call on "
                    "this toolgate path under valgrind's callgrind; or, with "
                    f"{REDIS_NODE}, the Redis primary's for the scripts of a call")
    ap.add_argument("--calls", type=int,
                    help="--callgrind: measured calls (default 2000; with --result-bytes, 2000 at "
                    "1 KiB and fewer for larger answers, at least 50)")
    ap.add_argument("--warmup-calls", type=int,
                    help="--callgrind: calls before the counters are zeroed (default 200; with "
                    "--result-bytes, a fifth of the measured calls, 10 to 200)")
    ap.add_argument("--result-bytes", metavar="SIZES",
                    help="answer sizes of the size leg, comma-separated, k for KiB and m for "
                    "MiB (default 1k,64k,1m; --quick: 64k; 0 skips the leg); with --callgrind, "
                    "count instructions at each of these sizes instead of the 1 KiB answer")
    ap.add_argument("--top", type=int, default=40, help="--callgrind: rows to print")
    ap.add_argument("--toolgate-env", action="append", metavar="KEY=VALUE",
                    help="extra environment for every toolgate, for experiments "
                    "(e.g. TOOLGATE_LOG=warn, LD_PRELOAD=...); recorded in the JSON")
    ap.add_argument("--record-ttl-ms", type=int, default=60_000)
    ap.add_argument("--redis-hz", type=int,
                    help="the Redis nodes' hz (background task rate; Redis's default, 10, "
                    "unless given), for experiments; recorded in the JSON")
    ap.add_argument("--live-records", type=int,
                    help="memory store: the live records of the latency phase that holds them "
                    "(default 1000000, 0 in a quick run; 0 skips it)")
    ap.add_argument("--run-timeout-ms", type=int, default=6 * 3600 * 1000)
    ap.add_argument("--evidence-requests", type=int,
                    help="signed evidence: timed requests of GET …/evidence, and as many of "
                    f"GET …/facts, on a run of {EVIDENCE_FACTS} facts, per store (default 1000, "
                    "0 in a quick run; 0 skips it)")
    ap.add_argument("--only", choices=["evidence", "size"],
                    help="evidence: only the signed evidence leg, on the stores of --paths' "
                    f"{' and '.join(EVIDENCE_PATHS)} (default both); writes "
                    "bench/results/evidence.json unless --out. size: only the answer-size leg, "
                    f"on the stores of --paths' {' and '.join(SIZE_PATHS)} (default both); "
                    "writes bench/results/size.json unless --out")
    ap.add_argument("--sched-waits", action="store_true",
                    help="record every latency leg with `perf sched` (needs perf and root) and "
                    "report how busy the CPUs were and how often a woken process waited for "
                    "one; the recording slows the legs it watches, so it explains a tail rather "
                    "than measuring one")
    args = ap.parse_args()
    if args.sched_waits and not shutil.which("perf"):
        raise SystemExit("--sched-waits needs perf: apt-get install linux-perf")

    quick = args.quick
    rounds = args.rounds or (1 if quick else 3)
    tput_s = args.throughput_seconds or (2 if quick else 10)
    lat_s = args.latency_seconds or (2 if quick else 5)
    warm_s = args.warmup_seconds or (1 if quick else 3)
    rt_calls = args.rt_calls or (200 if quick else 2000)
    if args.live_records is None:
        args.live_records = 0 if quick else 1_000_000
    if args.evidence_requests is None:
        args.evidence_requests = 0 if quick else 1000
    if args.only == "evidence" and args.evidence_requests <= 0:
        raise SystemExit("--only evidence measures nothing with --evidence-requests 0 "
                         "(the default with --quick)")
    try:
        args.result_bytes = parse_sizes(args.result_bytes) if args.result_bytes is not None \
            else None
    except Failure as e:
        raise SystemExit(str(e)) from None
    if args.callgrind and args.callgrind != REDIS_NODE and args.result_bytes == []:
        raise SystemExit("--callgrind --result-bytes needs at least one size")
    if args.result_bytes is None and not args.callgrind:
        args.result_bytes = list(QUICK_SIZES if quick else SIZES)
    if args.only == "size" and not args.result_bytes:
        raise SystemExit("--only size measures nothing with --result-bytes 0")
    # A run watched by perf sched is slowed by it, and a run of one leg is no full run: neither
    # replaces the committed full run.
    default_out = ("evidence.json" if args.only == "evidence" else "size.json"
                   if args.only == "size" else "quick.json" if quick
                   else "sched.json" if args.sched_waits else "latest.json")
    out_path = args.out or os.path.join(BENCH_DIR, "results", default_out)
    wanted = [p["name"] for p in PATHS]
    if args.paths:
        wanted = [n.strip() for n in args.paths.split(",") if n.strip()]
        unknown = set(wanted) - {p["name"] for p in PATHS}
        if unknown:
            raise Failure(f"unknown path(s): {', '.join(sorted(unknown))}")

    started = time.time()
    procs = Procs(args.workdir)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        if args.callgrind == REDIS_NODE:
            return callgrind_redis(args, procs, started)
        if args.callgrind:
            return callgrind(args, procs, started)
        return run(args, procs, quick, rounds, tput_s, lat_s, warm_s, rt_calls, out_path, wanted,
                   started)
    finally:
        procs.stop_all()


def run(args, procs, quick, rounds, tput_s, lat_s, warm_s, rt_calls, out_path, wanted, started):
    workdir = args.workdir
    def log(msg):
        print(f"[{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)


    # The signed evidence leg's and the size leg's stores; with --only, none of the paths' own
    # phases and not the other leg.
    ev_paths = [n for n in EVIDENCE_PATHS if n in wanted] if args.evidence_requests > 0 else []
    size_paths = [n for n in SIZE_PATHS if n in wanted] if args.result_bytes else []
    if args.only == "evidence":
        if not ev_paths:
            raise Failure(f"--only evidence: --paths names none of {', '.join(EVIDENCE_PATHS)}")
        wanted, size_paths = [], []
    if args.only == "size":
        if not size_paths:
            raise Failure(f"--only size: --paths names none of {', '.join(SIZE_PATHS)}")
        wanted, ev_paths = [], []

    tool = start_tool(procs, args.tool)
    log(f"fake_tool on {tool['url']}")
    paths = {}
    unavailable = {}
    if "direct" in wanted:
        paths["direct"] = {"name": "direct", "url": tool["url"], "cpu_pids": [],
                           "rss_pids": [], "extra_cpu_pids": [tool["pid"]]}
    if "nginx" in wanted:
        ng = start_nginx(procs, workdir, tool["port"])
        ng.update(name="nginx", extra_cpu_pids=[tool["pid"]])
        paths["nginx"] = ng
        log(f"nginx on {ng['url']} ({ng['workers']} worker processes)")
    redis = None
    need_redis = any(p["store"] in ("primary", "replica") and p["name"] in wanted for p in PATHS) \
        or "toolgate-redis-primary" in ev_paths or "toolgate-redis-primary" in size_paths
    if need_redis:
        redis = start_redis(procs, workdir, args.redis_cluster, args.redis_hz)
        log(f"Redis Cluster on 127.0.0.1:{redis['ports'][0]}..{redis['ports'][-1]}, "
            f"primaries {redis['primaries']}, hz {redis['hz']}")
    redis_cpu_pids = redis["pids"] if redis else []
    sink = OtlpSink() if any(p.get("otel") and p["name"] in wanted for p in PATHS) else None
    if sink:
        log(f"OTLP/HTTP sink on {sink.endpoint}")
    for spec in PATHS:
        if spec["store"] is None or spec["name"] not in wanted:
            continue
        tg, why = start_toolgate(procs, workdir, spec["name"], args.toolgate, tool["url"],
                                 spec["store"], redis["ports"] if redis else [], args,
                                 spec["front"],
                                 otel_endpoint=sink.endpoint if spec.get("otel") else None)
        if tg is None:
            log(f"{spec['name']}: UNAVAILABLE: {why}")
            unavailable[spec["name"]] = why
            continue
        extra = [tool["pid"]] + (redis_cpu_pids if spec["store"] != "memory" else [])
        tg.update(name=spec["name"], workdir=workdir, extra_cpu_pids=extra, store=spec["store"])
        if spec["store"] != "memory":
            tg["redis_pids"] = redis_cpu_pids
        paths[spec["name"]] = tg
        log(f"{spec['name']} on {tg['url']} (run {tg['run_id']})")
    if unavailable and not args.allow_unavailable:
        raise Failure("paths unavailable: " + "; ".join(f"{k}: {v}" for k, v in
                                                        unavailable.items()))

    names = [n for n in wanted if n in paths]
    rss_idle = {n: sum(rss_mib(pid)[0] for pid in paths[n]["rss_pids"])
                for n in names if paths[n]["rss_pids"]}

    legs = {n: {"warmup": [], "throughput": [], "latency": []} for n in names}
    rss_load = {}
    leg_no = 0

    def run_leg(phase, name, threads, conns, seconds, pace_ms=0):
        nonlocal leg_no
        leg_no += 1
        on_redis = paths[name].get("store") in ("primary", "replica")
        if on_redis:
            reset_stalls(redis["ports"])
        sched_file = (os.path.join(workdir, f"sched-{leg_no}.data")
                      if args.sched_waits and phase == "latency" else None)
        r = leg(paths[name], threads, conns, seconds, f"{phase[0]}{leg_no}", pace_ms, sched_file)
        if on_redis:
            r["cluster_stalls_ms"] = cluster_stalls(redis["ports"])
        legs[name][phase].append(r)
        bad = failed_of(r)
        log(f"{phase:10} {name:24} {r['rps']:9.0f} req/s  p50 {r['latency_us']['p50'] / 1000:.3f} ms"
            f"  p99 {r['latency_us']['p99'] / 1000:.3f} ms  statuses {r['statuses']}"
            + (f"  FAILED {bad}" if bad else "")
            + (f"  cluster stalls (ms) {r['cluster_stalls_ms']}" if on_redis else "")
            + (f"  sched: {sched_text(r['sched_waits'])}" if sched_file else ""))
        return r

    for n in names:
        run_leg("warmup", n, 2, 32, warm_s)
    for rnd in range(rounds):
        for n in rotate(names, rnd):
            run_leg("throughput", n, 2, 32, tput_s)
            if paths[n]["rss_pids"]:
                rss_load[n] = (sum(rss_mib(pid)[0] for pid in paths[n]["rss_pids"]),
                               sum(rss_mib(pid)[1] for pid in paths[n]["rss_pids"]))
    for rnd in range(rounds):
        for n in rotate(names, rnd):
            run_leg("latency", n, 1, 4, lat_s, args.latency_pace_ms)

    store = {}
    for n in names:
        if paths[n].get("store") in ("primary", "replica"):
            store[n] = round_trips(paths[n], redis, max(3, 2 + rt_calls // 500), rt_calls)
            s = store[n]
            log(f"round trips {n}: {s['round_trips_per_call']:.3f} per call over "
                f"{s['finalized_calls']} calls {s['round_trips_by_command']}; Redis commands incl. "
                f"inside scripts {s['redis_commands_per_call_incl_scripts']:.2f}")

    evidence = None
    if ev_paths:
        evidence = {"facts_per_run": EVIDENCE_FACTS, "run_state": "ENDED", "rounds": rounds,
                    "requests_per_round": -(-args.evidence_requests // rounds), "connections": 1,
                    "warmup_requests": EVIDENCE_WARMUP, "paths": {}}
        for n in ev_paths:
            e = evidence_leg(args, procs, workdir, tool, redis, n, args.evidence_requests, rounds,
                             log)
            evidence["paths"][n] = e
            if e.get("unavailable"):
                unavailable[f"{n} evidence"] = e["unavailable"]

    size = None
    if size_paths:
        size = size_leg(args, procs, workdir, redis, args.result_bytes, size_paths, rounds, lat_s,
                        tput_s, warm_s, log)
        for entry in size["sizes"].values():
            for n, e in entry["paths"].items():
                if e.get("unavailable"):
                    unavailable[f"{n} size {entry['label']}"] = e["unavailable"]

    live = None
    if args.live_records and "toolgate-memory" in wanted:
        rps = median([r["rps"] for r in legs["toolgate-memory"]["throughput"]])
        live = live_records(args, procs, workdir, tool, rounds, lat_s, rps, log)

    # Assemble.
    report = {
        "schema": 1,
        "mode": "quick" if quick else "full",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "settings": {
            "rounds": rounds, "throughput_seconds": tput_s, "throughput_connections": 32,
            "throughput_wrk_threads": 2, "latency_seconds": lat_s, "latency_connections": 4,
            "latency_wrk_threads": 1, "latency_pace_ms": args.latency_pace_ms,
            "warmup_seconds": warm_s, "round_trip_calls": rt_calls,
            "nginx_worker_processes": f"auto ({paths['nginx']['workers']})"
            if "nginx" in paths else None,
            "fake_tool_worker_threads": 1, "record_ttl_ms": args.record_ttl_ms,
            "redis_hz": redis["hz"] if redis else None,
            "sched_waits": args.sched_waits,
            "evidence_requests": args.evidence_requests,
            "result_bytes": args.result_bytes if size else [],
            "only": args.only,
            "toolgate_env": args.toolgate_env or [],
            "otel_sink": sink.stats() if sink else None,
        },
        "paths": {},
    }
    total_failed = 0
    for n in wanted:
        if n in unavailable:
            report["paths"][n] = {"unavailable": unavailable[n]}
            continue
        if n not in paths:
            continue
        L = legs[n]
        every = L["warmup"] + L["throughput"] + L["latency"]
        statuses = {}
        for r in every:
            for k, v in r["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        failed = sum(failed_of(r) for r in every) + (store[n]["failed"] if n in store else 0)
        total_failed += failed
        tput = [r["rps"] for r in L["throughput"]]
        p50 = [r["latency_us"]["p50"] / 1000 for r in L["latency"]]
        p99 = [r["latency_us"]["p99"] / 1000 for r in L["latency"]]
        reqs = sum(r["requests"] for r in L["throughput"])
        cpu = sum(r["cpu_s"] for r in L["throughput"]) if paths[n]["cpu_pids"] else None
        extra_cpu = sum(r["extra_cpu_s"] or 0 for r in L["throughput"])
        entry = {
            "throughput_rps": {"median": median(tput), "rounds": tput},
            "latency_ms": {"p50": {"median": median(p50), "rounds": p50},
                           "p99": {"median": median(p99), "rounds": p99}},
            "ratios": {},
            "cpu_s_per_10k_calls": cpu / reqs * 10_000 if cpu is not None and reqs else None,
            "tool_and_store_cpu_s_per_10k_calls": extra_cpu / reqs * 10_000 if reqs else None,
            "cpu_us_per_call": cpu / reqs * 1e6 if cpu is not None and reqs else None,
            "tool_and_store_cpu_us_per_call": extra_cpu / reqs * 1e6 if reqs else None,
            "requests": {"total": sum(r["requests"] for r in every), "failed": failed,
                         "by_status": statuses,
                         "socket_errors": sum(r["socket_errors"] for r in every)},
        }
        if n in rss_idle:
            entry["rss_mib"] = {"idle": rss_idle[n], "load": rss_load.get(n, (None, None))[0],
                                "peak": rss_load.get(n, (None, None))[1]}
        if n in store:
            entry["store"] = store[n]
            # The cluster's CPU per call over the throughput phase, by the node's part in it.
            roles = slot_roles(redis, paths[n]["run_id"])
            by_role = {"primary": 0.0, "replica": 0.0, "other": 0.0}
            for r in L["throughput"]:
                for role, c in zip(roles, r["redis_node_cpu_s"], strict=True):
                    by_role[role] += c
            entry["store_cpu_us_per_call"] = {
                f"{role}{'' if role != 'other' else '_nodes'}": v / reqs * 1e6 if reqs else None
                for role, v in by_role.items()}
            entry["cluster_stalls_ms"] = {
                phase: [r["cluster_stalls_ms"] for r in L[phase]]
                for phase in ("throughput", "latency")}
        if paths[n].get("front"):
            entry["endpoint"] = ENDPOINTS[paths[n]["front"]]
        if args.sched_waits:
            entry["sched_waits"] = [r["sched_waits"] for r in L["latency"]]
        report["paths"][n] = entry

    # Ratios: per round, each path against the baseline measured in the same round, then the
    # median of those paired ratios, so slow drift of the machine cancels out.
    def paired(n, base, key):
        a, b = report["paths"][n], report["paths"].get(base)
        if not b or b.get("unavailable"):
            return None
        if key == "tput":
            xs, ys = a["throughput_rps"]["rounds"], b["throughput_rps"]["rounds"]
            return median([x / y for x, y in zip(xs, ys, strict=False) if y])
        xs, ys = a["latency_ms"]["p99"]["rounds"], b["latency_ms"]["p99"]["rounds"]
        return median([x - y for x, y in zip(xs, ys, strict=False)])

    for n, e in report["paths"].items():
        if e.get("unavailable"):
            continue
        e["ratios"] = {
            "throughput_vs_direct": paired(n, "direct", "tput"),
            "throughput_vs_nginx": paired(n, "nginx", "tput"),
            "p99_added_ms_vs_direct": paired(n, "direct", "p99"),
        }
        a, d = report["paths"][n], report["paths"].get("direct")
        if d and not d.get("unavailable"):
            xs, ys = a["latency_ms"]["p50"]["rounds"], d["latency_ms"]["p50"]["rounds"]
            e["ratios"]["p50_added_ms_vs_direct"] = median([x - y for x, y in zip(xs, ys, strict=False)])
        if n == MCP_PATH:
            e["ratios"]["throughput_vs_invoke"] = paired(n, INVOKE_PATH, "tput")
            e["ratios"]["p99_added_ms_vs_invoke"] = paired(n, INVOKE_PATH, "p99")
    # CPU per call of the proxy, from /proc. A toolgate path counts its own process; nginx's
    # proxied call is its workers plus the tool, less the tool's CPU per call on the direct
    # path, so that the tool's serving share is taken out the same way on both sides.
    d, ng = report["paths"].get("direct") or {}, report["paths"].get("nginx") or {}
    tool_us = d.get("tool_and_store_cpu_us_per_call")
    nginx_us = None
    if ng.get("cpu_us_per_call") is not None and tool_us is not None:
        nginx_us = ng["cpu_us_per_call"] + ng["tool_and_store_cpu_us_per_call"] - tool_us
        ng["proxy_cpu_us_per_call"] = nginx_us
    for n, e in report["paths"].items():
        if e.get("unavailable") or not n.startswith("toolgate"):
            continue
        e["proxy_cpu_us_per_call"] = e.get("cpu_us_per_call")
        if nginx_us and e.get("cpu_us_per_call") is not None:
            e["ratios"]["cpu_vs_nginx"] = e["cpu_us_per_call"] / nginx_us
    report["mcp_vs_invoke"] = mcp_vs_invoke(report)
    if evidence:
        report["evidence"] = evidence
        total_failed += sum(e.get("failed", 0) for e in evidence["paths"].values())
    if size:
        report["size"] = size
        total_failed += size["failed"]
        if args.only == "size" and os.path.exists(out_path):
            # The callgrind sweep's figures (--callgrind PATH --result-bytes ...) stay.
            with open(out_path) as f:
                kept = json.load(f).get("callgrind")
            if kept:
                report["callgrind"] = kept
    if live:
        report["live_records"] = live
        total_failed += live["failed"]

    report["failed_requests"] = total_failed
    ts = targets(report)  # the last one: no failed requests
    report["targets"] = ts[:-1] + size_targets(size, report.get("callgrind")) + ts[-1:]
    report["elapsed_seconds"] = round(time.time() - started, 1)
    report["ok"] = total_failed == 0 and not unavailable

    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")

    m = report["machine"]
    print()
    print(f"toolgate benchmark ({report['mode']}"
          f"{', only ' + args.only if args.only else ''}), {report['date']}, {m['cores']} cores, "
          f"{m['memory_gib']} GiB, {m['cpu']}; commit {m['toolgate_commit']}")
    if report["paths"]:
        print(f"throughput: {rounds} round(s) x {tput_s}s per path at 32 connections; latency: "
              f"{rounds} x {lat_s}s at 4 connections, each pausing {args.latency_pace_ms} ms "
              f"between calls;\nmedians over rounds; ratios and +p99 paired per round")
        print()
        print_table(report)
    print_mcp_vs_invoke(report["mcp_vs_invoke"])
    print_cluster(report)
    print_sched(report)
    if live:
        print(f"\nmemory store holding {live['records']:,} live records: "
              f"p99 {live['p99_ms']['median']:.3f} ms at 4 "
              f"connections (rounds {', '.join(f'{x:.3f}' for x in live['p99_ms']['rounds'])}), "
              f"RSS {live['rss_mib']:.0f} MiB")
    print_evidence(report.get("evidence"))
    print_size(size)
    print_targets(report["targets"])
    print()
    print(f"written: {out_path} ({report['elapsed_seconds']}s)")
    if total_failed:
        print(f"FAILED: {total_failed} request(s) failed or were not READY", file=sys.stderr)
        return 1
    if unavailable:
        print(f"NOTE: unavailable paths: {', '.join(unavailable)}", file=sys.stderr)
        return 0 if args.allow_unavailable else 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(2)
