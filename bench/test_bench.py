"""Unit tests of bench.py's parsing: `python3 -m unittest discover -s bench` (run by `make lint`)."""

import base64
import json
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


if __name__ == "__main__":
    unittest.main()
