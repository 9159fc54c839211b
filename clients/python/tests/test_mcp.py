"""The MCP adapter against a real toolgate, through the official `mcp` SDK's own Streamable HTTP
transport and `ClientSession` (1.x or 2.x, whichever is installed): the caller picks the tool call
ids, toolgate keys its records by them, and the SDK's `CallToolResult` carries what toolgate
answered, errors included."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import Sidecar, new_id
from pydantic import BaseModel

import toolgate

try:
    import mcp
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own factory of its HTTP client (httpx in 1.x, httpx2 in 2.x), with its timeouts.
    from mcp.shared._httpx_utils import create_mcp_http_client

    from toolgate.mcp import call_tool
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(f"the MCP SDK is not installed ({e}): pip install -e 'clients/python[mcp]'", pytrace=False)

TOOLS = ["echo", "fail", "search"]

# How a session is opened: the `initialize` handshake on a `ClientSession` (both majors), and, where
# the SDK has one (2.x), its high-level `Client` in its default mode (`server/discover`, then the
# stateless revision), whose `session` is the one passed on.
CONNECTS = ["initialize"] + (["client-default"] if hasattr(mcp, "Client") else [])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[toolgate.Harness]:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


@pytest.fixture
def run(harness: toolgate.Harness, run_id: str) -> toolgate.Run:
    return harness.create_run(run_id, tools=TOOLS)


@asynccontextmanager
async def session_on(
    sidecar: Sidecar, token: str, connect: str
) -> AsyncIterator[tuple[ClientSession, MutableMapping[str, str]]]:
    """An initialized MCP session on toolgate's `/mcp` with the run token, and the headers of its
    HTTP client."""
    async with AsyncExitStack() as stack:
        headers = {"Authorization": f"Bearer {token}"}
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        transport = streamable_http_client(f"{sidecar.agent_url}/mcp", http_client=http)
        if connect == "client-default":
            # mypy sees one SDK major at a time; `Client` is only in 2.x.
            Client: Any = mcp.Client  # type: ignore[attr-defined, unused-ignore]
            client = await stack.enter_async_context(Client(transport))
            assert client.protocol_version == "2026-07-28"
            session: ClientSession = client.session
        else:
            # 1.x yields (read, write, get_session_id), 2.x (read, write).
            streams = await stack.enter_async_context(transport)
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            initialized = await session.initialize()
            assert wire(initialized)["protocolVersion"] == "2025-11-25"
        yield session, http.headers


def wire(result: BaseModel) -> dict[str, Any]:
    """A result as on the wire (camelCase, `_meta`): the same in both SDK majors, whose Python
    field names differ."""
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def text_of(result: dict[str, Any]) -> str:
    content = result["content"]
    assert len(content) == 1 and content[0]["type"] == "text", content
    text: str = content[0]["text"]
    return text


@pytest.mark.anyio
@pytest.mark.parametrize("connect", CONNECTS)
async def test_calls_are_keyed_by_the_callers_ids(sidecar: Sidecar, run: toolgate.Run, connect: str) -> None:
    first, failing, unknown = new_id("mcp"), new_id("mcp"), new_id("mcp")
    with_colon = f"toolu:{new_id('mcp')}"
    async with session_on(sidecar, run.run_token, connect) as (session, _):
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == TOOLS

        # READY: the projected result, as structured content and as its compact JSON text.
        ready = wire(await call_tool(session, "echo", {"q": "redis"}, run_id=run.run_id, tool_call_id=first))
        assert ready["isError"] is False
        assert ready["structuredContent"] == {"item": {"q": "redis"}}
        assert json.loads(text_of(ready)) == {"item": {"q": "redis"}}
        assert ready["_meta"]["toolgate.dev/tool_call_id"] == first
        record = run.invocation(first)
        assert (record["tool_call_id"], record["tool"], record["status"]) == (first, "echo", "READY")
        assert record["agent_result"] == ready["structuredContent"]
        assert ready["_meta"]["toolgate.dev/evidence_status"] == record["evidence_status"]

        # An id with ":" (as some providers make them) is kept exactly.
        colon = wire(await call_tool(session, "echo", {"n": 2}, run_id=run.run_id, tool_call_id=with_colon))
        assert colon["isError"] is False, colon
        assert run.invocation(with_colon)["tool_call_id"] == with_colon

        # A failing upstream: an isError result that starts with the code, recorded under the id.
        failed = wire(await call_tool(session, "fail", None, run_id=run.run_id, tool_call_id=failing))
        assert failed["isError"] is True
        assert text_of(failed).startswith("TOOL_EXECUTION_FAILED: ")
        assert failed["structuredContent"]["error"]["code"] == "TOOL_EXECUTION_FAILED"
        assert failed["_meta"]["toolgate.dev/tool_call_id"] == failing
        assert run.invocation(failing)["status"] == "ERROR"

        # A tool toolgate does not know is a result too, not a protocol error.
        missing = wire(await call_tool(session, "nope", {}, run_id=run.run_id, tool_call_id=unknown))
        assert missing["isError"] is True
        assert text_of(missing).startswith("UNKNOWN_TOOL: ")

        # Replaying an id is refused, and the first call's record stays as it was.
        replay = wire(await call_tool(session, "echo", {"q": "again"}, run_id=run.run_id, tool_call_id=first))
        assert replay["isError"] is True
        assert text_of(replay).startswith("DUPLICATE_TOOL_CALL: ")
        again = run.invocation(first)
        assert {**again, "ttl_ms": None} == {**record, "ttl_ms": None}

    facts = run.end()
    assert [f.tool_call_id for f in facts.facts] == [first, with_colon]
    assert [f.result for f in facts.facts] == [{"item": {"q": "redis"}}, {"item": {"n": 2}}]


@pytest.mark.anyio
@pytest.mark.parametrize("connect", CONNECTS)
async def test_the_run_id_goes_in_meta(
    sidecar: Sidecar, run: toolgate.Run, harness: toolgate.Harness, connect: str
) -> None:
    other = harness.create_run(new_id("run"), tools=TOOLS)
    call_id = new_id("mcp")
    async with session_on(sidecar, run.run_token, connect) as (session, _):
        result = wire(await call_tool(session, "echo", {}, run_id=other.run_id, tool_call_id=call_id))
    assert result["isError"] is True
    assert text_of(result).startswith("RUN_MISMATCH: ")
    other.cancel()


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["", None, 7])
async def test_an_id_is_never_made_up(sidecar: Sidecar, run: toolgate.Run, bad: Any) -> None:
    async with session_on(sidecar, run.run_token, "initialize") as (session, _):
        with pytest.raises(ValueError, match="tool_call_id must be a non-empty string"):
            await call_tool(session, "echo", {}, run_id=run.run_id, tool_call_id=bad)
        with pytest.raises(ValueError, match="run_id must be a non-empty string"):
            await call_tool(session, "echo", {}, run_id=bad, tool_call_id=new_id("mcp"))
    # Nothing reached toolgate.
    assert run.state()["calls_used"] == 0


@pytest.mark.anyio
async def test_a_session_without_meta_is_refused() -> None:
    class OldSession:  # ClientSession.call_tool before mcp 1.19
        async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> None:
            raise AssertionError("called without the ids")

    with pytest.raises(TypeError, match="mcp 1.19 or later"):
        await call_tool(OldSession(), "echo", {}, run_id="run-1", tool_call_id="call-1")  # type: ignore[arg-type]


def test_import_toolgate_does_not_import_mcp() -> None:
    code = "import sys, toolgate; assert 'mcp' not in sys.modules and 'toolgate.mcp' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.anyio
@pytest.mark.parametrize("connect", CONNECTS)
async def test_a_refused_request_raises(sidecar: Sidecar, run: toolgate.Run, connect: str) -> None:
    # A bad token is answered with HTTP 401 outside MCP: the session raises (each SDK major its own
    # way), nothing comes back as a result, and nothing is recorded.
    call_id = new_id("mcp")
    raised: list[Exception] = []
    with anyio.fail_after(30), pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises
        async with session_on(sidecar, run.run_token, connect) as (session, headers):
            headers["Authorization"] = "Bearer bogus.token"
            try:
                result = await call_tool(session, "echo", {}, run_id=run.run_id, tool_call_id=call_id)
            except Exception as e:
                raised.append(e)
                raise
            pytest.fail(f"a refused request came back as a result: {result!r}")
    assert raised, "the call itself did not raise"
    with pytest.raises(toolgate.ToolgateError, match="NOT_FOUND"):
        run.invocation(call_id)
