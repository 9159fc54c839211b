"""Unit tests of schemathesis_check.py's judgements (the document, answers, outcomes, probes):
`.venv/bin/python -m unittest discover -s scripts` (run by `make lint`)."""

import contextlib
import copy
import io
import json
import tempfile
import unittest
from pathlib import Path

from fake_http import FakeHttp

try:
    import schemathesis_check as sc
    import yaml
except ImportError as err:
    raise ImportError(f"{err}: run these tests with the virtualenv of scripts/requirements.txt "
                      "(.venv/bin/python -m unittest discover -s scripts)") from err

ROOT = Path(__file__).resolve().parent.parent
JSON = {"Content-Type": "application/json"}
RUN = {"run_id": "run-42", "state": "ACTIVE"}
DOC = {
    "openapi": "3.1.0",
    "info": {"title": "t", "version": "1"},
    "paths": {
        "/v1/runs/{run_id}": {"get": {"tags": ["admin"], "responses": {
            "200": {"description": "the run", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Run"}, "example": RUN}}},
            "404": {"$ref": "#/components/responses/NotFound"}}}},
        "/tools/{tool}": {"post": {"tags": ["agent"], "responses": {"202": {"description": "taken"}}}},
        "/mcp": {"get": {"tags": ["agent"], "responses": {"405": {"description": "no"}}},
                 "post": {"tags": ["agent"], "responses": {"202": {"description": "taken"}}}},
    },
    "components": {
        "schemas": {
            "Run": {"type": "object", "required": ["run_id", "state"], "properties": {
                "run_id": {"type": "string"}, "state": {"enum": ["ACTIVE", "ENDED"]}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code"], "properties": {"code": {"type": "string"}}}}},
        },
        "responses": {"NotFound": {"description": "none", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"},
            "examples": {"missing": {"value": {"error": {"code": "NOT_FOUND"}}}}}}}},
    },
}


class Document(unittest.TestCase):
    def test_pointer_escapes(self):
        self.assertEqual(sc.pointer("paths", "/v1/runs/{run_id}", "get"), "#/paths/~1v1~1runs~1{run_id}/get")
        self.assertEqual(sc.pointer("a~b", 200), "#/a~0b/200")

    def test_response_of_follows_refs(self):
        at, response = sc.response_of(DOC, "/v1/runs/{run_id}", "GET", 404)
        self.assertEqual(at, ["components", "responses", "NotFound"])
        self.assertEqual(response["description"], "none")
        at, _ = sc.response_of(DOC, "/v1/runs/{run_id}", "get", "200")
        self.assertEqual(at, ["paths", "/v1/runs/{run_id}", "get", "responses", "200"])
        self.assertEqual(sc.response_of(DOC, "/v1/runs/{run_id}", "GET", 500), (None, None))

    def test_examples_must_fit(self):
        self.assertEqual(sc.check_examples(DOC), (2, []))
        bad = copy.deepcopy(DOC)
        bad["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["200"]["content"]["application/json"][
            "example"] = {"run_id": "run-42", "state": "LOST"}
        bad["components"]["responses"]["NotFound"]["content"]["application/json"]["examples"][
            "missing"]["value"] = {"error": {}}
        count, problems = sc.check_examples(bad)
        self.assertEqual(count, 2)
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith("GET /v1/runs/{run_id} 200 application/json example "
                                               "example: 'LOST' is not one of"), problems[0])
        # A shared response's example is checked where an operation uses it.
        self.assertEqual(problems[1], "GET /v1/runs/{run_id} 404 application/json example missing: "
                                      "'code' is a required property")

    def test_the_repositorys_document_examples_fit(self):
        doc = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
        count, problems = sc.check_examples(doc)
        self.assertGreater(count, 10)
        self.assertEqual(problems, [])

    def test_conforms(self):
        path = "/v1/runs/{run_id}"
        self.assertIsNone(sc.conforms(DOC, "GET", path, 200, "application/json", json.dumps(RUN)))
        self.assertIsNone(sc.conforms(DOC, "GET", path, 404, "application/json; charset=utf-8",
                                      '{"error": {"code": "NOT_FOUND"}}'))
        self.assertIsNone(sc.conforms(DOC, "POST", "/tools/{tool}", 202, "", ""))
        for status, ctype, text, says in (
                (500, "application/json", "{}", "HTTP 500 is not documented"),
                (200, "text/plain", "run", "content type 'text/plain' is not documented for HTTP 200"),
                (200, "application/json", '{"run_id": "r"}', "'state' is a required property at []"),
                (200, "application/json", '{"run_id": 7, "state": "ENDED"}', "at ['run_id']")):
            with self.subTest(says=says):
                self.assertIn(says, sc.conforms(DOC, "GET", path, status, ctype, text))
        self.assertEqual(sc.conforms(DOC, "POST", "/tools/{tool}", 202, "text/plain", "x"),
                         "HTTP 202 has a body, none is documented")

    def test_check_document_against_the_served_copy(self):
        doc = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
        with FakeHttp() as server, contextlib.redirect_stdout(io.StringIO()) as out:
            server.answer("/openapi.json", (200, json.dumps(doc), JSON))
            self.assertEqual(sc.check_document(server.url(""), doc, "docs/openapi.yaml"), [])
            self.assertIn("valid OpenAPI 3.1", out.getvalue())
            older = dict(doc, paths={})
            self.assertEqual(sc.check_document(server.url(""), older, "docs/openapi.yaml"),
                             ["GET /openapi.json is not docs/openapi.yaml: rebuild the toolgate binary"])
            server.answer("/openapi.json", (200, "{}", {"Content-Type": "text/plain"}))
            self.assertEqual(sc.check_document(server.url(""), doc, "d"),
                             ["GET /openapi.json answered 200 text/plain"])


class Outcomes(unittest.TestCase):
    def test_outcome(self):
        for body, want in (
                ("", "empty"), ("<html>", "text"), ("[1]", "json"),
                ({"ttl_ms": 1, "evidence_status": None, "status": "ERROR"}, "record ERROR"),
                ({"status": "READY", "evidence_status": "NO_EVIDENCE"}, "READY/NO_EVIDENCE"),
                ({"status": "ERROR", "error": {"code": "TOOL_TIMEOUT"}}, "TOOL_TIMEOUT"),
                ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601}}, "-32601"),
                ({"jsonrpc": "2.0", "id": 1, "result": {"isError": True, "structuredContent": {
                    "error": {"code": "RUN_INACTIVE"}}}}, "isError/RUN_INACTIVE"),
                ({"jsonrpc": "2.0", "id": 1, "result": {"isError": False}}, "tool result"),
                ({"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}, "result"),
                ({"keys": []}, "body")):
            with self.subTest(want=want):
                self.assertEqual(sc.outcome(body if isinstance(body, str) else json.dumps(body)), want)

    def test_operations_match_paths(self):
        ops = {(m, p): rx for m, p, rx in sc.operations(DOC, "agent")}
        self.assertEqual(set(ops), {("POST", "/tools/{tool}"), ("GET", "/mcp"), ("POST", "/mcp")})
        self.assertTrue(ops[("POST", "/tools/{tool}")].match("/tools/a/b"))  # {tool} takes slashes
        admin = {p: rx for _, p, rx in sc.operations(DOC, "admin")}
        self.assertTrue(admin["/v1/runs/{run_id}"].match("/v1/runs/run-42"))
        self.assertFalse(admin["/v1/runs/{run_id}"].match("/v1/runs/a/b"))

    def test_answers_and_gaps(self):
        def entry(method, path, status, body):
            return {"request": {"method": method, "url": f"http://127.0.0.1:1{path}"},
                    "response": {"status": status, "content": {"text": json.dumps(body)}}}

        har = {"log": {"entries": [
            entry("GET", "/v1/runs/run-42", 200, RUN),
            entry("GET", "/v1/runs/nope", 404, {"error": {"code": "NOT_FOUND"}}),
            entry("GET", "/v1/runs/nope?x=1", 404, {"error": {"code": "NOT_FOUND"}}),
            entry("PATCH", "/v1/runs/run-42", 405, {}),
        ]}}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "admin.har")
            path.write_text(json.dumps(har))
            seen, other = sc.answers(path, DOC, "admin")
        key = ("GET", "/v1/runs/{run_id}")
        self.assertEqual(dict(seen[key]), {(200, "body"): 1, (404, "NOT_FOUND"): 2})
        self.assertEqual(dict(other), {405: 1})
        expected = [(*key, "body"), (*key, "NOT_FOUND"), (*key, "INVALID_INPUT")]
        self.assertEqual(sc.gaps(expected, seen), [(*key, "INVALID_INPUT")])
        self.assertEqual(sc.gaps(expected[:2], seen), [])


class Probes(unittest.TestCase):
    def test_each_way_a_probe_fails(self):
        with FakeHttp() as server:
            server.answer("/v1/runs/run-42", (200, json.dumps(RUN), JSON))
            server.answer("/v1/runs/bad", (200, '{"run_id": "bad"}', JSON))
            server.answer("/v1/runs/teapot", (418, "{}", JSON))
            base, path = server.url(""), "/v1/runs/{run_id}"
            raw = b"GET /v1/runs/run-42 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            cases = [
                ("good", base, "GET", path, "/v1/runs/run-42", {}, None, 200,
                 lambda b, h: b["state"] == "ACTIVE"),
                ("good raw", base, "GET", path, "/v1/runs/run-42", None, raw, 200,
                 lambda b, h, rest: b["run_id"] == "run-42" and rest == ""),
                ("other status", base, "GET", path, "/v1/runs/run-42", {}, None, 404, lambda b, h: True),
                ("not shown", base, "GET", path, "/v1/runs/run-42", {}, None, 200,
                 lambda b, h: b["state"] == "ENDED"),
                ("shows raises", base, "GET", path, "/v1/runs/run-42", {}, None, 200,
                 lambda b, h: b["missing"]),
                ("does not fit", base, "GET", path, "/v1/runs/bad", {}, None, 200, lambda b, h: True),
                ("undocumented", base, "GET", path, "/v1/runs/teapot", {}, None, 418, lambda b, h: True),
            ]
            with contextlib.redirect_stdout(io.StringIO()) as out:
                failed = sc.probes(DOC, cases)
        self.assertEqual(failed, ["other status", "not shown", "shows raises", "does not fit",
                                  "undocumented"])
        self.assertIn("FAIL probe: does not fit: 'state' is a required property", out.getvalue())
        self.assertIn("FAIL probe: other status: HTTP 200, expected 404", out.getvalue())


if __name__ == "__main__":
    unittest.main()
