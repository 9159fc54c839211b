#!/usr/bin/env python3
"""The API description against the running sidecar, run by scripts/schemathesis-check.sh in the
virtualenv of scripts/requirements.txt, with TOOLGATE_ADMIN_TOKEN set and the check's config
(its tools) served:

  1. the document: GET /openapi.json (no token) must be docs/openapi.yaml as JSON (else the binary
     is older than the file), a valid OpenAPI 3.1 document (openapi-spec-validator), and every
     response example in it must fit the schema of its response;
  2. creates the run `run-42`, the run the document's examples name;
  3. schemathesis (PyPI, pinned) with the served document, one pass per listener: the `agent`
     operations against --agent with run-42's token, then the `admin` operations against --admin
     with the admin token (that pass also follows the document's links: create a run, then read,
     end, cancel it), then the agent examples once more after run-42 has ended (its token still
     verifies, its calls are RUN_INACTIVE). Checks: not_a_server_error, status_code_conformance,
     content_type_conformance, response_schema_conformance. The seed is fixed and the example
     database off, so a run is reproducible;
  4. probes, between the agent and admin passes, for what the examples cannot reach because
     OpenAPI cannot tie a header to a body (the MCP stateless rules), and for promised headers and
     framing: each answer must fit the document too;
  5. per pass, which documented operation got which answers, and a failure when an outcome the
     examples are there to reach (EXPECTED) was not reached.

Exit 0 only when all pass.
"""

import argparse
import base64
import collections
import http.client
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jsonschema
import yaml
from openapi_spec_validator import validate as validate_openapi

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
RUN_ID = "run-42"
# Every tool of the check's config but `hidden`, so that one answers 403 UNAUTHORIZED.
RUN_TOOLS = ["search", "lookup", "nothing", "capped", "fail", "notjson", "unresolved", "big", "slow",
             "files", "fetch", "writer", "tiny"]
# A schemathesis pass that takes longer than this has hung: it is stopped and fails.
PASS_TIMEOUT_S = 150

# The tool-call routes answer 502, 503 and 504 by design when the tool (or the store) fails: the
# document lists them and response_schema_conformance checks their bodies. A 500 stays a failure,
# and so does any 5xx on the other routes.
SCHEMATHESIS_CONFIG = """
continue-on-failure = true

# Nothing is kept between runs (crash files, learned state): each run starts the same.
[cache]
enabled = false

[[operations]]
include-operation-id = ["invoke", "intercept"]
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "503", "504"]
"""

# The outcomes (see `outcome`) that each pass must reach: a gap means that an example of the
# document or a tool of the check's config drifted, and an edge case is no longer exercised.
INVOKE, INTERCEPT, MCP = ("POST", "/v1/invoke"), ("POST", "/tools/{tool}"), ("POST", "/mcp")
RUNS, RUN = ("POST", "/v1/runs"), ("GET", "/v1/runs/{run_id}")
RECORD = ("GET", "/v1/runs/{run_id}/invocations/{tool_call_id}")
EXPECTED = {
    "agent": [
        *[(*INVOKE, o) for o in [
            "READY/EVIDENCE_FOUND", "READY/NO_EVIDENCE", "DUPLICATE_TOOL_CALL", "BUDGET_EXHAUSTED",
            "TOOL_EXECUTION_FAILED", "PROJECTION_FAILED", "RESULT_TOO_LARGE", "TOOL_TIMEOUT",
            "POLICY_DENIED", "TOOL_NOT_READ_ONLY", "UNAUTHORIZED", "UNKNOWN_TOOL", "RUN_MISMATCH",
            "INVALID_INPUT", "INVALID_TOOL_CALL_ID", "REQUEST_TOO_LARGE", "UNAUTHENTICATED"]],
        *[(*INTERCEPT, o) for o in ["READY/EVIDENCE_FOUND", "RUN_MISMATCH", "INVALID_INPUT"]],
        *[(*MCP, o) for o in ["result", "tool result", "isError/UNKNOWN_TOOL", "REQUEST_TOO_LARGE"]],
        ("GET", "/v1/tools", "body"),
    ],
    "admin": [
        (*RUNS, "body"), (*RUNS, "RUN_EXISTS"), (*RUNS, "INVALID_INPUT"),
        (*RUN, "body"), (*RUN, "NOT_FOUND"), (*RUN, "INVALID_INPUT"),
        ("POST", "/v1/runs/{run_id}/end", "body"), ("POST", "/v1/runs/{run_id}/cancel", "body"),
        ("GET", "/v1/runs/{run_id}/facts", "body"),
        *[(*RECORD, o) for o in ["record READY", "record ERROR", "NOT_FOUND", "INVALID_INPUT"]],
        ("GET", "/v1/failure-attribution", "body"), ("GET", "/openapi.json", "body"),
    ],
    "agent-ended": [(*INVOKE, "RUN_INACTIVE"), (*INTERCEPT, "RUN_INACTIVE"), (*MCP, "isError/RUN_INACTIVE")],
}


# --- the document ---------------------------------------------------------------------------

def pointer(*parts):
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def response_of(doc, path, method, status):
    """(JSON pointer parts, Response Object) of a documented status, or (None, None)."""
    response = doc["paths"][path][method.lower()]["responses"].get(str(status))
    if response is None:
        return None, None
    if "$ref" in response:
        at = response["$ref"][2:].split("/")
        return at, doc["components"]["responses"][at[-1]]
    return ["paths", path, method.lower(), "responses", str(status)], response


def schema_errors(doc, at, media, value):
    """Where `value` does not fit the schema of `media` in the response at `at`."""
    # The document is the root, so its $refs resolve; its other keys are no schema keywords.
    schema = dict(doc, **{"$ref": pointer(*at, "content", media, "schema")})
    return list(jsonschema.Draft202012Validator(schema).iter_errors(value))


def check_examples(doc):
    """(examples checked, problems): every response example fits its schema."""
    problems, count = [], 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status in op.get("responses", {}) if isinstance(op, dict) else ():
                at, response = response_of(doc, path, method, status)
                for media, content in response.get("content", {}).items():
                    examples = [("example", content["example"])] if "example" in content else []
                    examples += [(k, v["value"]) for k, v in content.get("examples", {}).items()]
                    for name, value in examples:
                        count += 1
                        errors = schema_errors(doc, at, media, value)
                        if errors:
                            problems.append(f"{method.upper()} {path} {status} {media} example {name}: "
                                            f"{errors[0].message}")
    return count, problems


def check_document(admin, doc, document):
    """The problems of the served document."""
    status, headers, served = request("GET", f"{admin}/openapi.json")
    if status != 200 or not headers.get("Content-Type", "").startswith("application/json"):
        return [f"GET /openapi.json answered {status} {headers.get('Content-Type')}"]
    if served != doc:
        return [f"GET /openapi.json is not {document}: rebuild the toolgate binary"]
    try:
        validate_openapi(served)
    except Exception as e:  # noqa: BLE001 - the validator's own message says what is wrong
        return [f"{document} is not a valid OpenAPI 3.1 document: {e}"]
    count, problems = check_examples(served)
    print(f"ok   {document}: served as /openapi.json, valid OpenAPI {served['openapi']}, "
          f"{len(served['paths'])} paths, {count} response examples fit their schemas")
    return problems


def conforms(doc, method, path, status, content_type, text):
    """Why an answer does not fit the document (None when it does)."""
    at, response = response_of(doc, path, method, status)
    if response is None:
        return f"HTTP {status} is not documented"
    content = response.get("content")
    if not content:
        return None if not text else f"HTTP {status} has a body, none is documented"
    media = (content_type or "").split(";")[0].strip()
    if media not in content:
        return f"content type {content_type!r} is not documented for HTTP {status}"
    errors = schema_errors(doc, at, media, json.loads(text) if media == "application/json" else text)
    return f"{errors[0].message} at {list(errors[0].absolute_path)}" if errors else None


# --- HTTP -----------------------------------------------------------------------------------

def request(method, url, token=None, body=None):
    """(status, headers, parsed JSON body or None)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    return status, headers, (json.loads(raw) if raw else None)


def send(base, method, path, headers, body):
    """(status, headers, text, "") of one request on a new connection."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode(), ""
    finally:
        conn.close()


class _Kept(io.BytesIO):
    def close(self):  # HTTPResponse closes its stream once it read the body; the rest is wanted
        pass


def send_raw(base, raw):
    """(status, headers, text, what followed until the server closed) of bytes written as they
    are: framings that http.client does not send."""
    url = urllib.parse.urlsplit(base)
    data = b""
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(raw)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            data += b"<the connection stayed open>"
    stream = _Kept(data)

    class Replay:
        def makefile(self, *_args, **_kwargs):
            return stream

    resp = http.client.HTTPResponse(Replay())
    resp.begin()
    text = resp.read().decode()
    return resp.status, resp.headers, text, stream.read().decode(errors="replace")


def create_run(admin, admin_token):
    body = {"run_id": RUN_ID, "tools": RUN_TOOLS,
            "budget": {"max_calls": 1000, "max_calls_per_tool": {"capped": 1}}}
    status, _, answer = request("POST", f"{admin}/v1/runs", admin_token, body)
    if status != 201:
        sys.exit(f"FAIL creating {RUN_ID}: HTTP {status} {answer}")
    print(f"ok   created {RUN_ID}")
    return answer["run_token"]


def end_run(admin, admin_token):
    status, _, _ = request("POST", f"{admin}/v1/runs/{RUN_ID}/end", admin_token)
    if status != 200:
        sys.exit(f"FAIL ending {RUN_ID}: HTTP {status}")
    print(f"ok   ended {RUN_ID}")


# --- probes ---------------------------------------------------------------------------------

STATELESS_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}


def rpc(method, params=None, id_=1):
    message = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params:
        message["params"] = params
    return json.dumps(message)


def probe_cases(agent, admin, run_token, admin_token):
    """(what, base URL, method, documented path, path, headers or None for raw bytes, body,
    expected status, what the answer must show: f(body, headers[, rest]))."""
    bearer = {"Authorization": f"Bearer {run_token}", "Content-Type": "application/json"}

    def stateless(method, name=None, version="2026-07-28"):
        h = dict(bearer, **{"MCP-Protocol-Version": version, "Mcp-Method": method})
        if name is not None:
            h["Mcp-Name"] = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
        return h

    meta = {"_meta": STATELESS_META}
    call_meta = dict(STATELESS_META, **{"toolgate.dev/run_id": RUN_ID,
                                        "toolgate.dev/tool_call_id": "call_probe_1"})
    call = {"name": "search", "arguments": {"q": "probe"}, "_meta": call_meta}
    future = {"_meta": dict(STATELESS_META, **{"io.modelcontextprotocol/protocolVersion": "2099-01-01"})}
    listed = sorted(set(RUN_TOOLS) - {"writer"})
    # Both framings, then a second request on the same connection, which must not be read.
    framed = (b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"0\r\n\r\nGET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
    notification = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
    admin_bearer = {"Authorization": f"Bearer {admin_token}"}
    return [
        ("stateless tools/list: the run's read-only tools, ttlMs, private cacheScope, resultType",
         agent, "POST", "/mcp", "/mcp", stateless("tools/list"), rpc("tools/list", meta), 200,
         lambda b, h: b["result"]["cacheScope"] == "private" and b["result"]["resultType"] == "complete"
         and [t["name"] for t in b["result"]["tools"]] == listed),
        ("stateless server/discover: public cacheScope",
         agent, "POST", "/mcp", "/mcp", stateless("server/discover"), rpc("server/discover", meta), 200,
         lambda b, h: b["result"]["cacheScope"] == "public" and b["result"]["ttlMs"] == 0),
        ("handshake server/discover: no caching fields",
         agent, "POST", "/mcp", "/mcp", bearer, rpc("server/discover"), 200,
         lambda b, h: "ttlMs" not in b["result"] and "resultType" not in b["result"]),
        ("stateless tools/call, Mcp-Name in base64: a READY result",
         agent, "POST", "/mcp", "/mcp", stateless("tools/call", "search"), rpc("tools/call", call), 200,
         lambda b, h: b["result"]["isError"] is False and b["result"]["resultType"] == "complete"),
        ("stateless tools/call, Mcp-Name differs: -32020",
         agent, "POST", "/mcp", "/mcp", stateless("tools/call", "nothing"), rpc("tools/call", call), 400,
         lambda b, h: b["error"]["code"] == -32020),
        ("stateless, an unknown version: -32022 with supported and requested",
         agent, "POST", "/mcp", "/mcp", stateless("tools/list", version="2099-01-01"),
         rpc("tools/list", future), 400,
         lambda b, h: b["error"]["code"] == -32022 and b["error"]["data"]["requested"] == "2099-01-01"),
        ("stateless initialize: 404 -32601",
         agent, "POST", "/mcp", "/mcp", stateless("initialize"), rpc("initialize", meta), 404,
         lambda b, h: b["error"]["code"] == -32601),
        ("stateless, _meta without clientCapabilities: -32602",
         agent, "POST", "/mcp", "/mcp", stateless("tools/list"),
         rpc("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}), 400,
         lambda b, h: b["error"]["code"] == -32602),
        ("a notification: 202, no body",
         agent, "POST", "/mcp", "/mcp", bearer, notification, 202, lambda b, h: b is None),
        ("no run token on /mcp: 401 with WWW-Authenticate: Bearer",
         agent, "POST", "/mcp", "/mcp", {"Content-Type": "application/json"}, rpc("ping"), 401,
         lambda b, h: h.get("WWW-Authenticate") == "Bearer"),
        ("GET /mcp: 405 with Allow: POST",
         agent, "GET", "/mcp", "/mcp", {}, None, 405, lambda b, h: h.get("Allow") == "POST"),
        ("DELETE /mcp: 405 with Allow: POST",
         agent, "DELETE", "/mcp", "/mcp", {}, None, 405, lambda b, h: h.get("Allow") == "POST"),
        ("Content-Length with Transfer-Encoding, agent listener: 400 INVALID_INPUT, then closed",
         agent, "POST", "/v1/invoke", "/v1/invoke", None, framed.replace(b"{path}", b"/v1/invoke"), 400,
         lambda b, h, rest: b["error"]["code"] == "INVALID_INPUT" and h.get("Connection") == "close"
         and rest == ""),
        ("Content-Length with Transfer-Encoding, admin listener: 400 INVALID_INPUT, then closed",
         admin, "POST", "/v1/runs", "/v1/runs", None, framed.replace(b"{path}", b"/v1/runs"), 400,
         lambda b, h, rest: b["error"]["code"] == "INVALID_INPUT" and h.get("Connection") == "close"
         and rest == ""),
        ("an admin route without the admin token: 401",
         admin, "GET", "/v1/runs/{run_id}", f"/v1/runs/{RUN_ID}", {}, None, 401,
         lambda b, h: b["error"]["code"] == "UNAUTHENTICATED"),
        ("/openapi.json with a wrong token is still public",
         admin, "GET", "/openapi.json", "/openapi.json", {"Authorization": "Bearer nope"}, None, 200,
         lambda b, h: b["openapi"] == "3.1.0"),
        ("the record of the READY MCP call: raw_response kept, ttl_ms",
         admin, *RECORD, f"/v1/runs/{RUN_ID}/invocations/call_probe_1", admin_bearer, None, 200,
         lambda b, h: b["status"] == "READY" and b["raw_response"] is not None and b["ttl_ms"] > 0),
    ]


def probes(doc, cases):
    """Runs the probe cases; returns the failed ones."""
    failures = []
    for what, base, method, path_doc, path, headers, body, want, shows in cases:
        if headers is None:
            status, resp_headers, text, rest = send_raw(base, body)
        else:
            status, resp_headers, text, rest = send(base, method, path, headers, body)
        content_type = resp_headers.get("Content-Type") or ""
        problem = conforms(doc, method, path_doc, status, content_type, text)
        if problem is None and status != want:
            problem = f"HTTP {status}, expected {want}"
        if problem is None:
            parsed = json.loads(text) if text and content_type.startswith("application/json") else None
            extra = (rest,) if shows.__code__.co_argcount == 3 else ()
            try:
                shown = shows(parsed, resp_headers, *extra)
            except (KeyError, TypeError, IndexError):
                shown = False
            if not shown:
                problem = "the answer does not show it"
        if problem is None:
            print(f"ok   probe: {what}")
        else:
            print(f"FAIL probe: {what}: {problem}\n       {method} {path} -> {status} {text[:300]}")
            failures.append(what)
    return failures


# --- schemathesis ---------------------------------------------------------------------------

def schemathesis(name, listener, base_url, schema_url, token, phases, args):
    """One schemathesis run over the operations tagged `listener`; True when it passed."""
    config = args.report_dir / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config),
        "run", schema_url,
        "--url", base_url,
        "--include-tag", listener,
        "--header", f"Authorization: Bearer {token}",
        "--checks", CHECKS,
        "--phases", phases,
        "--max-examples", str(args.max_examples),
        "--seed", str(args.seed),
        "--generation-database", "none",
        "--workers", "1",
        "--request-timeout", "10",
        "--max-failures", "25",
        "--no-color",
        "--report", "junit,har",
        "--report-dir", str(args.report_dir),
        "--report-junit-path", str(args.report_dir / f"{name}.xml"),
        "--report-har-path", str(args.report_dir / f"{name}.har"),
    ]
    print(f"\n--- schemathesis, {name}: {listener} listener {base_url}, phases {phases} ---", flush=True)
    started = time.monotonic()
    try:
        env = dict(os.environ, SCHEMATHESIS_TELEMETRY="false")
        rc = subprocess.call(cmd, env=env, timeout=PASS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"--- {name}: stopped after {PASS_TIMEOUT_S}s ---")
        return False
    print(f"--- {name}: exit {rc} in {time.monotonic() - started:.0f}s ---", flush=True)
    return rc == 0


def operations(doc, listener):
    """[(method, path template, regex)] of the operations tagged `listener`."""
    ops = []
    for path, item in doc["paths"].items():
        # `{tool}` is the rest of the path, slashes included; other parameters are one segment.
        segment = ".*" if path.startswith("/tools/") else "[^/]*"
        regex = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", segment, re.escape(path)) + "$")
        for method, op in item.items():
            if isinstance(op, dict) and listener in op.get("tags", []):
                ops.append((method.upper(), path, regex))
    return ops


def outcome(text):
    """What an answer was: READY/<evidence>, an error code, isError/<code>, a record, ..."""
    if not text:
        return "empty"
    try:
        body = json.loads(text)
    except ValueError:
        return "text"
    if not isinstance(body, dict):
        return "json"
    if "ttl_ms" in body and "evidence_status" in body:
        return f"record {body.get('status')}"
    if body.get("status") == "READY":
        return f"READY/{body.get('evidence_status')}"
    if isinstance(body.get("error"), dict):
        return str(body["error"].get("code"))
    result = body.get("result")
    if isinstance(result, dict) and "isError" in result:
        if result["isError"]:
            return f"isError/{result['structuredContent']['error']['code']}"
        return "tool result"
    return "result" if "jsonrpc" in body else "body"


def answers(har_path, doc, listener):
    """{(method, path template): Counter of (status, outcome)}, and a Counter of the statuses
    of requests to undocumented methods (schemathesis probes those too)."""
    ops = operations(doc, listener)
    seen = {(m, p): collections.Counter() for m, p, _ in ops}
    other = collections.Counter()
    for e in json.loads(har_path.read_text())["log"]["entries"]:
        method, path = e["request"]["method"], urllib.parse.urlsplit(e["request"]["url"]).path
        status = e["response"]["status"]
        key = next(((m, p) for m, p, rx in ops if m == method and rx.match(path)), None)
        if key is None:
            other[status] += 1
        else:
            seen[key][(status, outcome(e["response"]["content"].get("text", "")))] += 1
    return seen, other


def gaps(expected, seen):
    """The (method, path template, outcome) of `expected` that no answer in `seen` (as `answers`
    gives it) reached, in the order expected."""
    got = {(m, p, what) for (m, p), counts in seen.items() for _, what in counts}
    return [x for x in expected if x not in got]


def summary(name, listener, seen, other):
    print(f"{name} ({listener} listener): {sum(sum(c.values()) for c in seen.values()) + sum(other.values())}"
          " requests")
    for (method, path), counts in seen.items():
        statuses, outcomes = collections.Counter(), collections.Counter()
        for (status, what), n in counts.items():
            statuses[status] += n
            outcomes[what] += n
        print(f"  {method:6} {path:44} {sum(counts.values()):4}  "
              + " ".join(f"{s}×{n}" for s, n in sorted(statuses.items())))
        if outcomes:
            print(f"  {'':56}" + ", ".join(f"{w} {n}" for w, n in sorted(outcomes.items())))
    if other:
        print(f"  {'undocumented methods':51} {sum(other.values()):4}  "
              + " ".join(f"{s}×{n}" for s, n in sorted(other.items())))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", required=True, help="agent listener base URL")
    parser.add_argument("--admin", required=True, help="admin listener base URL")
    parser.add_argument("--document", default="docs/openapi.yaml")
    parser.add_argument("--report-dir", type=Path, required=True)
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=20261129)
    args = parser.parse_args()
    admin_token = os.environ.get("TOOLGATE_ADMIN_TOKEN", "").strip()
    if not admin_token:
        sys.exit("TOOLGATE_ADMIN_TOKEN is not set")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    with open(args.document) as f:
        doc = yaml.safe_load(f)

    problems = check_document(args.admin, doc, args.document)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    run_token = create_run(args.admin, admin_token)
    schema_url = f"{args.admin}/openapi.json"
    results = {}
    # The agent pass first, while run-42 is ACTIVE: the admin pass's examples end and cancel it.
    results["agent"] = schemathesis("agent", "agent", args.agent, schema_url, run_token,
                                    "examples,coverage,fuzzing", args)
    print("\n--- probes: MCP headers tied to bodies, promised headers, framing ---")
    results["probes"] = not probes(doc, probe_cases(args.agent, args.admin, run_token, admin_token))
    results["admin"] = schemathesis("admin", "admin", args.admin, schema_url, admin_token,
                                    "examples,coverage,fuzzing,stateful", args)
    end_run(args.admin, admin_token)
    results["agent-ended"] = schemathesis("agent-ended", "agent", args.agent, schema_url, run_token,
                                          "examples", args)

    print("\n=== per documented operation: requests, statuses and outcomes ===")
    for name, listener in [("agent", "agent"), ("admin", "admin"), ("agent-ended", "agent")]:
        har = args.report_dir / f"{name}.har"
        if not har.exists():
            results[f"{name} outcomes"] = False
            continue
        seen, other = answers(har, doc, listener)
        summary(name, listener, seen, other)
        missed = gaps(EXPECTED[name], seen)
        for method, path, what in missed:
            print(f"FAIL {name}: no {method} {path} answered {what}: the examples no longer reach it")
        results[f"{name} outcomes"] = not missed
    print()
    for name, ok in results.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
