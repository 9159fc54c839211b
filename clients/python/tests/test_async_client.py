"""The async client against a real toolgate: the same methods and errors as the sync one, awaited,
and the sync Agent's ways into async code (ainvoke, atools, async_twin)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import httpx
import pytest
from conftest import Sidecar, new_id

from toolgate import Agent, AsyncAgent, AsyncHarness, AsyncRun, Facts, ToolgateError, ToolResult

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def harness(sidecar: Sidecar) -> AsyncIterator[AsyncHarness]:
    async with AsyncHarness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


def refused(info: pytest.ExceptionInfo[ToolgateError], code: str, http_status: int | None) -> ToolgateError:
    err = info.value
    assert (err.code, err.http_status) == (code, http_status), repr(err)
    assert str(err) == f"{code}: {err.message}"
    return err


async def test_a_run_from_create_to_end(harness: AsyncHarness, run_id: str) -> None:
    run = await harness.create_run(
        run_id, tools=["search", "echo"], timeout_ms=60_000, budget={"max_calls": 5}
    )
    assert isinstance(run, AsyncRun)
    assert run.run_token.startswith(run_id + ".")
    assert run.deadline.utcoffset() == timedelta(0)
    state = await run.state()
    assert (state["state"], state["tools"], state["budget"]["max_calls"]) == ("ACTIVE", ["search", "echo"], 5)

    agent = run.agent()
    assert isinstance(agent, AsyncAgent) and agent.run_id == run_id
    assert sorted(t["name"] for t in await agent.tools()) == ["echo", "search"]
    result = await agent.invoke("search", {"q": "redis"}, tool_call_id="call_1")
    assert isinstance(result, ToolResult)
    assert (result.status, result.tool_call_id, result.evidence_status) == (
        "READY",
        "call_1",
        "EVIDENCE_FOUND",
    )
    assert result.result["total_items"] == 7

    record = await run.invocation("call_1")
    assert (record["status"], record["request"]) == ("READY", {"q": "redis"})
    assert [f.tool_call_id for f in (await run.facts()).facts] == ["call_1"]

    facts = await run.end()
    assert isinstance(facts, Facts)
    assert (facts.run_id, [f.tool_call_id for f in facts.facts], facts.excluded) == (run_id, ["call_1"], 0)
    assert (await run.state())["state"] == "ENDED"
    with pytest.raises(ToolgateError) as info:
        await agent.invoke("echo", {}, tool_call_id="call_2")
    refused(info, "RUN_INACTIVE", 409)


async def test_cancel(harness: AsyncHarness, run_id: str) -> None:
    run = await harness.create_run(run_id)
    assert (await run.cancel())["state"] == "CANCELLED"
    assert (await run.state())["state"] == "CANCELLED"


async def test_evidence(harness: AsyncHarness, run_id: str) -> None:
    run = await harness.create_run(run_id)
    await run.agent().invoke("echo", {}, tool_call_id="ev-1")
    bundle = await run.evidence()
    assert set(bundle) == {"payload", "signatures"}


async def test_the_run_block_ends_on_normal_exit(harness: AsyncHarness, run_id: str) -> None:
    async with harness.run(run_id, tools=["echo"]) as run:
        await run.agent().invoke("echo", {"n": 1}, tool_call_id="c1")
    assert (await run.state())["state"] == "ENDED"
    assert [f.tool_call_id for f in (await run.facts()).facts] == ["c1"]


async def test_the_run_block_cancels_on_an_exception(harness: AsyncHarness, run_id: str) -> None:
    handle: list[AsyncRun] = []
    with pytest.raises(RuntimeError, match="agent crashed"):
        async with harness.run(run_id) as run:
            handle.append(run)
            raise RuntimeError("agent crashed")
    assert (await handle[0].state())["state"] == "CANCELLED"


async def test_admin_errors(harness: AsyncHarness, sidecar: Sidecar, run_id: str) -> None:
    run = await harness.create_run(run_id)
    with pytest.raises(ToolgateError) as info:
        await harness.create_run(run_id)
    refused(info, "RUN_EXISTS", 409)
    with pytest.raises(ToolgateError) as info:
        await harness.create_run(new_id("run"), workspace="relative")
    refused(info, "INVALID_INPUT", 400)
    with pytest.raises(ToolgateError) as info:
        await run.invocation("never-made")
    refused(info, "NOT_FOUND", 404)
    with pytest.raises(ToolgateError) as info:
        ghost = new_id("run")
        await harness.attach(ghost, f"{ghost}.mac")
    refused(info, "NOT_FOUND", 404)
    async with AsyncHarness(sidecar.admin_url, admin_token="wrong") as bad:
        with pytest.raises(ToolgateError) as info:
            await bad.create_run(new_id("run"))
    refused(info, "UNAUTHENTICATED", 401)


async def test_agent_errors(harness: AsyncHarness, sidecar: Sidecar, run_id: str) -> None:
    run = await harness.create_run(run_id, tools=["echo", "fail", "search"], budget={"max_calls": 3})
    agent = run.agent()
    cases: list[tuple[str, dict[str, object], str, str, int]] = [
        ("search", {"q": 1}, "c-1", "INVALID_INPUT", 400),
        ("echo", {}, "bad id", "INVALID_TOOL_CALL_ID", 400),
        ("nope", {}, "c-2", "UNKNOWN_TOOL", 404),
        ("read_file", {"path": "a"}, "c-3", "UNAUTHORIZED", 403),
        ("fail", {}, "c-4", "TOOL_EXECUTION_FAILED", 502),
    ]
    for tool, input, call_id, code, status in cases:
        with pytest.raises(ToolgateError) as info:
            await agent.invoke(tool, input, tool_call_id=call_id)
        refused(info, code, status)
    await agent.invoke("echo", {}, tool_call_id="c-5")
    with pytest.raises(ToolgateError) as info:
        await agent.invoke("echo", {}, tool_call_id="c-5")
    refused(info, "DUPLICATE_TOOL_CALL", 409)
    await agent.invoke("echo", {}, tool_call_id="c-6")
    with pytest.raises(ToolgateError) as info:
        await agent.invoke("echo", {}, tool_call_id="c-7")
    refused(info, "BUDGET_EXHAUSTED", 429)
    async with AsyncAgent(sidecar.agent_url, f"{run_id}.forged") as forged:
        with pytest.raises(ToolgateError) as info:
            await forged.tools()
    refused(info, "UNAUTHENTICATED", 401)


async def test_an_id_with_a_colon(harness: AsyncHarness, run_id: str) -> None:
    run = await harness.create_run(run_id)
    result = await run.agent().invoke("echo", {}, tool_call_id="functions.search:0")
    assert result.tool_call_id == "functions.search:0"
    assert (await run.invocation("functions.search:0"))["tool_call_id"] == "functions.search:0"


async def test_concurrent_calls_with_one_id_have_one_winner(harness: AsyncHarness, run_id: str) -> None:
    agent = (await harness.create_run(run_id)).agent()
    outcomes: list[str] = []

    async def call() -> None:
        try:
            outcomes.append((await agent.invoke("echo", {}, tool_call_id="same")).status)
        except ToolgateError as err:
            outcomes.append(err.code)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(call)
    assert sorted(outcomes) == ["DUPLICATE_TOOL_CALL"] * 4 + ["READY"]


async def test_a_closed_port_is_a_transport_error(run_id: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with AsyncAgent(f"http://127.0.0.1:{port}", f"{run_id}.mac") as agent:
        with pytest.raises(ToolgateError) as info:
            await agent.invoke("echo", {}, tool_call_id="c1")
    assert refused(info, "TRANSPORT_ERROR", None).tool_call_id == "c1"


async def test_an_unexpected_answer() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(503, text="upstream connect error"))
    async with httpx.AsyncClient(transport=transport) as client:
        harness = AsyncHarness("http://toolgate.test", admin_token="a", http_client=client)
        with pytest.raises(ToolgateError) as info:
            await harness.create_run("r")
        await harness.aclose()
        assert not client.is_closed
    refused(info, "UNEXPECTED_RESPONSE", 503)


async def test_run_agent_needs_an_agent_url(sidecar: Sidecar, run_id: str) -> None:
    async with AsyncHarness(sidecar.admin_url, admin_token=sidecar.admin_token) as h:
        run = await h.create_run(run_id)
        with pytest.raises(ValueError, match="agent_url"):
            run.agent()


# --- the sync Agent in async code --------------------------------------------------------------


async def test_sync_agent_ainvoke_and_atools(harness: AsyncHarness, sidecar: Sidecar, run_id: str) -> None:
    run = await harness.create_run(run_id, tools=["echo"])
    with Agent(sidecar.agent_url, run.run_token) as agent:
        assert [t["name"] for t in await agent.atools()] == ["echo"]
        result = await agent.ainvoke("echo", {"k": 1}, tool_call_id="call_a")
        assert (result.status, result.result) == ("READY", {"item": {"k": 1}})
        with pytest.raises(ToolgateError) as info:
            await agent.ainvoke("echo", {}, tool_call_id="call_a")
        refused(info, "DUPLICATE_TOOL_CALL", 409)


async def test_sync_agent_async_twin(harness: AsyncHarness, sidecar: Sidecar, run_id: str) -> None:
    run = await harness.create_run(run_id)
    agent = Agent(sidecar.agent_url, run.run_token, timeout=7.0)
    async with agent.async_twin() as twin:
        assert isinstance(twin, AsyncAgent)
        assert (twin.run_id, twin.agent_url) == (agent.run_id, agent.agent_url)
        assert (await twin.invoke("echo", {}, tool_call_id="call_t")).tool_call_id == "call_t"
    agent.close()
    assert [f.tool_call_id for f in (await run.facts()).facts] == ["call_t"]
