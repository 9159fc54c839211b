"""The sync client against a real toolgate: every Harness, Run and Agent method, and every error
code a client can provoke on the memory store."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from conftest import Sidecar, new_id

from toolgate import Agent, Fact, Facts, Harness, Run, ToolgateError, ToolResult


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[Harness]:
    with Harness(sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url) as h:
        yield h


def refused(info: pytest.ExceptionInfo[ToolgateError], code: str, http_status: int | None) -> ToolgateError:
    """The raised error, checked for its code and status and for the one string form."""
    err = info.value
    assert (err.code, err.http_status) == (code, http_status), repr(err)
    assert str(err) == f"{code}: {err.message}"
    assert err.message
    return err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --- Harness and Run ---------------------------------------------------------------------------


def test_create_run_returns_its_token_and_an_aware_deadline(harness: Harness, run_id: str) -> None:
    before = datetime.now(timezone.utc)
    run = harness.create_run(run_id, tools=["search"], timeout_ms=120_000)
    assert isinstance(run, Run)
    assert run.run_id == run_id
    assert run.run_token.startswith(run_id + ".") and len(run.run_token) > len(run_id) + 1
    assert run.deadline.tzinfo is not None
    assert run.deadline.utcoffset() == timedelta(0)
    assert before + timedelta(seconds=115) < run.deadline < before + timedelta(seconds=125)


def test_create_run_sends_every_field(harness: Harness, run_id: str) -> None:
    budget = {"max_calls": 7, "max_calls_per_tool": {"search": 3}, "max_record_bytes": 100_000}
    run = harness.create_run(
        run_id, tools=["search", "echo"], timeout_ms=60_000, budget=budget, workspace="/srv/w", home="/home/a"
    )
    state = run.state()
    assert state["run_id"] == run_id
    assert state["state"] == "ACTIVE"
    assert state["tools"] == ["search", "echo"]
    assert state["budget"] == budget
    assert (state["workspace"], state["home"]) == ("/srv/w", "/home/a")
    assert state["calls_used"] == 0


def test_create_run_with_defaults(harness: Harness, run_id: str) -> None:
    state = harness.create_run(run_id).state()
    assert state["tools"] is None
    assert state["budget"]["max_calls"] == 100
    assert state["workspace"] == "/workspace"


def test_a_taken_run_id_is_run_exists(harness: Harness, run_id: str) -> None:
    harness.create_run(run_id)
    with pytest.raises(ToolgateError) as info:
        harness.create_run(run_id)
    assert refused(info, "RUN_EXISTS", 409).tool_call_id is None


@pytest.mark.parametrize(
    "fields",
    [
        {"workspace": "relative/dir"},
        {"home": "/"},
        {"timeout_ms": 3_600_001},
        {"budget": {"max_calls": 1, "unknown": 2}},
    ],
)
def test_a_bad_create_body_is_invalid_input(harness: Harness, run_id: str, fields: dict[str, Any]) -> None:
    with pytest.raises(ToolgateError) as info:
        harness.create_run(run_id, **fields)
    refused(info, "INVALID_INPUT", 400)


def test_an_unsafe_run_id_is_invalid_input(harness: Harness) -> None:
    with pytest.raises(ToolgateError) as info:
        harness.create_run("bad id")
    refused(info, "INVALID_INPUT", 400)


def test_a_bad_admin_token_is_unauthenticated(sidecar: Sidecar, run_id: str) -> None:
    with Harness(sidecar.admin_url, admin_token="not-the-admin-token") as h:
        with pytest.raises(ToolgateError) as info:
            h.create_run(run_id)
    err = refused(info, "UNAUTHENTICATED", 401)
    assert "not-the-admin-token" not in f"{err} {err!r} {h!r}"


def test_an_empty_admin_token_is_refused_before_any_request(sidecar: Sidecar) -> None:
    with pytest.raises(ValueError):
        Harness(sidecar.admin_url, admin_token="")


def test_every_run_method_on_an_unknown_run_is_not_found(harness: Harness) -> None:
    run_id = new_id("run")
    with pytest.raises(ToolgateError) as info:
        harness.attach(run_id, f"{run_id}.forged")
    refused(info, "NOT_FOUND", 404)
    ghost = Run(harness, run_id, f"{run_id}.forged", datetime.now(timezone.utc))
    calls: list[Callable[[], object]] = [
        ghost.end,
        ghost.cancel,
        ghost.facts,
        ghost.state,
        lambda: ghost.invocation("c1"),
    ]
    for call in calls:
        with pytest.raises(ToolgateError) as info:
            call()
        refused(info, "NOT_FOUND", 404)


def test_an_unknown_record_is_not_found(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    with pytest.raises(ToolgateError) as info:
        run.invocation("call-never-made")
    refused(info, "NOT_FOUND", 404)
    with pytest.raises(ToolgateError) as info:
        run.invocation("bad id")
    refused(info, "INVALID_INPUT", 400)


def test_end_returns_the_facts_and_ends_the_run(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo", "fail"])
    agent = run.agent()
    agent.invoke("search", {"q": "redis"}, tool_call_id="call_1")
    with pytest.raises(ToolgateError):
        agent.invoke("fail", {}, tool_call_id="call_2")
    agent.invoke("echo", {"x": 1}, tool_call_id="call_3")
    agent.invoke("search", {"q": "nothing"}, tool_call_id="call_4")

    facts = run.end()
    assert isinstance(facts, Facts)
    assert facts.run_id == run_id
    assert [f.tool_call_id for f in facts.facts] == ["call_1", "call_3", "call_4"]
    assert all(isinstance(f, Fact) for f in facts.facts)
    assert facts.facts[0].tool == "search"
    assert facts.facts[0].evidence_status == "EVIDENCE_FOUND"
    assert facts.facts[0].result["total_items"] == 7
    assert facts.facts[1].result == {"item": {"x": 1}}
    assert facts.facts[2].evidence_status == "NO_EVIDENCE"
    assert (facts.excluded, facts.tampered) == (1, 0)

    assert run.state()["state"] == "ENDED"
    assert run.end() == facts  # ending again answers the same facts
    assert run.facts() == facts
    with pytest.raises(ToolgateError) as info:
        agent.invoke("search", {"q": "redis"}, tool_call_id="call_5")
    assert refused(info, "RUN_INACTIVE", 409).tool_call_id == "call_5"


def test_cancel_returns_the_run_view(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    view = run.cancel()
    assert view["run_id"] == run_id
    assert view["state"] == "CANCELLED"
    assert run.cancel()["state"] == "CANCELLED"
    assert run.end().facts == []
    assert run.state()["state"] == "CANCELLED"
    with pytest.raises(ToolgateError) as info:
        run.agent().invoke("echo", {}, tool_call_id="after-cancel")
    refused(info, "RUN_INACTIVE", 409)


def test_facts_while_the_run_is_active(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    assert run.facts() == Facts(run_id=run_id, facts=[], excluded=0, tampered=0)
    run.agent().invoke("echo", {"a": [1, 2]}, tool_call_id="c1")
    facts = run.facts()
    assert facts.facts == [
        Fact(tool_call_id="c1", tool="echo", evidence_status="EVIDENCE_FOUND", result={"item": {"a": [1, 2]}})
    ]
    assert run.state()["state"] == "ACTIVE"


def test_invocation_is_the_whole_record(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    agent = run.agent()
    agent.invoke("search", {"q": "redis"}, tool_call_id="call_rec")
    record = run.invocation("call_rec")
    assert record["run_id"] == run_id
    assert record["tool_call_id"] == "call_rec"
    assert (record["tool"], record["status"], record["evidence_status"]) == (
        "search",
        "READY",
        "EVIDENCE_FOUND",
    )
    assert record["request"] == {"q": "redis"}
    assert len(record["raw_response"]["results"]) == 7  # the raw response: only the harness sees it
    assert record["agent_result"]["total_items"] == 7
    assert record["ttl_ms"] > 0


def b64url(text: str) -> bytes:
    """base64url without padding, decoded."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_evidence_is_the_signed_bundle(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    run.agent().invoke("echo", {"e": 1}, tool_call_id="ev-1")
    bundle = run.evidence()
    assert set(bundle) == {"payload", "signatures"}
    assert len(bundle["signatures"]) == 1
    protected = json.loads(b64url(bundle["signatures"][0]["protected"]))
    assert protected["alg"] == "EdDSA" and protected["typ"] == "toolgate-evidence+json"
    statement = json.loads(b64url(bundle["payload"]))
    assert statement["typ"] == "toolgate.evidence.v1"
    assert (statement["run_id"], statement["state"]) == (run_id, "ACTIVE")
    assert [(f["seq"], f["tool_call_id"]) for f in statement["facts"]] == [(1, "ev-1")]


def test_the_run_block_ends_the_run_on_normal_exit(harness: Harness, run_id: str) -> None:
    with harness.run(run_id, tools=["echo"]) as run:
        run.agent().invoke("echo", {"n": 1}, tool_call_id="c1")
        assert run.state()["state"] == "ACTIVE"
    assert run.state()["state"] == "ENDED"
    assert [f.tool_call_id for f in run.facts().facts] == ["c1"]


def test_the_run_block_cancels_the_run_on_an_exception(harness: Harness, run_id: str) -> None:
    handle: list[Run] = []
    with pytest.raises(RuntimeError, match="agent crashed"):
        with harness.run(run_id) as run:
            handle.append(run)
            raise RuntimeError("agent crashed")
    assert handle[0].state()["state"] == "CANCELLED"


def test_the_run_block_raises_a_create_error(harness: Harness, run_id: str) -> None:
    harness.create_run(run_id)
    with pytest.raises(ToolgateError) as info:
        with harness.run(run_id):
            raise AssertionError("the block must not run")
    refused(info, "RUN_EXISTS", 409)


def test_attach_makes_a_handle_from_a_kept_token(harness: Harness, run_id: str) -> None:
    created = harness.create_run(run_id, tools=["echo"])
    run = harness.attach(run_id, created.run_token)
    assert (run.run_id, run.run_token, run.deadline) == (created.run_id, created.run_token, created.deadline)
    assert run.agent().invoke("echo", {}, tool_call_id="c1").status == "READY"
    with pytest.raises(ValueError):
        harness.attach("another-run", created.run_token)


def test_run_agent_needs_an_agent_url(sidecar: Sidecar, run_id: str) -> None:
    with Harness(sidecar.admin_url, admin_token=sidecar.admin_token) as h:
        run = h.create_run(run_id)
        with pytest.raises(ValueError, match="agent_url"):
            run.agent()


def test_reprs_and_errors_never_show_a_token(harness: Harness, sidecar: Sidecar, run_id: str) -> None:
    run = harness.create_run(run_id)
    agent = run.agent()
    with pytest.raises(ToolgateError) as info:
        agent.invoke("nope", {}, tool_call_id="c1")
    shown = " ".join([repr(harness), repr(run), repr(agent), str(info.value), repr(info.value)])
    assert run_id in repr(run) and run_id in repr(agent)
    mac = run.run_token.rpartition(".")[2]
    assert mac not in shown
    assert sidecar.admin_token not in shown


def test_a_harness_closes_only_its_own_client(sidecar: Sidecar) -> None:
    with httpx.Client() as client:
        harness = Harness(sidecar.admin_url, admin_token=sidecar.admin_token, http_client=client)
        harness.create_run(new_id("run"))
        harness.close()
        assert not client.is_closed
        harness.create_run(new_id("run"))
    own = Harness(sidecar.admin_url, admin_token=sidecar.admin_token)
    own.close()
    with pytest.raises(RuntimeError):
        own.create_run(new_id("run"))


# --- Agent -------------------------------------------------------------------------------------


def test_the_agent_takes_the_run_id_from_the_token(sidecar: Sidecar) -> None:
    assert Agent(sidecar.agent_url, "run-1.abc").run_id == "run-1"
    assert Agent(sidecar.agent_url, "run.v2.abc").run_id == "run.v2"
    for token in ["no-dot-secret", ".secret", "run-1."]:
        with pytest.raises(ValueError) as info:
            Agent(sidecar.agent_url, token)
        assert token not in str(info.value)


def test_tools_lists_the_runs_read_only_tools(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo", "write_note", "not-configured"])
    tools = run.agent().tools()
    assert sorted(t["name"] for t in tools) == ["echo", "search"]
    by_name = {t["name"]: t for t in tools}
    assert by_name["search"]["description"] == "Search the sample index."
    assert by_name["search"]["input_schema"] == {
        "type": "object",
        "required": ["q"],
        "properties": {"q": {"type": "string", "maxLength": 512}},
    }
    assert by_name["echo"]["input_schema"] == {"type": "object"}


def test_tools_of_a_run_without_a_tool_list(harness: Harness, run_id: str) -> None:
    names = {t["name"] for t in harness.create_run(run_id).agent().tools()}
    assert names == {"search", "echo", "fail", "slow", "big", "read_file"}


def test_invoke_returns_the_projected_result(harness: Harness, run_id: str) -> None:
    agent = harness.create_run(run_id).agent()
    result = agent.invoke("search", {"q": "redis"}, tool_call_id="call_abc")
    assert isinstance(result, ToolResult)
    assert (result.status, result.tool_call_id, result.evidence_status) == (
        "READY",
        "call_abc",
        "EVIDENCE_FOUND",
    )
    assert result.result["total_items"] == 7
    assert len(result.result["items"]) == 5
    assert set(result.result["items"][0]) == {"title", "url", "snippet"}


def test_an_id_with_a_colon_works_end_to_end(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    result = run.agent().invoke("echo", {"k": "v"}, tool_call_id="functions.search:0")
    assert result.tool_call_id == "functions.search:0"
    assert run.invocation("functions.search:0")["tool_call_id"] == "functions.search:0"
    assert [f.tool_call_id for f in run.facts().facts] == ["functions.search:0"]


def test_a_bad_run_token_is_unauthenticated(sidecar: Sidecar, harness: Harness, run_id: str) -> None:
    harness.create_run(run_id)
    with Agent(sidecar.agent_url, f"{run_id}.forged-mac") as agent:
        for call in [lambda: agent.invoke("echo", {}, tool_call_id="c1"), agent.tools]:
            with pytest.raises(ToolgateError) as info:
                call()
            refused(info, "UNAUTHENTICATED", 401)
    with pytest.raises(ToolgateError) as info:
        Agent(sidecar.agent_url, f"{run_id}.forged-mac").invoke("echo", {}, tool_call_id="c1")
    assert info.value.tool_call_id == "c1"  # a safe id is echoed even before it is checked


@pytest.mark.parametrize(
    ("tool", "input", "tools", "code", "status"),
    [
        ("search", {"q": 5}, None, "INVALID_INPUT", 400),
        ("search", {}, None, "INVALID_INPUT", 400),
        ("read_file", {"path": ""}, None, "INVALID_INPUT", 400),
        ("nope", {}, None, "UNKNOWN_TOOL", 404),
        ("echo", {}, ["search"], "UNAUTHORIZED", 403),
        ("write_note", {"text": "x"}, None, "TOOL_NOT_READ_ONLY", 403),
        ("read_file", {"path": "/etc/passwd"}, None, "POLICY_DENIED", 403),
        ("read_file", {"path": "../etc/passwd"}, None, "POLICY_DENIED", 403),
    ],
)
def test_preflight_refusals(
    harness: Harness,
    run_id: str,
    tool: str,
    input: dict[str, Any],
    tools: list[str] | None,
    code: str,
    status: int,
) -> None:
    run = harness.create_run(run_id, tools=tools)
    with pytest.raises(ToolgateError) as info:
        run.agent().invoke(tool, input, tool_call_id="call_pre")
    assert refused(info, code, status).tool_call_id == "call_pre"
    # A refused call leaves no record and spends no budget.
    assert run.state()["calls_used"] == 0
    with pytest.raises(ToolgateError) as info:
        run.invocation("call_pre")
    refused(info, "NOT_FOUND", 404)


def test_a_path_inside_the_workspace_is_forwarded_canonical(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id, workspace="/srv/work")
    result = run.agent().invoke("read_file", {"path": "notes/./a.txt"}, tool_call_id="c1")
    assert result.result == {"item": {"path": "/srv/work/notes/a.txt"}}


def test_an_unsafe_tool_call_id_is_invalid_tool_call_id(harness: Harness, run_id: str) -> None:
    agent = harness.create_run(run_id).agent()
    for bad in ["bad id", "", "-leading-dash", "x" * 129]:
        with pytest.raises(ToolgateError) as info:
            agent.invoke("echo", {}, tool_call_id=bad)
        assert refused(info, "INVALID_TOOL_CALL_ID", 400).tool_call_id is None


def test_another_runs_id_in_the_envelope_is_run_mismatch(harness: Harness, run_id: str) -> None:
    other = harness.create_run(new_id("run"))
    agent = harness.create_run(run_id).agent()
    # The client always sends its token's run; reach past it to send another run's id.
    agent._run_id = other.run_id
    with pytest.raises(ToolgateError) as info:
        agent.invoke("echo", {}, tool_call_id="c1")
    refused(info, "RUN_MISMATCH", 403)


def test_a_second_call_with_the_same_id_is_a_duplicate(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    agent = run.agent()
    first = agent.invoke("echo", {"n": 1}, tool_call_id="call_dup")
    with pytest.raises(ToolgateError) as info:
        agent.invoke("echo", {"n": 2}, tool_call_id="call_dup")
    assert refused(info, "DUPLICATE_TOOL_CALL", 409).tool_call_id == "call_dup"
    assert run.invocation("call_dup")["request"] == {"n": 1}  # the first record is untouched
    assert [f.result for f in run.facts().facts] == [first.result]


def test_an_error_is_not_retried_and_its_retry_is_a_duplicate(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id)
    agent = run.agent()
    with pytest.raises(ToolgateError) as info:
        agent.invoke("fail", {}, tool_call_id="call_f")
    refused(info, "TOOL_EXECUTION_FAILED", 502)
    assert run.state()["calls_used"] == 1  # one request reached the tool: no hidden retry
    with pytest.raises(ToolgateError) as info:
        agent.invoke("fail", {}, tool_call_id="call_f")
    refused(info, "DUPLICATE_TOOL_CALL", 409)


def test_budget_exhausted(harness: Harness, run_id: str) -> None:
    agent = harness.create_run(run_id, budget={"max_calls": 1}).agent()
    agent.invoke("echo", {}, tool_call_id="c1")
    with pytest.raises(ToolgateError) as info:
        agent.invoke("echo", {}, tool_call_id="c2")
    assert refused(info, "BUDGET_EXHAUSTED", 429).tool_call_id == "c2"


def test_per_tool_budget_exhausted(harness: Harness, run_id: str) -> None:
    agent = harness.create_run(run_id, budget={"max_calls_per_tool": {"echo": 1}}).agent()
    agent.invoke("echo", {}, tool_call_id="c1")
    with pytest.raises(ToolgateError) as info:
        agent.invoke("echo", {}, tool_call_id="c2")
    refused(info, "BUDGET_EXHAUSTED", 429)
    assert agent.invoke("search", {"q": "x"}, tool_call_id="c3").status == "READY"


@pytest.mark.parametrize(
    ("tool", "code", "status"),
    [
        ("fail", "TOOL_EXECUTION_FAILED", 502),
        ("slow", "TOOL_TIMEOUT", 504),
        ("big", "RESULT_TOO_LARGE", 502),
    ],
)
def test_upstream_failures(harness: Harness, run_id: str, tool: str, code: str, status: int) -> None:
    run = harness.create_run(run_id)
    with pytest.raises(ToolgateError) as info:
        run.agent().invoke(tool, {}, tool_call_id="call_up")
    err = refused(info, code, status)
    assert err.tool_call_id == "call_up"
    assert "password" not in err.message  # toolgate's fixed sentence, never the tool's text
    record = run.invocation("call_up")
    assert (record["status"], record["error_code"]) == ("ERROR", code)
    assert run.facts().excluded == 1


def test_a_closed_port_is_a_transport_error(run_id: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with Agent(url, f"{run_id}.secret-mac") as agent:
        with pytest.raises(ToolgateError) as info:
            agent.invoke("echo", {}, tool_call_id="c1")
    err = refused(info, "TRANSPORT_ERROR", None)
    assert err.tool_call_id == "c1"
    assert "secret-mac" not in f"{err} {err!r}" and "127.0.0.1" not in str(err)
    with Harness(url, admin_token="admin-secret") as h:
        with pytest.raises(ToolgateError) as info:
            h.create_run(run_id)
    err = refused(info, "TRANSPORT_ERROR", None)
    assert err.tool_call_id is None and "admin-secret" not in f"{err} {err!r}"


def test_a_timeout_is_a_transport_error_and_the_call_still_ran(
    sidecar: Sidecar, harness: Harness, run_id: str
) -> None:
    run = harness.create_run(run_id)
    with Agent(sidecar.agent_url, run.run_token, timeout=0.1) as agent:
        with pytest.raises(ToolgateError) as info:
            agent.invoke("slow", {}, tool_call_id="call_slow")
    assert refused(info, "TRANSPORT_ERROR", None).tool_call_id == "call_slow"
    # The call reached toolgate and goes on there: its record appears for the harness to read.
    deadline = time.monotonic() + 10
    while True:
        try:
            record = run.invocation("call_slow")
            break
        except ToolgateError as err:
            if err.code != "NOT_FOUND" or time.monotonic() > deadline:
                raise
        time.sleep(0.05)
    assert record["tool_call_id"] == "call_slow"


# --- answers that are not toolgate's -----------------------------------------------------------


def mock_client(status: int, body: bytes, seen: list[httpx.Request]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body)

    return httpx.Client(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (502, b"<html>Bad Gateway</html>"),
        (404, b'{"detail": "Not Found"}'),
        (200, b"not json"),
        (200, b'{"status": "ERROR"}'),
        (200, b"[]"),
    ],
)
def test_an_answer_that_is_not_toolgates_is_unexpected_response(status: int, body: bytes) -> None:
    seen: list[httpx.Request] = []
    with mock_client(status, body, seen) as client:
        agent = Agent("http://toolgate.test/", "run-1.mac", http_client=client)
        with pytest.raises(ToolgateError) as info:
            agent.invoke("echo", {"a": 1}, tool_call_id="c1")
    err = refused(info, "UNEXPECTED_RESPONSE", status)
    assert err.tool_call_id == "c1"
    assert b"Bad Gateway" not in str(err).encode()
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://toolgate.test/v1/invoke")
    assert request.headers["authorization"] == "Bearer run-1.mac"
    assert json.loads(request.content) == {
        "run_id": "run-1",
        "tool_call_id": "c1",
        "tool": "echo",
        "input": {"a": 1},
    }


def test_path_segments_are_percent_encoded() -> None:
    seen: list[httpx.Request] = []
    created = b'{"run_id": "r", "run_token": "r.m", "deadline": "2026-11-29T22:13:04.123Z"}'
    with mock_client(201, created, seen) as client:
        harness = Harness("http://toolgate.test", admin_token="a", http_client=client)
        run = harness.create_run("r")
        assert run.deadline == datetime(2026, 11, 29, 22, 13, 4, 123000, tzinfo=timezone.utc)
        run.invocation("functions.search:0/x y")
    assert seen[1].url.raw_path == b"/v1/runs/r/invocations/functions.search%3A0%2Fx%20y"
    assert seen[1].headers["authorization"] == "Bearer a"
