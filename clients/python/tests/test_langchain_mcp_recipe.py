"""Recipe: LangGraph on toolgate's MCP endpoint through langchain-mcp-adapters, keyed by the
model's own tool call ids.

toolgate's `/mcp` takes a call's ids from the `tools/call` request's `_meta`
(`toolgate.dev/run_id`, `toolgate.dev/tool_call_id`) and nowhere else. langchain-mcp-adapters
(0.3) sends no `_meta`: its tools call `ClientSession.call_tool(name, args)`, and a tool call
interceptor may only change the name, the arguments and the HTTP headers. So on its own every
call reaches toolgate without an id and is refused (`INVALID_TOOL_CALL_ID`).

What an interceptor does get is `request.runtime`: inside LangGraph's `ToolNode` (so in
`create_react_agent`) that is the `ToolRuntime` of the call, whose `tool_call_id` is the id the
model gave it. The recipe is an innermost interceptor that
makes the call itself, with `toolgate.mcp.call_tool`, on a session of the same server, with the
ids in `_meta`, and returns the `CallToolResult` for the adapter to convert as usual:

    from toolgate.mcp import call_tool

    def toolgate_ids(run_id, session):
        async def intercept(request, handler):
            tool_call_id = getattr(request.runtime, "tool_call_id", None)
            if not tool_call_id:
                raise ValueError("no tool call id: run the tool in LangGraph's ToolNode")
            return await call_tool(session, request.name, request.args,
                                   run_id=run_id, tool_call_id=tool_call_id)
        return intercept

    client = MultiServerMCPClient({"toolgate": {"transport": "streamable_http",
        "url": f"{agent_url}/mcp", "headers": {"Authorization": f"Bearer {run_token}"}}})
    async with client.session("toolgate") as session:
        tools = await load_mcp_tools(session, tool_interceptors=[toolgate_ids(run_id, session)])
        await create_react_agent(model, tools).ainvoke(...)

With `client.get_tools()` (a new session per call) the interceptor opens that session itself:
`async with client.session(request.server_name) as session: return await call_tool(...)`.

Limits, as the adapter sets them: its tools are async only (`ainvoke`/`astream`); the interceptor
must come last, since it does not call `handler`; outside a `ToolNode` (a bare
`tool.ainvoke(tool_call)`) there is no runtime, so no id, and the call is refused before anything
is sent.

The tests run that recipe with langchain-mcp-adapters' own MCP client (mcp 1.x) against a real
toolgate, LangGraph's own loop and langchain-core's fake chat model.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conftest import Sidecar, new_id

import toolgate

# No tracing, no network: set before LangChain reads its settings.
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["LANGSMITH_TRACING"] = "false"

try:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.interceptors import MCPToolCallRequest, MCPToolCallResult, ToolCallInterceptor
    from langchain_mcp_adapters.tools import load_mcp_tools
    from langgraph.prebuilt import create_react_agent
    from mcp import ClientSession
    from pydantic import Field

    from toolgate.mcp import call_tool
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"langchain-mcp-adapters is not installed ({e}): "
        "pip install -e 'clients/python[langchain,mcp]' langchain-mcp-adapters",
        pytrace=False,
    )

pytestmark = pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")

TOOLS = ["echo", "fail", "search"]
SERVER = "toolgate"

Handler = Callable[[MCPToolCallRequest], Awaitable[MCPToolCallResult]]


# --- the recipe ---------------------------------------------------------------------------------


def tool_call_id_of(request: MCPToolCallRequest) -> str:
    """The model's id of the call, from the `ToolRuntime` LangGraph's ToolNode hands the tool."""
    tool_call_id = getattr(request.runtime, "tool_call_id", None)
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise ValueError(
            f"MCP tool {request.name!r} has no tool call id: run it in LangGraph's ToolNode "
            "(as create_react_agent does), whose ToolRuntime carries the model's id; toolgate "
            "keys every call by that id and never invents one"
        )
    return tool_call_id


def toolgate_ids(run_id: str, session: ClientSession) -> ToolCallInterceptor:
    """An interceptor for tools loaded on a session you hold (`load_mcp_tools(session, ...)`): it
    makes each call on that session with the run id and the model's tool call id in `_meta`.
    Put it last among the interceptors: it answers without calling `handler`."""

    async def intercept(request: MCPToolCallRequest, handler: Handler) -> MCPToolCallResult:
        tool_call_id = tool_call_id_of(request)
        return await call_tool(session, request.name, request.args, run_id=run_id, tool_call_id=tool_call_id)

    return intercept


def toolgate_ids_per_call(run_id: str, client: MultiServerMCPClient) -> ToolCallInterceptor:
    """The same for `client.get_tools()`, whose tools open a new session for every call: the
    interceptor opens it, on the request's server."""

    async def intercept(request: MCPToolCallRequest, handler: Handler) -> MCPToolCallResult:
        tool_call_id = tool_call_id_of(request)
        async with client.session(request.server_name) as session:
            return await call_tool(
                session, request.name, request.args, run_id=run_id, tool_call_id=tool_call_id
            )

    return intercept


# --- the loop -----------------------------------------------------------------------------------


class ScriptedChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, answering its script of AIMessages in order, plus the
    `bind_tools` every tool-calling chat model has (it binds the tools' OpenAI form)."""

    bound: list[dict[str, Any]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        formatted = [convert_to_openai_tool(t) for t in tools]
        self.bound.extend(formatted)
        return self.bind(tools=formatted, **kwargs)


def model(*turns: AIMessage) -> ScriptedChatModel:
    return ScriptedChatModel(messages=iter([*turns, AIMessage(content="done")]))


def call(name: str, args: dict[str, Any], id: str) -> ToolCall:
    return ToolCall(name=name, args=args, id=id, type="tool_call")


def turn(*calls: ToolCall) -> AIMessage:
    return AIMessage(content="", tool_calls=list(calls))


async def agent_run(llm: ScriptedChatModel, tools: list[BaseTool]) -> list[BaseMessage]:
    out = await create_react_agent(llm, tools).ainvoke({"messages": [HumanMessage(content="go")]})
    messages: list[BaseMessage] = out["messages"]
    assert messages[-1].content == "done"  # every tool error reached the model; the loop went on
    return messages


def tool_messages(messages: Sequence[BaseMessage]) -> dict[str, ToolMessage]:
    found = [m for m in messages if isinstance(m, ToolMessage)]
    by_id = {m.tool_call_id: m for m in found}
    assert len(by_id) == len(found), [m.tool_call_id for m in found]
    return by_id


def text(message: ToolMessage) -> str:
    """The message's text: langchain-mcp-adapters gives content blocks."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text")


def assert_ready(run: toolgate.Run, message: ToolMessage, tool: str, request: dict[str, Any]) -> None:
    record = run.invocation(message.tool_call_id)
    assert (record["tool_call_id"], record["run_id"]) == (message.tool_call_id, run.run_id)
    assert (record["tool"], record["status"], record["request"]) == (tool, "READY", request)
    assert message.status == "success"
    assert json.loads(text(message)) == record["agent_result"]
    assert message.artifact == {"structured_content": record["agent_result"]}


def assert_error(message: ToolMessage, code: str) -> None:
    assert message.status == "error"
    assert text(message).startswith(f"{code}: "), text(message)


# --- tests --------------------------------------------------------------------------------------


@pytest.fixture
def run(sidecar: Sidecar, run_id: str) -> Iterator[toolgate.Run]:
    with toolgate.Harness(sidecar.admin_url, admin_token=sidecar.admin_token) as harness:
        yield harness.create_run(run_id, tools=TOOLS)


def mcp_client(sidecar: Sidecar, run: toolgate.Run) -> MultiServerMCPClient:
    return MultiServerMCPClient(
        {
            SERVER: {
                "transport": "streamable_http",
                "url": f"{sidecar.agent_url}/mcp",
                "headers": {"Authorization": f"Bearer {run.run_token}"},
            }
        }
    )


@asynccontextmanager
async def loaded(sidecar: Sidecar, run: toolgate.Run, how: str) -> AsyncIterator[list[BaseTool]]:
    """The run's tools through langchain-mcp-adapters, with the recipe's interceptor: on a held
    session, or a session per call (`get_tools`)."""
    client = mcp_client(sidecar, run)
    if how == "held-session":
        async with client.session(SERVER) as session:
            yield await load_mcp_tools(
                session, server_name=SERVER, tool_interceptors=[toolgate_ids(run.run_id, session)]
            )
    else:
        client.tool_interceptors = [toolgate_ids_per_call(run.run_id, client)]
        yield await client.get_tools()


def with_tools(
    sidecar: Sidecar, run: toolgate.Run, how: str, body: Callable[[list[BaseTool]], Awaitable[None]]
) -> None:
    """Runs `await body(tools)` while the tools' session is open, in one event loop."""

    async def main() -> None:
        async with loaded(sidecar, run, how) as tools:
            await body(tools)

    asyncio.run(main())


def test_without_the_recipe_calls_carry_no_id(sidecar: Sidecar, run: toolgate.Run) -> None:
    # Why the recipe: the adapter sends no `_meta`, so toolgate gets no id and refuses the call.
    c = new_id("call")

    async def main() -> list[BaseMessage]:
        tools = await mcp_client(sidecar, run).get_tools()
        return await agent_run(model(turn(call("search", {"q": "redis"}, c))), tools)

    by_id = tool_messages(asyncio.run(main()))
    assert_error(by_id[c], "INVALID_TOOL_CALL_ID")
    assert run.state()["calls_used"] == 0


@pytest.mark.parametrize("how", ["held-session", "per-call"])
def test_recipe_keys_calls_by_the_models_ids(sidecar: Sidecar, run: toolgate.Run, how: str) -> None:
    s, e, f = "functions.search:0", "functions.echo:1", new_id("call")

    async def body(tools: list[BaseTool]) -> None:
        assert sorted(t.name for t in tools) == TOOLS
        llm = model(
            turn(call("search", {"q": "redis"}, s), call("echo", {"text": "hi"}, e)),
            turn(call("fail", {}, f)),
        )
        by_id = tool_messages(await agent_run(llm, tools))
        assert set(by_id) == {s, e, f}
        # The schemas the model was shown are the configured ones.
        shown = {b["function"]["name"]: b["function"]["parameters"] for b in llm.bound}
        assert shown["search"]["properties"] == {"q": {"type": "string", "maxLength": 512}}
        assert_ready(run, by_id[s], "search", {"q": "redis"})
        assert_ready(run, by_id[e], "echo", {"text": "hi"})
        assert_error(by_id[f], "TOOL_EXECUTION_FAILED")
        assert run.invocation(f)["status"] == "ERROR"

        facts = run.facts()
        assert {x.tool_call_id for x in facts.facts} == {s, e} and len(facts.facts) == 2
        assert facts.excluded == 1

        # The same turn again, with the same ids: refused, and the model sees why.
        replay = tool_messages(await agent_run(model(turn(call("search", {"q": "redis"}, s))), tools))
        assert_error(replay[s], "DUPLICATE_TOOL_CALL")
        assert len(run.facts().facts) == 2

    with_tools(sidecar, run, how, body)


def test_recipe_refuses_a_call_without_a_runtime(sidecar: Sidecar, run: toolgate.Run) -> None:
    # Outside a ToolNode the adapter's tool gets no runtime, so the recipe has no id: refused
    # before anything is sent.
    async def body(tools: list[BaseTool]) -> None:
        search = next(t for t in tools if t.name == "search")
        with pytest.raises(ValueError, match="no tool call id"):
            await search.ainvoke(call("search", {"q": "x"}, new_id("call")))

    with_tools(sidecar, run, "held-session", body)
    assert run.state()["calls_used"] == 0
