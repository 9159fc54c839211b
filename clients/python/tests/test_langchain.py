"""The LangChain adapter against a real toolgate, driven by LangGraph's own agent loops
(`create_react_agent`, and a `StateGraph` with `ToolNode`) and langchain-core's own fake chat
model: the model picks the tool call ids, toolgate keys its records by them, and the ToolMessages
the model reads back carry what toolgate answered, errors included."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
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
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
    from pydantic import Field

    from toolgate.langchain import ToolgateTool, tools
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"LangChain is not installed ({e}): pip install -e 'clients/python[langchain]'", pytrace=False
    )

# langgraph 1.x marks create_react_agent deprecated in favour of langchain's create_agent; it is
# the ToolNode loop that needs no package beyond langgraph.
pytestmark = pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")

TOOLS = ["echo", "fail", "search"]


class ScriptedChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, answering its script of AIMessages in order. The one
    addition is `bind_tools`, which every tool-calling chat model has and the fake lacks: it binds
    the tools' OpenAI form, as real models do, and keeps it so a test can see what the model was
    shown."""

    bound: list[dict[str, Any]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        formatted = [convert_to_openai_tool(t) for t in tools]
        self.bound.extend(formatted)
        return self.bind(tools=formatted, **kwargs)


def model(*turns: AIMessage) -> ScriptedChatModel:
    """A model that makes the given turns, then says it is done."""
    return ScriptedChatModel(messages=iter([*turns, AIMessage(content="done")]))


def call(name: str, args: dict[str, Any], id: str) -> ToolCall:
    return ToolCall(name=name, args=args, id=id, type="tool_call")


def turn(*calls: ToolCall) -> AIMessage:
    """One model turn: the calls in it run in parallel."""
    return AIMessage(content="", tool_calls=list(calls))


def react(llm: ScriptedChatModel, lc_tools: Sequence[Any]) -> Any:
    return create_react_agent(llm, list(lc_tools))


def tool_graph(llm: ScriptedChatModel, lc_tools: Sequence[Any]) -> Any:
    """The hand-built loop: a model node, LangGraph's ToolNode, and its `tools_condition` edge."""
    bound = llm.bind_tools(lc_tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(list(lc_tools)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    return graph.compile()


def start() -> dict[str, list[BaseMessage]]:
    return {"messages": [HumanMessage(content="look it up")]}


def tool_messages(messages: Sequence[BaseMessage]) -> dict[str, ToolMessage]:
    """The run's ToolMessages by their tool_call_id (each id answered exactly once)."""
    found = [m for m in messages if isinstance(m, ToolMessage)]
    by_id = {m.tool_call_id: m for m in found}
    assert len(by_id) == len(found), [m.tool_call_id for m in found]
    return by_id


def assert_ready(run: toolgate.Run, message: ToolMessage, tool: str) -> dict[str, Any]:
    """The message is the READY answer toolgate recorded under the message's id: its content the
    projected result as compact JSON, its artifact the same result with its evidence status."""
    record = run.invocation(message.tool_call_id)
    assert record["tool_call_id"] == message.tool_call_id
    assert record["run_id"] == run.run_id
    assert (record["tool"], record["status"]) == (tool, "READY")
    assert message.status == "success"
    assert message.name == tool
    assert isinstance(message.content, str)
    assert json.loads(message.content) == record["agent_result"]
    assert message.content == json.dumps(record["agent_result"], ensure_ascii=False, separators=(",", ":"))
    assert message.artifact == {
        "result": record["agent_result"],
        "evidence_status": record["evidence_status"],
    }
    return record


def assert_error(message: ToolMessage, code: str) -> None:
    assert message.status == "error"
    assert isinstance(message.content, str)
    assert message.content.startswith(f"{code}: "), message.content


def fact_ids(run: toolgate.Run) -> list[str]:
    return [f.tool_call_id for f in run.facts().facts]


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[toolgate.Harness]:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


@pytest.fixture
def run(harness: toolgate.Harness, run_id: str) -> toolgate.Run:
    return harness.create_run(run_id, tools=TOOLS)


def test_tools_are_the_runs_tools_as_configured(run: toolgate.Run) -> None:
    agent = run.agent()
    specs = agent.tools()
    lc_tools = tools(agent)
    assert [t.name for t in lc_tools] == [s["name"] for s in specs] == sorted(TOOLS)
    for t, spec in zip(lc_tools, specs, strict=True):
        assert isinstance(t, ToolgateTool)
        assert t.description == spec["description"]
        assert t.args_schema == spec["input_schema"]
        # What a model is shown: the configured schema, not rewritten.
        function = convert_to_openai_tool(t)["function"]
        assert function == {
            "name": spec["name"],
            "description": spec["description"],
            "parameters": spec["input_schema"],
        }
    search = next(t for t in lc_tools if t.name == "search")
    assert search.args_schema == {
        "type": "object",
        "required": ["q"],
        "properties": {"q": {"type": "string", "maxLength": 512}},
    }
    # The run token stays out of the tool's printed form.
    assert run.run_token not in repr(lc_tools)


def test_react_agent_records_the_models_ids(run: toolgate.Run) -> None:
    s, e, s2, f = new_id("call"), new_id("call"), new_id("call"), new_id("call")
    llm = model(
        turn(call("search", {"q": "redis"}, s), call("echo", {"text": "hi"}, e)),
        turn(call("search", {"q": "raft"}, s2)),
        turn(call("fail", {}, f)),
    )
    lc_tools = tools(run.agent())
    out = react(llm, lc_tools).invoke(start())

    # The model was shown the configured tools.
    assert [b["function"]["name"] for b in llm.bound] == sorted(TOOLS)
    by_id = tool_messages(out["messages"])
    assert set(by_id) == {s, e, s2, f}
    assert assert_ready(run, by_id[s], "search")["request"] == {"q": "redis"}
    assert assert_ready(run, by_id[e], "echo")["request"] == {"text": "hi"}
    assert assert_ready(run, by_id[s2], "search")["request"] == {"q": "raft"}

    # A failing upstream reaches the model as an error result, and the loop goes on.
    assert_error(by_id[f], "TOOL_EXECUTION_FAILED")
    record = run.invocation(f)
    assert (record["status"], record["error_code"]) == ("ERROR", "TOOL_EXECUTION_FAILED")
    assert out["messages"][-1].content == "done"

    # The facts: the READY ids in completion order (the parallel pair in either order), the error
    # excluded.
    facts = run.facts()
    ids = [x.tool_call_id for x in facts.facts]
    assert set(ids[:2]) == {s, e} and ids[2:] == [s2]
    assert facts.excluded == 1
    for fact in facts.facts:
        assert json.loads(str(by_id[fact.tool_call_id].content)) == fact.result


def test_replaying_a_turn_is_a_duplicate_for_the_model(run: toolgate.Run) -> None:
    s, e = new_id("call"), new_id("call")
    same_turn = turn(call("search", {"q": "redis"}, s), call("echo", {"n": 1}, e))
    lc_tools = tools(run.agent())
    first = tool_messages(tool_graph(model(same_turn), lc_tools).invoke(start())["messages"])
    records = {i: run.invocation(i) for i in (s, e)}
    assert_ready(run, first[s], "search")
    assert_ready(run, first[e], "echo")

    # The same turn again, as a resumed or retried agent would make it: the same ids.
    replay = tool_graph(model(same_turn), lc_tools).invoke(start())
    again = tool_messages(replay["messages"])
    assert set(again) == {s, e}
    for i in (s, e):
        assert_error(again[i], "DUPLICATE_TOOL_CALL")
        assert run.invocation(i)["updated_at"] == records[i]["updated_at"]  # the first record stands
    assert replay["messages"][-1].content == "done"
    assert set(fact_ids(run)) == {s, e}


def test_a_tool_the_run_may_not_call(harness: toolgate.Harness, run_id: str) -> None:
    narrow = harness.create_run(run_id, tools=["search"])
    wide = harness.create_run(new_id("run"))  # every configured tool
    echo_spec = next(t for t in wide.agent().tools() if t["name"] == "echo")
    narrow_agent = narrow.agent()
    lc_tools = tools(narrow_agent)
    assert [t.name for t in lc_tools] == ["search"]
    # A tool taken from the other run's list, bound to this run.
    echo = ToolgateTool(
        narrow_agent,
        name=echo_spec["name"],
        description=echo_spec["description"],
        args_schema=echo_spec["input_schema"],
    )
    ok, refused = new_id("call"), new_id("call")
    llm = model(turn(call("echo", {"x": 1}, refused)), turn(call("search", {"q": "still going"}, ok)))
    out = react(llm, [*lc_tools, echo]).invoke(start())

    by_id = tool_messages(out["messages"])
    assert_error(by_id[refused], "UNAUTHORIZED")
    with pytest.raises(toolgate.ToolgateError) as exc:  # refused before any record was made
        narrow.invocation(refused)
    assert exc.value.code == "NOT_FOUND"
    assert_ready(narrow, by_id[ok], "search")
    assert fact_ids(narrow) == [ok]


def test_async_loop_and_ids_with_a_colon(run: toolgate.Run) -> None:
    # OpenAI-style ids of parallel function calls; toolgate keeps them as they are.
    s, e, f = "functions.search:0", "functions.echo:1", "functions.fail:0"
    llm = model(
        turn(call("search", {"q": "async"}, s), call("echo", {"a": [1, 2]}, e)), turn(call("fail", {}, f))
    )
    graph = react(llm, tools(run.agent()))
    out = asyncio.run(graph.ainvoke(start()))

    by_id = tool_messages(out["messages"])
    assert_ready(run, by_id[s], "search")
    assert assert_ready(run, by_id[e], "echo")["request"] == {"a": [1, 2]}
    assert_error(by_id[f], "TOOL_EXECUTION_FAILED")
    assert out["messages"][-1].content == "done"
    assert set(fact_ids(run)) == {s, e}


def test_astream_replay_is_a_duplicate(run: toolgate.Run) -> None:
    s = "functions.search:0"
    lc_tools = tools(run.agent())

    async def stream(llm: ScriptedChatModel) -> list[ToolMessage]:
        seen: list[ToolMessage] = []
        async for update in tool_graph(llm, lc_tools).astream(start(), stream_mode="updates"):
            for message in update.get("tools", {}).get("messages", []):
                seen.append(message)
        return seen

    first = asyncio.run(stream(model(turn(call("search", {"q": "once"}, s)))))
    assert [m.tool_call_id for m in first] == [s]
    assert_ready(run, first[0], "search")
    again = asyncio.run(stream(model(turn(call("search", {"q": "once"}, s)))))
    assert [m.tool_call_id for m in again] == [s]
    assert_error(again[0], "DUPLICATE_TOOL_CALL")
    assert fact_ids(run) == [s]


def test_direct_invoke_needs_the_tool_call(run: toolgate.Run) -> None:
    search = next(t for t in tools(run.agent()) if t.name == "search")
    c = new_id("call")
    message = search.invoke(call("search", {"q": "direct"}, c))
    assert isinstance(message, ToolMessage) and message.tool_call_id == c
    assert_ready(run, message, "search")
    async_message = asyncio.run(search.ainvoke(call("search", {"q": "direct"}, c)))
    assert_error(async_message, "DUPLICATE_TOOL_CALL")

    # Bare arguments carry no id: refused before anything is sent, no id is made up.
    with pytest.raises(ValueError, match="needs a tool_call_id"):
        search.invoke({"q": "no id"})
    with pytest.raises(ValueError, match="needs a tool_call_id"):
        asyncio.run(search.ainvoke({"q": "no id"}))
    assert run.state()["calls_used"] == 1
    assert fact_ids(run) == [c]


def test_import_toolgate_does_not_import_langchain() -> None:
    loaded = "{'langchain_core', 'langgraph', 'toolgate.langchain'} & set(sys.modules)"
    code = f"import sys, toolgate; assert not {loaded}, {loaded}"
    subprocess.run([sys.executable, "-c", code], check=True)
