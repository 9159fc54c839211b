"""Unit tests of soak.py's decisions: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import argparse
import json
import tempfile
import unittest

import soak
from fake_http import FakeHttp

CLUSTER_NODES = """\
07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922 [5500->-e7d1]
292f 127.0.0.1:30003@40003 master,fail - 0 1426238316232 3 connected 10923-16383
6ec2 127.0.0.1:30004@40004 slave 07c3 0 1426238316232 1 connected
824f 127.0.0.1:30006@40006 master - 0 1426238316232 7 connected 100 200-300
"""


WORKDIR = tempfile.TemporaryDirectory(prefix="soak-test-")  # where a summary writes its RSS samples


def tearDownModule():
    WORKDIR.cleanup()


def make_soak(minutes=2.0, store="memory", **over):
    """A Soak as main() makes it, started nothing: its checks run on what a test gives it."""
    args = dict(minutes=minutes, weights=None, seed=1, memory_ttl_s=15, run_life_s=2.0, workdir=WORKDIR.name,
                workers=6, sample_s=0.25, rate=300, notrace_per_run=10, bulk_raw_bytes=65536)
    args.update(over)
    return soak.Soak(argparse.Namespace(**args), store, procs=None, log=lambda msg: None)


class Hashing(unittest.TestCase):
    def test_crc16_and_slots_as_redis_computes_them(self):
        self.assertEqual(soak.crc16(b"123456789"), 0x31C3)  # CRC16-CCITT (XMODEM) check value
        # CLUSTER KEYSLOT foo / bar / a run id as hash tag.
        self.assertEqual(soak.run_slot("foo"), 12182)
        self.assertEqual(soak.run_slot("bar"), 5061)
        self.assertTrue(0 <= soak.run_slot("soak-memory-00001-abcdef") < 16384)

    def test_cluster_nodes_and_the_owner_of_a_slot(self):
        nodes = soak.parse_cluster_nodes(CLUSTER_NODES + "garbage line\n")
        self.assertEqual([n[1] for n in nodes], [30001, 30002, 30003, 30004, 30006])
        self.assertEqual(nodes[1][3], [(5461, 10922)])  # the migrating slot is left out
        self.assertEqual(nodes[4][3], [(100, 100), (200, 300)])
        self.assertEqual(soak.owner_of(0, nodes), (30001, [(0, 5460)]))
        self.assertEqual(soak.owner_of(5500, nodes)[0], 30002)
        self.assertEqual(soak.owner_of(250, nodes)[0], 30001)  # first primary listed owning it
        self.assertEqual(soak.owner_of(12000, nodes), (None, []))  # its primary failed


class Weights(unittest.TestCase):
    def test_overrides_and_unknown_classes(self):
        s = make_soak(weights="too_large=0,search=50")
        self.assertEqual((s.weights["too_large"], s.weights["search"], s.weights["empty"]), (0, 50, 12))
        self.assertEqual(sum(w for w, _, _ in soak.CLASSES.values()), 100)
        with self.assertRaisesRegex(soak.Failure, "unknown class 'nope'"):
            make_soak(weights="nope=1")


def rss(levels, seconds=120, step=0.25):
    """Samples every `step` s: the level (MiB) of the first window whose start is at or before t."""
    out, t = [], 0.0
    while t <= seconds:
        level = [mib for start, mib in levels if start <= t][-1]
        out.append((t, int(level * 1024)))
        t += step
    return out


class Rss(unittest.TestCase):
    def summary(self, s):
        s.at_run_end = (0, 0, 0)
        ok, text = s.summary(120, 36000)
        line = next(x for x in text.splitlines() if "RSS:" in x)
        return ok, line, text

    def test_growth_within_the_limit_passes(self):
        s = make_soak()
        s.rss = rss([(0, 80), (30, 100), (75, 104.9)])
        r = s.rss_levels()
        self.assertEqual((r["warm_at"], r["span"], r["fits"]), ((30.0, 60.0), 30.0, True))
        self.assertAlmostEqual(r["warm"], 100, delta=0.01)
        self.assertAlmostEqual(r["end"], 104.9, delta=0.01)
        self.assertGreater(r["slope"], 0)  # MiB/h after the warm-up
        ok, line, text = self.summary(s)
        self.assertTrue(ok, text)
        self.assertTrue(line.startswith("  ok   RSS: after warm-up 100.0 MiB"), line)
        self.assertIn("growth +4.90 % (limit 5 %)", line)
        self.assertTrue(text.endswith("result: PASS"))

    def test_growth_over_the_limit_fails(self):
        s = make_soak()
        s.rss = rss([(0, 100), (75, 105.2)])
        ok, line, text = self.summary(s)
        self.assertFalse(ok)
        self.assertTrue(line.startswith("  FAIL RSS:"), line)
        self.assertIn("growth +5.20 %", line)
        self.assertTrue(text.endswith("result: FAIL"))

    def test_the_first_ramp_is_not_judged(self):
        # Growth only during the warm-up (the first 30 s): no growth after it.
        s = make_soak()
        s.rss = rss([(0, 50), (29, 100)])
        ok, line, _ = self.summary(s)
        self.assertTrue(ok)
        self.assertIn("growth +0.00 %", line)

    def test_a_soak_too_short_for_two_windows_fails(self):
        s = make_soak(minutes=1)
        s.rss = rss([(0, 100)], seconds=60)
        self.assertFalse(s.rss_levels()["fits"])
        ok, line, _ = self.summary(s)
        self.assertFalse(ok)
        self.assertIn("RSS: not judged, the soak is too short: 90 s are needed", line)

    def test_no_samples_fails(self):
        s = make_soak()
        ok, line, _ = self.summary(s)
        self.assertFalse(ok)
        self.assertIn("RSS: not enough samples", line)

    def test_long_soaks_average_over_five_percent_of_the_time(self):
        s = make_soak(minutes=30)
        s.rss = rss([(0, 100)], seconds=1800, step=5)
        r = s.rss_levels()
        self.assertEqual((s.warmup, r["span"], r["warm_at"]), (360.0, 90.0, (360.0, 450.0)))


class Summary(unittest.TestCase):
    def soak_with(self, **stats):
        s = make_soak()
        s.rss = rss([(0, 100)])
        s.at_run_end = stats.pop("at_run_end", (10, 0, 0))
        for k, v in stats.items():
            setattr(s, k, v)
        return s

    def test_each_check_fails_the_soak(self):
        s = self.soak_with()
        s.stats.outcome("search", soak.FOUND, True)
        ok, text = s.summary(120, 1)
        self.assertTrue(ok, text)
        for name, breaks in (
                ("unexpected outcome", lambda s: s.stats.outcome("search", "INTERNAL", False, "x")),
                ("leak", lambda s: setattr(s.stats, "leaks", 1)),
                ("lost record", lambda s: setattr(s, "at_run_end", (10, 1, 0))),
                ("differing record", lambda s: setattr(s, "at_run_end", (10, 0, 1))),
                ("record not checked in its TTL", lambda s: setattr(s, "records_late", 1)),
                ("other problem", lambda s: s.stats.problem("facts unreadable", "r1")),
                ("aborted", lambda s: (s.abort.set(), setattr(s, "abort_why", "stuck")))):
            with self.subTest(name):
                s = self.soak_with()
                breaks(s)
                ok, text = s.summary(120, 1)
                self.assertFalse(ok, text)
                self.assertIn("\n  FAIL ", text)

    def test_a_redis_soak_without_a_failover_fails(self):
        s = make_soak(store="redis")
        s.rss, s.at_run_end = rss([(0, 100)]), (0, 0, 0)
        ok, text = s.summary(120, 0)
        self.assertFalse(ok)
        self.assertIn("FAIL failover: did not happen (not reached)", text)


class Facts(unittest.TestCase):
    def run_with(self, calls, unavailable=()):
        run = soak.Run("run-1", "token", 0)
        run.calls = [(cid, outcome, w, seq, 0, 0, tool) for cid, outcome, w, seq, tool in calls]
        run.unavailable = set(unavailable)
        return run

    CALLS = [("a", soak.FOUND, 0, 1, "search"), ("b", soak.EMPTY, 0, 2, "lookup"),
             ("c", soak.FOUND, 1, 1, "search"), ("t", "TOOL_TIMEOUT", 1, 2, "slow")]

    @staticmethod
    def facts(*ids, excluded=1, evidence=None, tools=None, extra=None):
        ev = {"a": "EVIDENCE_FOUND", "b": "NO_EVIDENCE", "c": "EVIDENCE_FOUND", **(evidence or {})}
        tl = {"a": "search", "b": "lookup", "c": "search", **(tools or {})}
        facts = [dict({"tool_call_id": i, "evidence_status": ev.get(i), "tool": tl.get(i)}, **(extra or {}))
                 for i in ids]
        return {"facts": facts, "excluded": excluded}

    def problems(self, body, unavailable=()):
        s = make_soak()
        s.check_facts(self.run_with(self.CALLS, unavailable), body)
        self.assertEqual(s.facts_runs, 1)
        return dict(s.stats.problems)

    def test_facts_as_answered_pass(self):
        self.assertEqual(self.problems(self.facts("a", "c", "b")), {})  # workers interleave

    def test_what_fails(self):
        for body, problem in (
                (self.facts("a", "c"), "facts miss READY calls (lost)"),
                (self.facts("b", "a", "c"), "facts out of a worker's completion order"),
                (self.facts("a", "b", "c", "t"), "facts hold calls not answered READY"),
                (self.facts("a", "a", "b", "c"), "facts list an id twice"),
                (self.facts("a", "b", "c", evidence={"a": "NO_EVIDENCE"}),
                 "fact evidence differs from the answer"),
                (self.facts("a", "b", "c", tools={"c": "lookup"}), "fact tool differs"),
                (self.facts("a", "b", "c", extra={"raw": soak.RAW_MARKER}), "raw response in facts"),
                (self.facts("a", "b", "c", excluded=0), "facts' excluded count"),
                (self.facts("a", "b", "c", excluded=None), "facts' excluded count")):
            with self.subTest(problem):
                self.assertIn(problem, self.problems(body))

    def test_store_unavailable_calls_may_be_in_either_list(self):
        self.assertEqual(self.problems(self.facts("a", "b", "c", "u", excluded=1), ["u"]), {})
        self.assertEqual(self.problems(self.facts("a", "b", "c", excluded=2), ["u"]), {})
        self.assertIn("facts' excluded count", self.problems(self.facts("a", "b", "c", excluded=3), ["u"]))


class Window(unittest.TestCase):
    def test_only_redis_has_a_failover_window(self):
        self.assertFalse(make_soak().in_window(0, 1e9))
        s = make_soak(store="redis")
        self.assertFalse(s.in_window(5, 6))
        s.failover = {"armed": True}
        self.assertFalse(s.in_window(5, 6))
        s.failover["killed_at"] = 10
        self.assertEqual((s.in_window(5, 9), s.in_window(5, 10)), (False, True))
        s.window = (10, 20)
        self.assertEqual([s.in_window(a, b) for a, b in ((5, 9), (5, 12), (20, 30), (21, 30))],
                         [False, True, True, False])


def ready(call_id, evidence="EVIDENCE_FOUND", items=5, total=7, scope=None):
    result = {"total_items": total, "items": [{"title": "t", "url": "u", "snippet": "s"}] * items}
    if scope is not None:
        result = {"scope": scope}
    return {"tool_call_id": call_id, "status": "READY", "evidence_status": evidence, "result": result}


def error(call_id, code):
    return {"tool_call_id": call_id, "status": "ERROR", "error": {"code": code, "message": "m"}}


def mcp_result(call_id, is_error=False, code=None, evidence="EVIDENCE_FOUND"):
    if is_error:
        return {"jsonrpc": "2.0", "id": 1,
                "result": {"isError": True, "structuredContent": error(call_id, code)}}
    return {"jsonrpc": "2.0", "id": 1, "result": {"isError": False, "_meta": {
        "toolgate.dev/tool_call_id": call_id, "toolgate.dev/evidence_status": evidence}}}


class Send(unittest.TestCase):
    """The outcome the soak reads from each answer, over a real keep-alive connection."""

    def setUp(self):
        self.server = FakeHttp()
        self.addCleanup(self.server.close)
        self.soak = make_soak()
        self.conn = soak.Conn(self.server.port, timeout=5)
        self.addCleanup(self.conn.close)

    def send(self, form, answer, tool="search", call_id="call_1"):
        path = {"invoke": "/v1/invoke", "tools": f"/tools/{tool}", "mcp": "/mcp"}[form]
        status, body = answer
        self.server.answer(path, (status, body if isinstance(body, str) else json.dumps(body)))
        return self.soak.send(self.conn, form, "tok", "run-1", call_id, tool, {"q": "x"}, 1)[0]

    def test_outcomes(self):
        for form, answer, tool, want in (
                ("invoke", (200, ready("call_1")), "search", soak.FOUND),
                ("invoke", (200, ready("call_1", items=4)), "search", "BAD_PROJECTION"),
                ("invoke", (200, ready("call_1", total=6)), "search", "BAD_PROJECTION"),
                ("invoke", (200, ready("call_1", "NO_EVIDENCE", scope={"tool": "lookup"})), "lookup",
                 soak.EMPTY),
                ("invoke", (200, ready("call_1", "NO_EVIDENCE", scope={"tool": "x"})), "lookup", "BAD_SCOPE"),
                ("invoke", (202, ready("call_1")), "search", "READY_WITH_HTTP_202"),
                ("invoke", (200, ready("call_2")), "search", "WRONG_TOOL_CALL_ID"),
                ("tools", (404, error("call_1", "UNKNOWN_TOOL")), "nope", "UNKNOWN_TOOL"),
                ("tools", (500, error("call_1", "UNKNOWN_TOOL")), "nope", "UNKNOWN_TOOL_WITH_HTTP_500"),
                ("invoke", (409, {"tool_call_id": "call_1", "error": {}}), "search",
                 "ERROR_WITHOUT_CODE_WITH_HTTP_409"),
                ("invoke", (502, "<html>bad gateway</html>"), "search", "HTTP_502_NOT_JSON"),
                ("invoke", (200, []), "search", "HTTP_200_NOT_AN_OBJECT"),
                ("mcp", (200, mcp_result("call_1")), "search", soak.FOUND),
                ("mcp", (200, mcp_result("call_9")), "search", "WRONG_TOOL_CALL_ID"),
                ("mcp", (200, mcp_result("call_1", True, "TOOL_TIMEOUT")), "slow", "TOOL_TIMEOUT"),
                ("mcp", (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602}}), "search",
                 "MCP_NO_RESULT"),
                ("mcp", (401, error("call_1", "UNAUTHENTICATED")), "search", "UNAUTHENTICATED")):
            with self.subTest(form=form, want=want):
                self.assertEqual(self.send(form, answer, tool), want)

    def test_a_raw_response_is_a_leak(self):
        body = ready("call_1")
        body["result"]["items"][0] = {"title": soak.RAW_MARKER}
        self.assertEqual(self.send("invoke", (200, body)), "RAW_LEAKED")
        self.assertEqual(self.soak.stats.leaks, 1)

    def test_requests_carry_the_ids_where_each_form_puts_them(self):
        self.send("invoke", (200, ready("call_1")))
        self.send("tools", (200, ready("call_1")))
        self.send("mcp", (200, mcp_result("call_1")))
        (_, p1, h1, b1), (_, p2, h2, b2), (_, p3, h3, b3) = self.server.requests
        self.assertEqual((p1, json.loads(b1)), ("/v1/invoke", {
            "run_id": "run-1", "tool_call_id": "call_1", "tool": "search", "input": {"q": "x"}}))
        self.assertEqual((p2, h2["X-Run-Id"], h2["X-Tool-Call-Id"], json.loads(b2)),
                         ("/tools/search", "run-1", "call_1", {"q": "x"}))
        self.assertEqual(json.loads(b3)["params"]["_meta"],
                         {"toolgate.dev/run_id": "run-1", "toolgate.dev/tool_call_id": "call_1"})
        self.assertEqual({h1["Authorization"], h2["Authorization"], h3["Authorization"]}, {"Bearer tok"})

    def test_a_closed_server_is_a_transport_error(self):
        self.server.close()
        self.assertEqual(self.soak.send(self.conn, "invoke", "t", "r", "c", "search", {}, 1)[0],
                         "TRANSPORT_ERROR")


if __name__ == "__main__":
    unittest.main()
