#!/usr/bin/env python3
"""End-to-end scenario against a running toolgate sidecar (standard library only).

It plays both the harness (admin listener, admin token from TOOLGATE_ADMIN_TOKEN) and the agent
(agent listener, run token; over POST /v1/invoke, the intercept route and, as an MCP client,
POST /mcp), against the fake tool's scenario routes (examples/fake_tool.rs,
tests/support/fake_tool.rs) configured as `search`, `big`, `wide`, `fail` and `slow` (see
toolgate-local.yaml). One line is printed per step; the first mismatch stops the run with a
message and exit status 1.

    scenario.py --agent http://127.0.0.1:15001 --admin http://127.0.0.1:15002 \
                --telemetry http://127.0.0.1:15090
"""

import argparse
import json
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request

SECRET_MARKER = "RAW-SECRET-MARKER"
SEARCH_BUDGET = 5
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
MCP_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MCP_VERSION = "2025-11-25"
MCP_TOOLS = ["big", "fail", "search", "slow", "wide"]  # the read-only tools, sorted by name
SEARCH_SCHEMA = {"type": "object", "required": ["q"],
                 "properties": {"q": {"type": "string", "maxLength": 512}}}
LAYERS = ["AGENT", "WORKFLOW", "OPERATOR", "PROVIDER", "HARNESS", "ENVIRONMENT"]
MCP_METHODS = {"initialize", "server/discover", "ping", "tools/list", "tools/call", "notification",
               "_other"}


class Mismatch(Exception):
    """The sidecar answered something the contract does not allow."""


def expect(condition, message):
    if not condition:
        raise Mismatch(message)


def http(method, url, body=None, headers=None, timeout=30.0):
    """One request; returns (status, parsed JSON or text, raw text). Never raises on HTTP errors."""
    status, parsed, text, _ = http_with_headers(method, url, body, headers, timeout)
    return status, parsed, text


def http_with_headers(method, url, body=None, headers=None, timeout=30.0):
    """http(), plus the response headers (an email.message.Message) as a fourth value."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        if data:
            hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, got = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        status, raw, got = err.code, err.read(), err.headers
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return status, parsed, text, got


def short(value, limit=300):
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "…"


class Scenario:
    def __init__(self, args, admin_token):
        self.agent = args.agent.rstrip("/")
        self.admin = args.admin.rstrip("/")
        self.telemetry = args.telemetry.rstrip("/")
        self.wait_seconds = args.wait_seconds
        self.admin_headers = {"Authorization": f"Bearer {admin_token}"}
        self.run_id = f"scn-{int(time.time())}-{secrets.token_hex(3)}"
        self.run_token = None
        self.passed = 0
        self.ready = []  # (tool_call_id, tool, evidence_status, result) of READY calls, in order
        self.mcp_version = None  # MCP-Protocol-Version once initialize agreed on one
        self.mcp_ids = 0
        self.errors = []  # tool_call_ids of calls that ended ERROR after reserving

    # -- helpers -------------------------------------------------------------------------------

    def ok(self, step, detail):
        self.passed += 1
        print(f"ok   {step}: {detail}", flush=True)

    def call_id(self, name):
        return f"call_{name}_{secrets.token_hex(3)}"

    def invoke(self, tool, call_id, tool_input, run_id=None, token=None, extra_headers=None):
        headers = {"Authorization": f"Bearer {token or self.run_token}"}
        headers.update(extra_headers or {})
        body = {"run_id": run_id or self.run_id, "tool_call_id": call_id, "tool": tool,
                "input": tool_input}
        return http("POST", f"{self.agent}/v1/invoke", body, headers)

    def expect_ready(self, step, resp, call_id, evidence):
        status, body, text = resp
        expect(status == 200, f"{step}: expected 200 READY, got {status} {short(text)}")
        expect(isinstance(body, dict) and body.get("status") == "READY",
               f"{step}: expected status READY, got {short(text)}")
        expect(body.get("tool_call_id") == call_id,
               f"{step}: tool_call_id {body.get('tool_call_id')!r} is not {call_id!r}")
        expect(body.get("evidence_status") == evidence,
               f"{step}: expected {evidence}, got {body.get('evidence_status')!r}")
        expect(isinstance(body.get("result"), dict), f"{step}: result is not an object")
        expect("raw_response" not in body, f"{step}: the agent answer carries raw_response")
        return body

    def expect_error(self, step, resp, http_status, code, call_id):
        status, body, text = resp
        expect(status == http_status and isinstance(body, dict) and body.get("status") == "ERROR",
               f"{step}: expected {http_status} ERROR/{code}, got {status} {short(text)}")
        error = body.get("error") or {}
        expect(error.get("code") == code,
               f"{step}: expected code {code}, got {error.get('code')!r} ({short(text)})")
        expect(isinstance(error.get("message"), str) and error["message"],
               f"{step}: error.message is missing")
        expect(body.get("tool_call_id") == call_id,
               f"{step}: tool_call_id {body.get('tool_call_id')!r} is not {call_id!r}")
        expect("result" not in body and "raw_response" not in body,
               f"{step}: an ERROR answer carries a result")
        expect(SECRET_MARKER not in text, f"{step}: the answer leaks the raw tool body")
        return body

    def mcp(self, method, params=None, notification=False):
        """One JSON-RPC message to POST /mcp; returns (status, body, text, headers, id)."""
        message = {"jsonrpc": "2.0", "method": method}
        rpc_id = None
        if not notification:
            self.mcp_ids += 1
            rpc_id = message["id"] = self.mcp_ids
        if params is not None:
            message["params"] = params
        headers = {"Authorization": f"Bearer {self.run_token}",
                   "Accept": "application/json, text/event-stream"}
        if self.mcp_version:
            headers["MCP-Protocol-Version"] = self.mcp_version
        return (*http_with_headers("POST", f"{self.agent}/mcp", message, headers), rpc_id)

    def expect_mcp_result(self, step, resp):
        """A JSON-RPC result in one application/json response, and no MCP session: the result."""
        status, body, text, headers, rpc_id = resp
        expect(status == 200, f"{step}: expected HTTP 200, got {status} {short(text)}")
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        expect(ctype == "application/json", f"{step}: Content-Type is {ctype!r}, not application/json")
        expect(headers.get("Mcp-Session-Id") is None, f"{step}: toolgate issued an Mcp-Session-Id")
        expect(isinstance(body, dict) and body.get("jsonrpc") == "2.0" and body.get("id") == rpc_id,
               f"{step}: not the JSON-RPC response to id {rpc_id}: {short(text)}")
        expect("error" not in body and isinstance(body.get("result"), dict),
               f"{step}: expected a result, got {short(text)}")
        return body["result"]

    def mcp_call(self, tool, call_id, arguments, traceparent=None):
        meta = {"toolgate.dev/run_id": self.run_id, "toolgate.dev/tool_call_id": call_id}
        if traceparent:
            meta["traceparent"] = traceparent
        return self.mcp("tools/call", {"name": tool, "arguments": arguments, "_meta": meta})

    def admin_get(self, path):
        return http("GET", f"{self.admin}{path}", headers=self.admin_headers)

    # -- steps ---------------------------------------------------------------------------------

    def wait_ready(self):
        deadline = time.monotonic() + self.wait_seconds
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status, _, text = http("GET", f"{self.telemetry}/readyz", timeout=2.0)
                if status == 200:
                    self.ok("readyz", f"200 from {self.telemetry}/readyz")
                    return
                last = f"{status} {short(text, 80)}"
            except OSError as err:
                last = str(err)
            time.sleep(0.25)
        raise Mismatch(f"readyz: not 200 within {self.wait_seconds}s (last: {last})")

    def create_run(self):
        body = {"run_id": self.run_id, "timeout_ms": 300000,
                "budget": {"max_calls": 20, "max_calls_per_tool": {"search": SEARCH_BUDGET}}}
        status, resp, text = http("POST", f"{self.admin}/v1/runs", body, self.admin_headers)
        expect(status == 201, f"create run: expected 201, got {status} {short(text)}")
        expect(resp.get("run_id") == self.run_id, f"create run: run_id differs: {short(text)}")
        token = resp.get("run_token")
        expect(isinstance(token, str) and token.startswith(self.run_id + "."),
               f"create run: run_token is not <run_id>.<mac>: {token!r}")
        expect(isinstance(resp.get("deadline"), str) and resp["deadline"].endswith("Z"),
               f"create run: deadline is not RFC 3339 UTC: {resp.get('deadline')!r}")
        self.run_token = token
        self.ok("create run", f"run_id={self.run_id} deadline={resp['deadline']}")

        status, _, text = http("POST", f"{self.admin}/v1/runs", body, self.admin_headers)
        expect(status == 409 and "RUN_EXISTS" in text,
               f"create run twice: expected 409 RUN_EXISTS, got {status} {short(text)}")
        self.ok("create run twice", "409 RUN_EXISTS")

    def unauthenticated(self):
        call_id = self.call_id("noauth")
        resp = self.invoke("search", call_id, {"q": "redis"}, token="not-a-token")
        self.expect_error("bad run token", resp, 401, "UNAUTHENTICATED", call_id)
        self.ok("bad run token", "401 UNAUTHENTICATED")

    def unknown_tool(self):
        call_id = self.call_id("unknown")
        resp = self.invoke("no-such-tool", call_id, {"q": "redis"})
        self.expect_error("unknown tool", resp, 404, "UNKNOWN_TOOL", call_id)
        self.ok("unknown tool", "404 UNKNOWN_TOOL")

    def search_found(self):
        call_id = self.call_id("search")
        resp = self.invoke("search", call_id, {"q": "redis"},
                           extra_headers={"traceparent": TRACEPARENT})
        body = self.expect_ready("search found", resp, call_id, "EVIDENCE_FOUND")
        items = body["result"].get("items")
        expect(isinstance(items, list) and 0 < len(items) <= 5,
               f"search found: expected 1..5 items, got {short(body['result'])}")
        expect(body["result"].get("total_items") == 7,
               f"search found: total_items is {body['result'].get('total_items')!r}, not 7")
        for item in items:
            expect(set(item) <= {"title", "url", "snippet"},
                   f"search found: item keeps fields beyond title/url/snippet: {sorted(item)}")
            expect("extra" not in item, "search found: the `extra` field reached the agent")
        self.ready.append((call_id, "search", "EVIDENCE_FOUND", body["result"]))
        self.first_search = call_id
        self.ok("search found", f"READY EVIDENCE_FOUND, {len(items)} of 7 items, no `extra`")

    def search_nothing(self):
        call_id = self.call_id("nothing")
        body = self.expect_ready("search nothing", self.invoke("search", call_id, {"q": "nothing"}),
                                 call_id, "NO_EVIDENCE")
        scope = body["result"].get("scope") or {}
        expect(scope.get("tool") == "search" and scope.get("input") == {"q": "nothing"},
               f"search nothing: scope is {short(body['result'])}")
        self.ready.append((call_id, "search", "NO_EVIDENCE", body["result"]))
        self.ok("search nothing", "READY NO_EVIDENCE with its scope")

    def too_large_raw(self):
        call_id = self.call_id("big")
        self.expect_error("big (raw)", self.invoke("big", call_id, {}), 502, "RESULT_TOO_LARGE",
                          call_id)
        self.errors.append(call_id)
        self.big_call = call_id
        self.ok("big (raw)", "502 RESULT_TOO_LARGE")

    def too_large_agent(self):
        call_id = self.call_id("wide")
        self.expect_error("wide (agent)", self.invoke("wide", call_id, {}), 502,
                          "RESULT_TOO_LARGE", call_id)
        self.errors.append(call_id)
        self.wide_call = call_id
        self.ok("wide (agent)", "502 RESULT_TOO_LARGE")

    def duplicate(self):
        call_id = self.first_search
        resp = self.invoke("search", call_id, {"q": "again"})
        self.expect_error("duplicate", resp, 409, "DUPLICATE_TOOL_CALL", call_id)
        self.ok("duplicate", f"409 DUPLICATE_TOOL_CALL for {call_id}")

    def failing_tool(self):
        call_id = self.call_id("fail")
        self.expect_error("fail", self.invoke("fail", call_id, {}), 502, "TOOL_EXECUTION_FAILED",
                          call_id)
        self.errors.append(call_id)
        self.fail_call = call_id
        self.ok("fail", f"502 TOOL_EXECUTION_FAILED, no {SECRET_MARKER} in the answer")

    def slow_tool(self):
        call_id = self.call_id("slow")
        self.expect_error("slow", self.invoke("slow", call_id, {"q": "slow"}), 504, "TOOL_TIMEOUT",
                          call_id)
        self.errors.append(call_id)
        self.ok("slow", "504 TOOL_TIMEOUT")

    def intercept(self):
        call_id = self.call_id("intercept")
        headers = {"Authorization": f"Bearer {self.run_token}", "X-Run-Id": self.run_id,
                   "X-Tool-Call-Id": call_id}
        resp = http("POST", f"{self.agent}/tools/search", {"q": "intercept"}, headers)
        body = self.expect_ready("intercept", resp, call_id, "EVIDENCE_FOUND")
        self.ready.append((call_id, "search", "EVIDENCE_FOUND", body["result"]))
        self.ok("intercept", "POST /tools/search → READY EVIDENCE_FOUND")

    def mcp_initialize(self):
        params = {"protocolVersion": MCP_VERSION, "capabilities": {},
                  "clientInfo": {"name": "toolgate-scenario", "version": "1"}}
        result = self.expect_mcp_result("mcp initialize", self.mcp("initialize", params))
        expect(result.get("protocolVersion") == MCP_VERSION,
               f"mcp initialize: protocolVersion is {result.get('protocolVersion')!r}")
        expect(isinstance((result.get("capabilities") or {}).get("tools"), dict),
               f"mcp initialize: no tools capability: {short(result)}")
        expect((result.get("serverInfo") or {}).get("name") == "toolgate",
               f"mcp initialize: serverInfo is {short(result.get('serverInfo'))}")
        self.mcp_version = MCP_VERSION
        status, _, text, _, _ = self.mcp("notifications/initialized", notification=True)
        expect(status == 202 and text == "",
               f"mcp initialized: a notification expects 202 and no body, got {status} {short(text)}")
        self.ok("mcp initialize", f"protocolVersion {MCP_VERSION}, no session; notification → 202")

    def mcp_tools_list(self):
        result = self.expect_mcp_result("mcp tools/list", self.mcp("tools/list"))
        tools = result.get("tools")
        expect(isinstance(tools, list), f"mcp tools/list: tools is not a list: {short(result)}")
        names = [t.get("name") for t in tools]
        expect(names == MCP_TOOLS, f"mcp tools/list: tools {names}, expected {MCP_TOOLS}")
        for t in tools:
            expect(isinstance(t.get("description"), str),
                   f"mcp tools/list: {t['name']} has no string description")
            expect(t.get("annotations") == {"readOnlyHint": True},
                   f"mcp tools/list: {t['name']} annotations are {t.get('annotations')!r}")
            schema = SEARCH_SCHEMA if t["name"] == "search" else {"type": "object"}
            expect(t.get("inputSchema") == schema,
                   f"mcp tools/list: {t['name']} inputSchema is {short(t.get('inputSchema'))}")
        expect("ttlMs" not in result and "cacheScope" not in result,
               "mcp tools/list: a handshake-era result carries caching fields")
        self.ok("mcp tools/list", f"{len(tools)} read-only tools with their input schemas")

    def mcp_ready(self):
        call_id = self.call_id("mcp")
        result = self.expect_mcp_result(
            "mcp tools/call", self.mcp_call("search", call_id, {"q": "mcp"}, MCP_TRACEPARENT))
        expect(result.get("isError") is False, f"mcp tools/call: isError is {result.get('isError')!r}")
        meta = result.get("_meta") or {}
        expect(meta.get("toolgate.dev/tool_call_id") == call_id
               and meta.get("toolgate.dev/evidence_status") == "EVIDENCE_FOUND",
               f"mcp tools/call: _meta is {short(meta)}")
        structured = result.get("structuredContent")
        expect(isinstance(structured, dict), "mcp tools/call: structuredContent is not an object")
        items = structured.get("items")
        expect(isinstance(items, list) and 0 < len(items) <= 5 and structured.get("total_items") == 7,
               f"mcp tools/call: expected 1..5 of 7 items, got {short(structured)}")
        for item in items:
            expect(set(item) <= {"title", "url", "snippet"},
                   f"mcp tools/call: item keeps fields beyond title/url/snippet: {sorted(item)}")
        content = result.get("content")
        expect(isinstance(content, list) and len(content) == 1
               and content[0].get("type") == "text",
               f"mcp tools/call: content is {short(content)}")
        try:
            text_value = json.loads(content[0].get("text") or "")
        except ValueError:
            text_value = None
        expect(text_value == structured, "mcp tools/call: the text content is not the result's JSON")
        expect("raw_response" not in json.dumps(result), "mcp tools/call: the raw response leaked")
        self.ready.append((call_id, "search", "EVIDENCE_FOUND", structured))
        self.mcp_search = call_id
        self.ok("mcp tools/call", f"READY as structuredContent ({len(items)} of 7 items) and text")

    def mcp_unknown_tool(self):
        call_id = self.call_id("mcpunknown")
        result = self.expect_mcp_result(
            "mcp unknown tool", self.mcp_call("no-such-tool", call_id, {"q": "redis"}))
        expect(result.get("isError") is True,
               f"mcp unknown tool: expected an isError result, got {short(result)}")
        body = result.get("structuredContent") or {}
        error = body.get("error") or {}
        expect(body.get("status") == "ERROR" and error.get("code") == "UNKNOWN_TOOL"
               and body.get("tool_call_id") == call_id and "result" not in body,
               f"mcp unknown tool: structuredContent is {short(body)}")
        content = result.get("content") or [{}]
        expect(str(content[0].get("text", "")).startswith("UNKNOWN_TOOL:"),
               f"mcp unknown tool: content is {short(content)}")
        expect((result.get("_meta") or {}).get("toolgate.dev/tool_call_id") == call_id,
               f"mcp unknown tool: _meta is {short(result.get('_meta'))}")
        self.ok("mcp unknown tool", "isError result carrying UNKNOWN_TOOL, not a JSON-RPC error")

    def budget(self):
        used = sum(1 for r in self.ready if r[1] == "search")
        for n in range(used, SEARCH_BUDGET):
            call_id = self.call_id(f"budget{n}")
            body = self.expect_ready("budget", self.invoke("search", call_id, {"q": f"b{n}"}),
                                     call_id, "EVIDENCE_FOUND")
            self.ready.append((call_id, "search", "EVIDENCE_FOUND", body["result"]))
        call_id = self.call_id("over")
        self.expect_error("budget", self.invoke("search", call_id, {"q": "over"}), 429,
                          "BUDGET_EXHAUSTED", call_id)
        self.over_budget_call = call_id
        self.ok("budget", f"search allowed {SEARCH_BUDGET} calls, then 429 BUDGET_EXHAUSTED")

    def check_facts(self, step, body):
        expect(isinstance(body, dict) and body.get("run_id") == self.run_id,
               f"{step}: not this run's facts: {short(body)}")
        facts = body.get("facts")
        expect(isinstance(facts, list), f"{step}: facts is not a list")
        got = [f.get("tool_call_id") for f in facts]
        want = [r[0] for r in self.ready]
        expect(got == want, f"{step}: facts {got} are not the READY calls {want} in order")
        for fact, (call_id, tool, evidence, result) in zip(facts, self.ready, strict=True):
            expect(fact.get("tool") == tool and fact.get("evidence_status") == evidence,
                   f"{step}: fact {call_id} is {short(fact)}")
            expect(fact.get("result") == result,
                   f"{step}: fact {call_id} result differs from what the agent got")
        expect(body.get("excluded") == len(self.errors),
               f"{step}: excluded is {body.get('excluded')!r}, expected {len(self.errors)} "
               f"(the ERROR calls)")
        return len(facts)

    def facts(self):
        status, body, text = self.admin_get(f"/v1/runs/{self.run_id}/facts")
        expect(status == 200, f"facts: expected 200, got {status} {short(text)}")
        n = self.check_facts("facts", body)
        self.ok("facts", f"{n} READY facts in order, excluded={len(self.errors)}")

    def records(self):
        path = f"/v1/runs/{self.run_id}/invocations"
        status, rec, text = self.admin_get(f"{path}/{self.first_search}")
        expect(status == 200, f"record: expected 200, got {status} {short(text)}")
        for key in ["schema", "run_id", "tool_call_id", "tool", "status", "evidence_status",
                    "request", "raw_response", "agent_result", "error_code", "upstream_status",
                    "created_at", "updated_at", "duration_ms", "ttl_ms"]:
            expect(key in rec, f"record: field {key} is missing")
        expect(rec["status"] == "READY" and rec["evidence_status"] == "EVIDENCE_FOUND",
               f"record: status {rec['status']}/{rec['evidence_status']}")
        expect(rec["request"] == {"q": "redis"}, f"record: request is {short(rec['request'])}")
        raw = rec["raw_response"]
        expect(isinstance(raw, dict) and len(raw.get("results", [])) == 7,
               f"record: raw_response is not the tool's full answer: {short(raw)}")
        echoed = raw["results"][0].get("extra", {}).get("request", {})
        expect(echoed.get("run_id") == self.run_id and echoed.get("tool_call_id") == self.first_search,
               f"record: X-Run-Id/X-Tool-Call-Id were not forwarded: {echoed}")
        expect(echoed.get("traceparent") == TRACEPARENT,
               f"record: traceparent was not forwarded: {echoed.get('traceparent')!r}")
        expect(rec["agent_result"] == self.ready[0][3], "record: agent_result differs")
        expect(isinstance(rec["ttl_ms"], int) and rec["ttl_ms"] > 0,
               f"record: ttl_ms is {rec['ttl_ms']!r}")
        self.ok("record", "raw_response (7 items, forwarded headers) is kept for the harness")

        status, rec, text = self.admin_get(f"{path}/{self.mcp_search}")
        expect(status == 200 and rec.get("status") == "READY" and rec.get("request") == {"q": "mcp"},
               f"mcp record: expected READY with the arguments as request, got {short(text)}")
        echoed = ((rec.get("raw_response") or {}).get("results") or [{}])[0].get("extra", {}) \
            .get("request", {})
        expect(echoed.get("run_id") == self.run_id and echoed.get("tool_call_id") == self.mcp_search
               and echoed.get("traceparent") == MCP_TRACEPARENT,
               f"mcp record: the _meta ids and traceparent were not forwarded: {echoed}")
        self.ok("mcp record", "the arguments are the request; _meta ids and traceparent forwarded")

        status, rec, text = self.admin_get(f"{path}/{self.fail_call}")
        expect(status == 200 and rec.get("status") == "ERROR"
               and rec.get("error_code") == "TOOL_EXECUTION_FAILED"
               and rec.get("evidence_status") == "ERROR" and rec.get("upstream_status") == 500,
               f"fail record: {short(text)}")
        expect(isinstance(rec.get("raw_response"), str) and SECRET_MARKER in rec["raw_response"],
               f"fail record: the diagnosis body is not kept: {short(rec.get('raw_response'))}")
        self.ok("fail record", "ERROR/TOOL_EXECUTION_FAILED, upstream 500, body kept for diagnosis")

        status, rec, text = self.admin_get(f"{path}/{self.big_call}")
        expect(status == 200 and rec.get("error_code") == "RESULT_TOO_LARGE"
               and rec.get("raw_response") is None,
               f"big record: expected RESULT_TOO_LARGE without raw, got {short(text)}")
        status, rec, text = self.admin_get(f"{path}/{self.wide_call}")
        expect(status == 200 and rec.get("error_code") == "RESULT_TOO_LARGE"
               and rec.get("raw_response") is not None and rec.get("agent_result") is None,
               f"wide record: expected raw kept and no agent result, got {short(text)}")
        self.ok("too-large records", "raw stage keeps no raw; agent stage keeps raw, no result")

        status, _, text = self.admin_get(f"{path}/{self.over_budget_call}")
        expect(status == 404 and "NOT_FOUND" in text,
               f"rejected call: a record exists for a call refused by the budget ({status})")
        self.ok("rejected call", "no record for the call refused by the budget (404 NOT_FOUND)")

    def run_state(self):
        status, body, text = self.admin_get(f"/v1/runs/{self.run_id}")
        expect(status == 200 and body.get("state") == "ACTIVE",
               f"run: expected 200 ACTIVE, got {status} {short(text)}")
        reserved = len(self.ready) + len(self.errors)
        expect(body.get("calls_used") == reserved,
               f"run: calls_used is {body.get('calls_used')!r}, expected {reserved}")
        expect(isinstance(body.get("record_bytes_used"), int) and body["record_bytes_used"] > 0,
               f"run: record_bytes_used is {body.get('record_bytes_used')!r}")
        self.ok("run", f"ACTIVE, calls_used={reserved}, record_bytes_used={body['record_bytes_used']}")

    def end_run(self):
        status, body, text = http("POST", f"{self.admin}/v1/runs/{self.run_id}/end", b"",
                                  self.admin_headers)
        expect(status == 200, f"end: expected 200, got {status} {short(text)}")
        self.check_facts("end", body)
        status, body, text = self.admin_get(f"/v1/runs/{self.run_id}")
        expect(status == 200 and body.get("state") == "ENDED",
               f"end: state is not ENDED: {short(text)}")
        call_id = self.call_id("late")
        self.expect_error("after end", self.invoke("search", call_id, {"q": "late"}), 409,
                          "RUN_INACTIVE", call_id)
        self.ok("end run", "ENDED, facts returned, later calls get 409 RUN_INACTIVE")

    def attribution(self):
        status, body, text = self.admin_get("/v1/failure-attribution")
        expect(status == 200 and isinstance(body, dict), f"attribution: {status} {short(text)}")
        layers = body.get("by_layer") or {}
        missing = [layer for layer in LAYERS if layer not in layers]
        expect(not missing, f"attribution: layers {missing} are not listed")
        by_code = body.get("by_code") or {}
        for code in ["TOOL_EXECUTION_FAILED", "RESULT_TOO_LARGE", "TOOL_TIMEOUT",
                     "DUPLICATE_TOOL_CALL", "BUDGET_EXHAUSTED", "UNKNOWN_TOOL", "RUN_INACTIVE"]:
            expect(by_code.get(code, 0) >= 1, f"attribution: by_code has no {code}")
        expect(body.get("total", 0) >= 9, f"attribution: total is {body.get('total')!r}")
        self.ok("failure attribution", f"total={body['total']}, every layer listed")

    def metrics(self):
        status, _, text = http("GET", f"{self.telemetry}/metrics")
        expect(status == 200, f"metrics: expected 200, got {status}")
        samples = parse_metrics(text)

        def need(name, minimum=1.0, **labels):
            total = sum(v for n, ls, v in samples
                        if n == name and all(ls.get(k) == str(w) for k, w in labels.items()))
            shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
            expect(total >= minimum, f"metrics: {name}{{{shown}}} is {total}, expected ≥ {minimum}")

        need("toolgate_invocations_total", 3, tool="search", status="READY",
             evidence_status="EVIDENCE_FOUND")
        need("toolgate_invocations_total", 1, tool="search", status="READY",
             evidence_status="NO_EVIDENCE")
        need("toolgate_invocations_total", 1, tool="fail", status="ERROR")
        need("toolgate_result_too_large_total", stage="raw", tool="big")
        need("toolgate_result_too_large_total", stage="agent", tool="wide")
        need("toolgate_preflight_rejections_total", tool="search", code="DUPLICATE_TOOL_CALL")
        need("toolgate_preflight_rejections_total", tool="search", code="BUDGET_EXHAUSTED")
        # One unknown tool on /v1/invoke, one over MCP: counted alike.
        need("toolgate_preflight_rejections_total", 2, tool="_unknown", code="UNKNOWN_TOOL")
        need("toolgate_preflight_rejections_total", code="UNAUTHENTICATED")
        need("toolgate_failures_total", layer="PROVIDER", code="TOOL_EXECUTION_FAILED")
        need("toolgate_failures_total", layer="PROVIDER", code="TOOL_TIMEOUT")
        need("toolgate_failures_total", layer="PROVIDER", code="RESULT_TOO_LARGE")
        need("toolgate_failures_total", layer="HARNESS", code="RESULT_TOO_LARGE")
        need("toolgate_failures_total", layer="AGENT", code="DUPLICATE_TOOL_CALL")
        need("toolgate_failures_total", layer="WORKFLOW", code="BUDGET_EXHAUSTED")
        need("toolgate_failures_total", layer="WORKFLOW", code="RUN_INACTIVE")
        need("toolgate_invocation_duration_seconds_count", 3, tool="search", status="READY")
        need("toolgate_invocation_duration_seconds_bucket", 3, tool="search", status="READY",
             le="+Inf")
        need("toolgate_upstream_duration_seconds_count", 3, tool="search")
        need("toolgate_store_operation_duration_seconds_count")
        need("toolgate_mcp_requests_total", method="initialize", outcome="ok")
        need("toolgate_mcp_requests_total", method="notification", outcome="ok")
        need("toolgate_mcp_requests_total", method="tools/list", outcome="ok")
        need("toolgate_mcp_requests_total", method="tools/call", outcome="ok")
        need("toolgate_mcp_requests_total", method="tools/call", outcome="error")
        expect(any(n == "toolgate_invocations_in_flight" and ls.get("tool") == "search"
                   for n, ls, _ in samples),
               'metrics: toolgate_invocations_in_flight{tool="search"} is missing')
        # No step provokes store errors or config reloads, and an exposition may leave a family
        # without samples out; when present, their labels must come from the closed sets.
        for n, ls, _ in samples:
            if n == "toolgate_store_errors_total":
                expect("op" in ls, f"metrics: {n} without an op label")
            if n == "toolgate_config_reloads_total":
                expect(ls.get("result") in ("ok", "error"), f"metrics: {n} result {ls}")
            if n == "toolgate_mcp_requests_total":
                expect(ls.get("method") in MCP_METHODS and ls.get("outcome") in ("ok", "error"),
                       f"metrics: {n} labels {ls}")
        for label_set in (ls for _, ls, _ in samples):
            tool = label_set.get("tool")
            expect(tool is None or tool in {"search", "big", "wide", "fail", "slow", "_unknown"},
                   f"metrics: unbounded tool label {tool!r}")
        expect(self.run_id not in text and self.first_search not in text,
               "metrics: a run or call id appears in the metrics")
        self.ok("metrics", f"{len(samples)} samples; the expected names and labels, no ids")


SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text (or OpenMetrics) exposition → [(name, {label: value}, float)]."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE_RE.match(line)
        if not match:
            raise Mismatch(f"metrics: unparseable line {line!r}")
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in LABEL_RE.findall(match.group(3) or "")}
        try:
            value = float(match.group(4))
        except ValueError:
            raise Mismatch(f"metrics: bad value in {line!r}") from None
        samples.append((match.group(1), labels, value))
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True, help="agent listener base URL")
    parser.add_argument("--admin", required=True, help="admin listener base URL")
    parser.add_argument("--telemetry", required=True, help="telemetry listener base URL")
    parser.add_argument("--wait-seconds", type=float, default=60.0,
                        help="how long to wait for /readyz (default 60)")
    args = parser.parse_args()
    token = os.environ.get("TOOLGATE_ADMIN_TOKEN", "")
    if not token:
        print("scenario: TOOLGATE_ADMIN_TOKEN is not set", file=sys.stderr)
        return 2

    scenario = Scenario(args, token)
    steps = [scenario.wait_ready, scenario.create_run, scenario.unauthenticated,
             scenario.unknown_tool, scenario.search_found, scenario.search_nothing,
             scenario.too_large_raw, scenario.too_large_agent, scenario.duplicate,
             scenario.failing_tool, scenario.slow_tool, scenario.intercept,
             scenario.mcp_initialize, scenario.mcp_tools_list, scenario.mcp_ready,
             scenario.mcp_unknown_tool, scenario.budget,
             scenario.facts, scenario.records, scenario.run_state, scenario.end_run,
             scenario.attribution, scenario.metrics]
    try:
        for step in steps:
            step()
    except Mismatch as err:
        print(f"FAIL {err}", flush=True)
        print(f"scenario: {scenario.passed} passed, 1 failed", flush=True)
        return 1
    except OSError as err:
        print(f"FAIL cannot reach toolgate: {err}", flush=True)
        print(f"scenario: {scenario.passed} passed, 1 failed", flush=True)
        return 1
    print(f"scenario: {scenario.passed} passed, 0 failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
