"""Unit tests of scenario.py's judgements: `python3 -m unittest discover -s deploy/scenario` (run
by `make lint`). The scenario itself runs against a sidecar (scripts/e2e-local.sh, the kind test)."""

import argparse
import contextlib
import io
import unittest

from scenario import Mismatch, Scenario, expect, parse_metrics, short


class Metrics(unittest.TestCase):
    def test_parse_metrics(self):
        text = ('# HELP x y\n# TYPE toolgate_invocations_total counter\n'
                'toolgate_invocations_total{tool="search",status="READY"} 3\n'
                'toolgate_up 1 1700000000000\n'
                'weird{msg="a \\"quoted\\" \\\\ value",le="+Inf"} +Inf\n\n')
        self.assertEqual(parse_metrics(text), [
            ("toolgate_invocations_total", {"tool": "search", "status": "READY"}, 3.0),
            ("toolgate_up", {}, 1.0),
            ("weird", {"msg": 'a "quoted" \\ value', "le": "+Inf"}, float("inf")),
        ])

    def test_a_bad_line_is_a_mismatch(self):
        for line in ("not a sample line at all", "x{a=\"1\"} many"):
            with self.subTest(line), self.assertRaises(Mismatch):
                parse_metrics(line + "\n")


class Helpers(unittest.TestCase):
    def test_expect_and_short(self):
        expect(True, "never")
        with self.assertRaisesRegex(Mismatch, "^broken$"):
            expect(False, "broken")
        self.assertEqual(short("x" * 10, 5), "xxxxx…")
        self.assertEqual(short({"a": 1}), '{"a": 1}')


def scenario():
    args = argparse.Namespace(agent="http://a/", admin="http://b", telemetry="http://c", wait_seconds=1)
    s = Scenario(args, "admin-token")
    s.run_token = "tok"
    return s


class Answers(unittest.TestCase):
    def setUp(self):
        self.s = scenario()
        self.enterContext(contextlib.redirect_stdout(io.StringIO()))

    def test_ready(self):
        body = {"status": "READY", "tool_call_id": "c1", "evidence_status": "EVIDENCE_FOUND", "result": {}}
        self.assertEqual(self.s.expect_ready("step", (200, body, ""), "c1", "EVIDENCE_FOUND"), body)
        for resp, says in (
                ((502, body, "x"), "expected 200 READY, got 502"),
                ((200, dict(body, status="ERROR"), "x"), "expected status READY"),
                ((200, dict(body, tool_call_id="c2"), "x"), "'c2' is not 'c1'"),
                ((200, dict(body, evidence_status="NO_EVIDENCE"), "x"), "expected EVIDENCE_FOUND"),
                ((200, dict(body, result=[]), "x"), "result is not an object"),
                ((200, dict(body, raw_response={}), "x"), "carries raw_response")):
            with self.subTest(says), self.assertRaisesRegex(Mismatch, f"^step: .*{says}"):
                self.s.expect_ready("step", resp, "c1", "EVIDENCE_FOUND")

    def test_error(self):
        body = {"status": "ERROR", "tool_call_id": "c1", "error": {"code": "TOOL_TIMEOUT", "message": "m"}}
        self.s.expect_error("slow", (504, body, "{}"), 504, "TOOL_TIMEOUT", "c1")
        for resp, says in (
                ((502, body, "{}"), "expected 504 ERROR/TOOL_TIMEOUT, got 502"),
                ((504, dict(body, error={"code": "TOOL_EXECUTION_FAILED", "message": "m"}), "{}"),
                 "expected code TOOL_TIMEOUT"),
                ((504, dict(body, error={"code": "TOOL_TIMEOUT"}), "{}"), "error.message is missing"),
                ((504, dict(body, result={}), "{}"), "carries a result"),
                ((504, body, '{"raw": "RAW-SECRET-MARKER"}'), "leaks the raw tool body")):
            with self.subTest(says), self.assertRaisesRegex(Mismatch, says):
                self.s.expect_error("slow", resp, 504, "TOOL_TIMEOUT", "c1")

    def test_mcp_result(self):
        json_type = {"Content-Type": "application/json; charset=utf-8"}
        body = {"jsonrpc": "2.0", "id": 3, "result": {"tools": []}}
        self.assertEqual(self.s.expect_mcp_result("list", (200, body, "", json_type, 3)), {"tools": []})
        for resp, says in (
                ((200, body, "", {"Content-Type": "text/event-stream"}, 3), "not application/json"),
                ((200, body, "", dict(json_type, **{"Mcp-Session-Id": "s"}), 3), "issued an Mcp-Session-Id"),
                ((200, body, "", json_type, 4), "not the JSON-RPC response to id 4"),
                ((200, {"jsonrpc": "2.0", "id": 3, "error": {}}, "", json_type, 3), "expected a result"),
                ((400, body, "", json_type, 3), "expected HTTP 200, got 400")):
            with self.subTest(says), self.assertRaisesRegex(Mismatch, says):
                self.s.expect_mcp_result("list", resp)

    def test_ids_and_urls(self):
        self.assertEqual(self.s.agent, "http://a")
        self.assertTrue(self.s.run_id.startswith("scn-"))
        self.assertEqual(self.s.workspace, f"/workspace/{self.s.run_id}")
        a, b = self.s.call_id("x"), self.s.call_id("x")
        self.assertNotEqual(a, b)
        self.assertRegex(a, r"^call_x_[0-9a-f]{6}$")


if __name__ == "__main__":
    unittest.main()
