"""The OpenAI Agents SDK adapter against a real toolgate, driven by the SDK's own loop
(`Runner.run_sync` and `Runner.run`) and its own scripted test model (`agents.testing`): the model
picks the call ids, toolgate keys its records by them, and the `function_call_output` items the
model reads on its next turn carry what toolgate answered, errors included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Sidecar, new_id

import toolgate

try:
    from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, Runner, RunResult
    from agents.items import TResponseOutputItem
    from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call
    from agents.tool_context import ToolContext

    from toolgate.openai_agents import tools
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"The OpenAI Agents SDK is not installed ({e}): pip install -e 'clients/python[openai-agents]'",
        pytrace=False,
    )

TOOLS = ["echo", "fail", "search"]
# Per run, not global: no trace is made, so nothing is exported and no OpenAI key is needed.
NO_TRACING = RunConfig(tracing_disabled=True)


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[toolgate.Harness]:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


def model(*turns: list[TResponseOutputItem]) -> ScriptedModel:
    """The SDK's scripted model: the given turns (the calls in one turn run in parallel), then a
    final answer."""
    return ScriptedModel([*turns, [assistant_message("done")]])


def drive(llm: ScriptedModel, agent_tools: list[FunctionTool], mode: str = "sync") -> RunResult:
    """One agent run in the SDK's own loop, sync or async; every script step must be used."""
    sdk_agent = Agent(name="assistant", instructions="Use the tools.", model=llm, tools=list(agent_tools))
    if mode == "sync":
        result = Runner.run_sync(sdk_agent, "go", run_config=NO_TRACING)
    else:
        result = asyncio.run(Runner.run(sdk_agent, "go", run_config=NO_TRACING))
    llm.assert_complete()
    return result


def outputs(call: ModelCall) -> dict[str, Any]:
    """The tool outputs a model call was given, by call id."""
    return {
        item["call_id"]: item["output"]
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_runner_keys_records_by_the_model_call_ids(harness: toolgate.Harness, run_id: str, mode: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    agent = run.agent()
    sdk_tools = tools(agent)
    searched, echoed, failed, colon = new_id("call"), new_id("call"), new_id("call"), f"call:{new_id('x')}"
    llm = model(
        [  # two calls in one turn: the SDK runs them in parallel
            function_call("search", {"q": "redis"}, call_id=searched),
            function_call("echo", {"msg": "hi", "n": 1}, call_id=echoed),
        ],
        [
            function_call("fail", {}, call_id=failed),
            function_call("echo", {"msg": "colon"}, call_id=colon),
        ],
    )

    result = drive(llm, sdk_tools, mode)

    assert result.final_output == "done"
    # Exactly the ids the model emitted, and nothing else, reached toolgate.
    assert run.state()["calls_used"] == 4
    records = {i: run.invocation(i) for i in (searched, echoed, failed, colon)}
    assert {i: r["tool_call_id"] for i, r in records.items()} == {i: i for i in records}
    assert records[searched]["tool"] == "search" and records[searched]["request"] == {"q": "redis"}
    assert [r["status"] for r in records.values()] == ["READY", "READY", "ERROR", "READY"]

    first, second, third = llm.calls
    assert outputs(first) == {}
    # The next turn reads the projected results as compact JSON, under the model's call ids.
    assert outputs(second) == {
        searched: compact(records[searched]["agent_result"]),
        echoed: compact(records[echoed]["agent_result"]),
    }
    assert records[echoed]["request"] == {"msg": "hi", "n": 1}
    assert '"msg":"hi"' in outputs(second)[echoed]
    found = json.loads(outputs(second)[searched])
    assert found["items"] and all(hit.keys() <= {"title", "url", "snippet"} for hit in found["items"])
    later = outputs(third)
    # A failing tool reaches the model as an output starting with its code; the run went on.
    assert records[failed]["error_code"] == "TOOL_EXECUTION_FAILED"
    assert later[failed].startswith("TOOL_EXECUTION_FAILED: ")
    assert later[colon] == compact(records[colon]["agent_result"])
    assert records[colon]["request"] == {"msg": "colon"}

    facts = run.end()
    # Completion order: the parallel pair in either order, then the later READY call.
    assert {f.tool_call_id for f in facts.facts[:2]} == {searched, echoed}
    assert [f.tool_call_id for f in facts.facts[2:]] == [colon]
    assert facts.excluded == 1
    assert run.facts() == facts


def shown_as(schema: dict[str, Any]) -> dict[str, Any]:
    """A configured schema as the model must be shown it: unchanged, but an object schema without
    `properties` (which the OpenAI API refuses) gets an empty one, as the SDK's own MCP client
    does for the same tool."""
    if schema.get("type") == "object" and "properties" not in schema:
        return {**schema, "properties": {}}
    return schema


def test_schemas_reach_the_model_as_configured(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    agent = run.agent()
    configured = {t["name"]: t for t in agent.tools()}
    sdk_tools = tools(agent)
    llm = model([function_call("echo", {"msg": "x"}, call_id=new_id("call"))])

    drive(llm, sdk_tools)

    for call in llm.calls:
        shown = {t.name: t for t in call.tools if isinstance(t, FunctionTool)}
        assert sorted(shown) == sorted(configured) == TOOLS
        for name, tool in shown.items():
            assert tool.params_json_schema == shown_as(configured[name]["input_schema"])
            assert tool.description == configured[name]["description"]
            assert tool.strict_json_schema is False
    # No strict-mode rewriting: search keeps its one required field and stays open to others.
    by_name = {t.name: t for t in sdk_tools}
    assert (
        by_name["search"].params_json_schema
        == configured["search"]["input_schema"]
        == {
            "type": "object",
            "required": ["q"],
            "properties": {"q": {"type": "string", "maxLength": 512}},
        }
    )
    # A tool configured without a schema: toolgate's `{"type": "object"}`, with the empty
    # `properties` the OpenAI API requires.
    assert configured["echo"]["input_schema"] == {"type": "object"}
    assert by_name["echo"].params_json_schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_replayed_turn_is_refused_as_duplicate(harness: toolgate.Harness, run_id: str, mode: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    sdk_tools = tools(run.agent())
    one, two = new_id("call"), new_id("call")
    turn = [
        function_call("echo", {"msg": "first"}, call_id=one),
        function_call("search", {"q": "redis"}, call_id=two),
    ]
    drive(model(turn), sdk_tools, mode)
    before = {i: run.invocation(i) for i in (one, two)}

    # The same turn again, in a new Runner run (a resumed or retried agent): refused, run goes on.
    replay = model(turn)
    result = drive(replay, sdk_tools, mode)

    assert result.final_output == "done"
    seen = outputs(replay.calls[1])
    assert seen[one].startswith("DUPLICATE_TOOL_CALL: ")
    assert seen[two].startswith("DUPLICATE_TOOL_CALL: ")
    # The first records are untouched, and the facts keep each call once.
    for i in (one, two):
        after = run.invocation(i)
        assert {k: v for k, v in after.items() if k != "ttl_ms"} == {
            k: v for k, v in before[i].items() if k != "ttl_ms"
        }
    assert run.state()["calls_used"] == 2
    assert sorted(f.tool_call_id for f in run.end().facts) == sorted([one, two])


def test_bad_arguments_reach_the_model_as_invalid_input(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    sdk_tools = tools(run.agent())
    broken, not_object, off_schema = new_id("call"), new_id("call"), new_id("call")
    llm = model(
        [
            function_call("echo", '{"msg": ', call_id=broken),
            function_call("echo", "[1, 2]", call_id=not_object),
            function_call("search", {"q": 42}, call_id=off_schema),
        ]
    )

    drive(llm, sdk_tools)

    seen = outputs(llm.calls[1])
    assert seen[broken] == "INVALID_INPUT: the tool arguments are not valid JSON."
    assert seen[not_object] == "INVALID_INPUT: the tool arguments must be a JSON object."
    # The schema is toolgate's to check, not the SDK's: its refusal reaches the model as is.
    assert seen[off_schema].startswith("INVALID_INPUT: ")
    # Refused before anything was recorded or spent.
    assert run.state()["calls_used"] == 0
    for i in (broken, not_object, off_schema):
        with pytest.raises(toolgate.ToolgateError) as err:
            run.invocation(i)
        assert err.value.code == "NOT_FOUND"


def test_a_run_ended_mid_loop_reaches_the_model(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    sdk_tools = tools(run.agent())
    run.end()
    late = new_id("call")
    llm = model([function_call("echo", {"msg": "late"}, call_id=late)])

    result = drive(llm, sdk_tools)

    assert result.final_output == "done"
    assert outputs(llm.calls[1])[late].startswith("RUN_INACTIVE: ")


def test_a_context_without_a_call_id_is_refused(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    echo = next(t for t in tools(run.agent()) if t.name == "echo")
    bare: RunContextWrapper[None] = RunContextWrapper(context=None)
    blank = ToolContext(context=None, tool_name="echo", tool_call_id="", tool_arguments='{"msg": "x"}')

    for ctx in (bare, blank):
        # A bare RunContextWrapper is what a hand-made call may pass; the SDK's type says ToolContext.
        text: str = asyncio.run(echo.on_invoke_tool(ctx, '{"msg": "x"}'))  # type: ignore[arg-type]
        assert text.startswith("INVALID_TOOL_CALL_ID: ")
        assert "id of this tool call" in text
    assert run.state()["calls_used"] == 0
