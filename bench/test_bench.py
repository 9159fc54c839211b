"""Unit tests of bench.py's parsing: `python3 -m unittest discover -s bench` (run by `make lint`)."""

import base64
import contextlib
import io
import json
import socket
import tempfile
import threading
import time
import unittest

import bench

# The head of `perf sched timehist` and six rows: two CPUs, 2 ms of trace.
TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   100.000000 [0000]  <idle>                              0.000      0.000      0.500
   100.000500 [0000]  toolgate-worker[11/10]              0.400      0.300      0.200
   100.000700 [0001]  redis-server[20]                    1.500      1.200      0.100
   100.001000 [0001]  <idle>                              0.000      0.000      0.300
   100.001500 [0000]  wrk[30/29]                          0.100      0.050      0.400
   100.002000 [0001]  tokio-rt-worker[41/40]              0.900      0.260      0.500
"""


class TimehistFigures(unittest.TestCase):
    def test_counts_runs_busy_time_and_waits(self):
        # 2 ms at 1000 calls a second: 2 calls.
        f = bench.timehist_figures(TIMEHIST, 1000, 2)
        self.assertAlmostEqual(f["seconds"], 0.002)
        # Four runs that are not idle: 1.2 ms of 4 ms of CPU.
        self.assertAlmostEqual(f["runs_per_call"], 2.0)
        self.assertAlmostEqual(f["cpus_busy"], 0.3)
        # Waits of 0.3, 1.2 and 0.26 ms pass 0.25 ms; only 1.2 passes 1 ms. Idle rows never count.
        self.assertAlmostEqual(f["waits_over_ms_per_call"]["0.25"], 1.5)
        self.assertAlmostEqual(f["waits_over_ms_per_call"]["1.0"], 0.5)

    def test_no_rows_is_a_failure(self):
        with self.assertRaises(bench.Failure):
            bench.timehist_figures("perf: no samples\n", 1000, 2)


def b64(value):
    """The unpadded base64url of a JSON value's compact text, as a JWS part holds it."""
    text = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode()


def facts_body(run_id="bench-evidence-memory", n=3, **over):
    doc = {"run_id": run_id, "facts": [{"tool_call_id": f"ev-{i}", "tool": "bench",
                                        "evidence_status": "EVIDENCE_FOUND", "result": {}}
                                       for i in range(n)],
           "excluded": 0, "tampered": 0}
    doc.update(over)
    return json.dumps(doc).encode()


def bundle(run_id="bench-evidence-memory", n=3, header=None, signatures=None, **over):
    """A bundle shaped as toolgate's (its signature is not checked here)."""
    statement = {"typ": "toolgate.evidence.v1", "iss": "toolgate", "run_id": run_id,
                 "state": "ENDED", "issued_at": "2026-12-07T14:59:17.038Z",
                 "facts": [{"seq": i + 1, "tool_call_id": f"ev-{i}", "tool": "bench"}
                           for i in range(n)],
                 "excluded": 0, "tampered": 0}
    statement.update(over)
    protected = b64(header or {"alg": "EdDSA", "kid": "k1", "typ": "toolgate-evidence+json"})
    sigs = signatures if signatures is not None else [
        {"protected": protected, "signature": b64(b"\x01" * 64)}]
    return json.dumps({"payload": b64(statement), "signatures": sigs}).encode()


class EvidenceChecks(unittest.TestCase):
    RUN = "bench-evidence-memory"

    def test_good_answers_pass(self):
        self.assertIsNone(bench.check_facts(200, facts_body(), self.RUN, 3))
        self.assertIsNone(bench.check_bundle(200, bundle(), self.RUN, 3))

    def test_facts_failures(self):
        for status, body, n, says in (
                (503, b'{"error":{"code":"STORE_UNAVAILABLE"}}', 3, "status 503"),
                (200, b"<html>", 3, "malformed"),
                (200, b"[]", 3, "malformed"),
                (200, facts_body(n=2), 3, "2 facts, not 3"),
                (200, facts_body(run_id="other"), 3, "run_id 'other'"),
                (200, facts_body(excluded=1), 3, "excluded 1"),
                (200, facts_body(tampered=1), 3, "tampered 1")):
            with self.subTest(says=says):
                self.assertIn(says, bench.check_facts(status, body, self.RUN, n))

    def test_bundle_failures(self):
        protected = b64({"alg": "EdDSA", "kid": "k1", "typ": "toolgate-evidence+json"})
        two = [{"protected": protected, "signature": "AA"}] * 2
        for body, says in (
                (bundle(n=99), "99 facts, not 3"),
                (bundle(state="ACTIVE"), "state 'ACTIVE'"),
                (bundle(typ="other"), "typ 'other'"),
                (bundle(run_id="other"), "run_id 'other'"),
                (bundle(tampered=2), "tampered 2"),
                (bundle(signatures=two), "one signature"),
                (bundle(signatures=[]), "one signature"),
                (bundle(header={"alg": "none", "kid": "k1", "typ": "toolgate-evidence+json"}),
                 "protected header"),
                (bundle(header={"alg": "EdDSA", "typ": "toolgate-evidence+json"}),
                 "protected header"),
                (json.dumps({"payload": "!!", "signatures": [
                    {"protected": protected, "signature": "AA"}]}).encode(), "malformed"),
                (facts_body(), "not a JWS"),
                (b"not json", "malformed")):
            with self.subTest(says=says):
                self.assertIn(says, bench.check_bundle(200, body, self.RUN, 3))
        self.assertIn("status 404", bench.check_bundle(404, b"{}", self.RUN, 3))

    def test_bundle_seq_must_count_from_one(self):
        body = json.loads(bundle())
        statement = bench.b64url_json(body["payload"])
        statement["facts"][1]["seq"] = 3
        body["payload"] = b64(statement)
        self.assertIn("seq", bench.check_bundle(200, json.dumps(body).encode(), self.RUN, 3))


class EvidenceFigures(unittest.TestCase):
    def test_percentile_nearest_rank(self):
        xs = list(range(100, 0, -1))  # 1..100, unsorted
        self.assertEqual(bench.percentile(xs, 50), 50)
        self.assertEqual(bench.percentile(xs, 99), 99)
        self.assertEqual(bench.percentile(xs, 100), 100)
        self.assertEqual(bench.percentile([7], 99), 7)
        self.assertIsNone(bench.percentile([], 50))

    @staticmethod
    def block(lat_us, cpu_s, failed=0, store_cpu_s=None):
        return {"latency_us": lat_us, "requests": len(lat_us) + failed, "failed": failed,
                "errors": ["bad"] * failed, "cpu_s": cpu_s, "store_cpu_s": store_cpu_s,
                "body_bytes": 2048}

    def test_endpoint_figures_and_comparison(self):
        facts = bench.endpoint_figures([self.block([1000] * 100, 0.05),
                                        self.block([3000] * 100, 0.07, store_cpu_s=0.1)])
        # Per round: p50 1 and 3 ms, median 2; CPU 0.12 s over 200 requests.
        self.assertEqual(facts["latency_ms"]["p50"]["rounds"], [1.0, 3.0])
        self.assertEqual(facts["latency_ms"]["p99"]["median"], 2.0)
        self.assertEqual(facts["latency_ms"]["max"], 3.0)
        self.assertAlmostEqual(facts["cpu_us_per_request"], 600)
        self.assertIsNone(facts["store_cpu_us_per_request"])  # not measured in every block
        self.assertEqual((facts["requests"], facts["failed"], facts["body_bytes"]), (200, 0, 2048))
        ev = bench.endpoint_figures([self.block([1500] * 99, 0.1, failed=1),
                                     self.block([3250] * 100, 0.11)])
        self.assertEqual((ev["requests"], ev["failed"], ev["errors"]), (200, 1, ["bad"]))
        vs = bench.evidence_vs_facts(ev, facts)
        # Paired per round: +0.5 and +0.25 ms; CPU 1050 vs 600 us a request.
        self.assertAlmostEqual(vs["p50_added_ms"], 0.375)
        self.assertAlmostEqual(vs["p99_added_ms"], 0.375)
        self.assertAlmostEqual(vs["cpu_ratio"], 1.75)

    def test_a_round_without_answers_has_no_percentile(self):
        f = bench.endpoint_figures([self.block([], 0.0, failed=5, store_cpu_s=0.0),
                                    self.block([2000] * 10, 0.01, store_cpu_s=0.02)])
        self.assertEqual(f["latency_ms"]["p50"]["rounds"], [None, 2.0])
        self.assertEqual(f["latency_ms"]["p50"]["median"], 2.0)
        self.assertEqual(f["failed"], 5)
        self.assertAlmostEqual(f["store_cpu_us_per_request"], 20000 / 15)


class Targets(unittest.TestCase):
    """bench.targets(): each goal met, missed at its boundary, or not measured."""

    @staticmethod
    def report(mem=None, primary=None, replica=None, live=None, failed=0):
        mem = {"ratios": {"throughput_vs_nginx": 0.6, "p99_added_ms_vs_direct": 0.5, "cpu_vs_nginx": 2.5},
               **(mem or {})}
        primary = {"ratios": {"throughput_vs_nginx": 0.4, "p99_added_ms_vs_direct": 1.0, "cpu_vs_nginx": 2.5},
                   "store": {"round_trips_per_call": 2.04}, "rss_mib": {"idle": 30, "load": 60},
                   **(primary or {})}
        replica = {"store": {"round_trips_per_call": 2.96}, **(replica or {})}
        report = {"paths": {"toolgate-memory": mem, "toolgate-redis-primary": primary,
                            "toolgate-redis-replica": replica}, "failed_requests": failed}
        if live:
            report["live_records"] = live
        return report

    @staticmethod
    def met(ts):
        return {t["target"]: t["met"] for t in ts}

    def test_every_goal_met_at_its_boundary(self):
        ts = bench.targets(self.report(live={"records": 1_000_000, "p99_ms": {"median": 2.0}}))
        self.assertEqual(len(ts), 12)
        self.assertTrue(all(t["met"] for t in ts), [t for t in ts if not t["met"]])
        self.assertIn("memory p99 with 1,000,000 live records, 4 connections (ms)", self.met(ts))

    def test_each_goal_missed_just_past_it(self):
        for over, target in (
                ({"mem": {"ratios": {"throughput_vs_nginx": 0.59}}}, "memory throughput vs nginx"),
                ({"mem": {"ratios": {"p99_added_ms_vs_direct": 0.51}}},
                 "memory added p99 vs direct, 4 connections (ms)"),
                ({"mem": {"ratios": {"cpu_vs_nginx": 2.51}}}, "memory toolgate CPU per call vs nginx's"),
                ({"primary": {"ratios": {"throughput_vs_nginx": 0.39}}}, "redis primary throughput vs nginx"),
                ({"primary": {"store": {"round_trips_per_call": 2.06}}},
                 "redis primary store round trips per call"),
                ({"primary": {"store": {"round_trips_per_call": 1.94}}},
                 "redis primary store round trips per call"),
                ({"primary": {"rss_mib": {"idle": 30.1, "load": 60}}}, "redis primary RSS idle (MiB)"),
                ({"primary": {"rss_mib": {"idle": 30, "load": 61}}},
                 "redis primary RSS under 32-connection load (MiB)"),
                ({"replica": {"store": {"round_trips_per_call": 3.06}}},
                 "redis replica store round trips per call"),
                ({"live": {"records": 10, "p99_ms": {"median": 2.1}}},
                 "memory p99 with 10 live records, 4 connections (ms)"),
                ({"failed": 1}, "failed or non-READY responses")):
            with self.subTest(target):
                ts = bench.targets(self.report(**over))
                self.assertEqual([t["target"] for t in ts if t["met"] is False], [target])

    def test_unmeasured_and_unavailable(self):
        ts = self.met(bench.targets(self.report(mem={"ratios": {"cpu_vs_nginx": None}})))
        self.assertIsNone(ts["memory toolgate CPU per call vs nginx's"])
        ts = bench.targets(self.report(primary={"unavailable": "no redis"}))
        row = next(t for t in ts if t["target"] == "Redis Cluster targets")
        self.assertEqual((row["measured"], row["met"]), ("path unavailable", None))
        self.assertEqual(bench.targets({"paths": {}, "failed_requests": 0}), [
            {"target": "failed or non-READY responses", "goal": "0", "measured": 0, "met": True}])

    def test_print_targets(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            bench.print_targets([{"target": "a", "goal": ">= 1", "measured": 1.23456, "met": True},
                                 {"target": "b", "goal": "0", "measured": 2, "met": False},
                                 {"target": "c", "goal": "2", "measured": None, "met": None}])
        self.assertEqual(out.getvalue().splitlines()[2:], [
            "  [met ] a: goal >= 1, measured 1.235", "  [MISS] b: goal 0, measured 2",
            "  [n/a ] c: goal 2, measured None"])


class Comparisons(unittest.TestCase):
    @staticmethod
    def path(endpoint, rps, p50, p99, **ratios):
        return {"endpoint": endpoint, "throughput_rps": {"median": rps},
                "latency_ms": {"p50": {"median": p50}, "p99": {"median": p99}}, "ratios": ratios}

    def test_mcp_vs_invoke(self):
        report = {"paths": {
            bench.MCP_PATH: self.path("/mcp", 900, 1.0, 2.0, throughput_vs_invoke=0.9,
                                      p99_added_ms_vs_invoke=0.3),
            bench.INVOKE_PATH: self.path("/v1/invoke", 1000, 0.9, 1.7)}}
        c = bench.mcp_vs_invoke(report)
        self.assertEqual((c["throughput_ratio"], c["p99_added_ms"]), (0.9, 0.3))
        self.assertEqual(c["mcp"], {"path": bench.MCP_PATH, "endpoint": "/mcp", "throughput_rps": 900,
                                    "p50_ms": 1.0, "p99_ms": 2.0})
        self.assertEqual(c["invoke"]["endpoint"], "/v1/invoke")
        report["paths"][bench.INVOKE_PATH] = {"unavailable": "exited"}
        self.assertIsNone(bench.mcp_vs_invoke(report))
        del report["paths"][bench.INVOKE_PATH]
        self.assertIsNone(bench.mcp_vs_invoke(report))

    def test_median_rotate_fmt_failed(self):
        self.assertEqual(bench.median([3, None, 1, 2]), 2)
        self.assertIsNone(bench.median([None]))
        self.assertEqual(bench.rotate([1, 2, 3], 4), [2, 3, 1])
        self.assertEqual(bench.rotate([], 1), [])
        self.assertEqual((bench.fmt(None, ".2f"), bench.fmt(1.234, ".2f")), ("-", "1.23"))
        self.assertEqual(bench.failed_of({"not_good": 2, "socket_errors": 3}), 5)
        self.assertEqual(bench.ms(None), None)

    def test_sched_text(self):
        w = {"cpus_busy": 0.5, "runs_per_call": 2.0, "waits_over_ms_per_call": {"0.25": 0.015, "1.0": 0.0}}
        self.assertEqual(bench.sched_text(w),
                         "CPUs 50% busy, 2.0 runs a call, waits per 100 calls > 0.25 ms 1.50, > 1.0 ms 0.00")


class Config(unittest.TestCase):
    PORTS = {"agent": 1, "admin": 2, "telemetry": 3}

    def test_memory_and_redis(self):
        mem = bench.toolgate_config(self.PORTS, "http://127.0.0.1:9/bench", "memory", [], 60000)
        self.assertIn('listen: {agent: "127.0.0.1:1", admin: "127.0.0.1:2", telemetry: "127.0.0.1:3"}', mem)
        self.assertIn("store: {kind: memory, record_ttl_ms: 60000, memory_max_bytes: 17179869184}", mem)
        self.assertIn("upstream: http://127.0.0.1:9/bench", mem)
        self.assertNotIn("otel:", mem)
        redis = bench.toolgate_config(self.PORTS, "u", "replica", [7000, 7001], 5, "http://127.0.0.1:4318")
        self.assertIn('store: {kind: redis-cluster, nodes: ["redis://127.0.0.1:7000", '
                      '"redis://127.0.0.1:7001"], durability: replica, record_ttl_ms: 5, timeout_ms: 500}',
                      redis)
        self.assertIn('otel: {endpoint: "http://127.0.0.1:4318", service_name: toolgate-bench}', redis)


class Redis(unittest.TestCase):
    def test_monitor_lines(self):
        line = (b'1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc" "1" "toolgate:{r}:run" '
                b'"a\\"b" "\\x00\\n\\\\"\n')
        self.assertEqual(bench.monitor_command(line), (b"127.0.0.1:5555", [
            b"EVALSHA", b"abc", b"1", b"toolgate:{r}:run", b'a"b', b"\x00\n\\"]))
        self.assertEqual(bench.monitor_command(b'1700000000.2 [0 lua] "HSET" "k" "f" "v"')[0], b"lua")
        self.assertIsNone(bench.monitor_command(b"OK"))

    def test_resp_replies(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        r = bench.Resp.__new__(bench.Resp)
        r.sock, r.buf = a, b""
        def reply_in_pieces():  # the parser waits for each whole value
            for piece in (b"*4\r\n$3\r\nab", b"c\r\n:42\r\n$-1\r\n+O", b"K\r\n"):
                b.sendall(piece)
                time.sleep(0.01)

        sender = threading.Thread(target=reply_in_pieces)
        sender.start()
        self.assertEqual(r.call("DUMP", b"k\x00"), [b"abc", 42, None, "OK"])
        sender.join()
        self.assertEqual(b.recv(100), b"*2\r\n$4\r\nDUMP\r\n$2\r\nk\x00\r\n")
        b.sendall(b"-ERR unknown command\r\n")
        with self.assertRaisesRegex(bench.Failure, "Redis: ERR unknown command"):
            r.call("NOPE")
        b.sendall(b"*-1\r\n")
        self.assertIsNone(r.call("X"))
        b.sendall(b"?what\r\n")
        with self.assertRaisesRegex(bench.Failure, "unexpected Redis reply"):
            r.call("X")
        b.shutdown(socket.SHUT_WR)
        with self.assertRaisesRegex(bench.Failure, "closed the connection"):
            r.call("X")

    def test_callgrind_self_costs(self):
        text = "events: Ir\nfn=(1) main\n0 10\ncfn=(2) helper\ncalls=1 0\n0 100\n0 5\nfn=(2)\n0 7\n+1 3\n"
        with tempfile.NamedTemporaryFile("w", suffix=".out") as f:
            f.write(text)
            f.flush()
            costs, total = bench.callgrind_self_costs(f.name)
        # A call's inclusive cost (the line after calls=) is not the caller's own.
        self.assertEqual((costs, total), ({"main": 15, "helper": 10}, 25))


if __name__ == "__main__":
    unittest.main()


# A callgrind profile in the file format: main calls parse twice and copy once; parse calls copy.
CALLGRIND_OUT = """\
version: 1
creator: callgrind-3.19.0
events: Ir
fl=(1) src/main.rs
fn=(1) main
1 10
cfn=(2) parse
calls=2 5
+1 300
cfl=(2) libc.so
cfn=(3) __memcpy_avx_unaligned_erms
calls=1 0
+1 1000
fl=(1)
fn=(2)
5 200
cfl=(2)
cfn=(3)
calls=1 0
* 100
fl=(2)
fn=(3)
0 1100
"""


class AnswerSizes(unittest.TestCase):
    def test_sizes_and_labels(self):
        self.assertEqual(bench.parse_sizes("1k, 64KiB,1m,1000,64k"), [1000, 1024, 65536, 1048576])
        self.assertEqual(bench.parse_sizes("0"), [])
        self.assertEqual(bench.parse_sizes(""), [])
        with self.assertRaises(bench.Failure):
            bench.parse_sizes("big")
        self.assertEqual([bench.size_label(n) for n in (1024, 65536, 1048576, 1000)],
                         ["1k", "64k", "1m", "1000"])

    def test_callgrind_costs_by_function(self):
        with tempfile.TemporaryDirectory() as d:
            path = f"{d}/callgrind.out"
            with open(path, "w") as f:
                f.write(CALLGRIND_OUT)
            own, inclusive, calls = bench.callgrind_costs(path)
            self.assertEqual(bench.callgrind_self_costs(path), (own, 1310))
        self.assertEqual(own, {"main": 10, "parse": 200, "__memcpy_avx_unaligned_erms": 1100})
        # parse: 200 of its own and the 100 of its copy; main: 10, both parses and its copy.
        self.assertEqual(inclusive["parse"], 300)
        self.assertEqual(inclusive["main"], 1310)
        self.assertEqual(calls[("main", "__memcpy_avx_unaligned_erms")], 1000)
        self.assertEqual(calls[("parse", "__memcpy_avx_unaligned_erms")], 100)

    def test_growth_per_byte_between_two_sizes(self):
        def point(label, parse, copy, grown):
            return {"label": label, "_self": {"parse": parse, "memcpy": copy + grown},
                    "_inclusive": {"toolgate::call": parse + copy + grown, "parse": parse},
                    "_calls": {("main", "toolgate::call"): parse + copy + grown,
                               ("toolgate::call", "memcpy"): copy,
                               ("toolgate::call", "toolgate::read"): grown,
                               ("toolgate::read", "alloc::raw_vec::finish_grow"): grown,
                               ("alloc::raw_vec::finish_grow", "mi_realloc"): grown,
                               ("mi_realloc", "memcpy"): grown}}

        a = point("64k", 100_000, 65_536, 0)
        b = point("1m", 1_100_000, 1_065_536, 500_000)
        self.assertEqual(bench.slope((65_536, 165_536), (1_065_536, 2_165_536)), 2.0)
        g = bench.size_growth(a, b, 1_000_000)
        self.assertEqual([(x["function"], x["instructions_per_byte"]) for x in g["self"]],
                         [("memcpy", 1.5), ("parse", 1.0)])
        self.assertEqual(g["inclusive"][0]["function"], "toolgate::call")
        self.assertEqual(g["inclusive"][0]["instructions_per_byte"], 2.5)
        # The copy made by a reallocation goes to the function that grew its buffer.
        self.assertEqual(g["copies"], [
            {"function": "toolgate::call", "via": None, "called_from": "main",
             "instructions_per_byte": 1.0},
            {"function": "toolgate::read", "via": "alloc::raw_vec::finish_grow",
             "called_from": "toolgate::call", "instructions_per_byte": 0.5}])

    def test_figures_pair_rounds_with_the_direct_call(self):
        def wrk(p50, p99, bad=0):
            return {"latency_us": {"p50": p50, "p99": p99}, "requests": 100, "not_good": bad,
                    "socket_errors": 0, "statuses": {"200": 100}, "rps": 50.0, "cpu_s": 0.01,
                    "extra_cpu_s": 0.02}

        direct = {"warmup": [wrk(0, 0)], "latency": [wrk(100, 500), wrk(200, 900)], "load": []}
        tg = {"warmup": [wrk(0, 0, bad=1)], "latency": [wrk(600, 1500), wrk(900, 1400)],
              "load": [wrk(5000, 9000)]}
        f = bench.size_figures(tg, direct)
        self.assertAlmostEqual(f["p50_added_ms_vs_direct"], 0.6)  # median of 0.5 and 0.7
        self.assertAlmostEqual(f["p99_added_ms_vs_direct"], 0.75)  # median of 1.0 and 0.5
        self.assertEqual(f["failed"], 1)
        self.assertEqual(f["requests"], 400)
        self.assertAlmostEqual(f["load"]["cpu_us_per_call"], 100.0)
        self.assertAlmostEqual(f["load"]["tool_and_store_cpu_us_per_call"], 200.0)

    def test_targets(self):
        section = {"sizes": {"65536": {"paths": {}}, "1048576": {"paths": {
            "toolgate-redis-primary": {"rss_mib": {"peak_above_idle": 120.0}}}}}}
        cg = {"toolgate-memory": {"slope_instructions_per_byte": 3.5,
                                  "slope_between": "64k and 1m", "commit": "abc"}}
        ts = bench.size_targets(section, cg)
        self.assertEqual([(t["measured"], t["met"]) for t in ts], [(120.0, False), (3.5, True)])
        self.assertIn("1m", ts[0]["target"])
        self.assertEqual(bench.size_targets(None, None), [])
