"""The PydanticAI adapter, driven by pydantic-ai's own agent loop and its own test model
(`FunctionModel`) against a real toolgate: the model picks the tool call ids, toolgate keys its
records by them, and what the model is sent back on the next turn is checked."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import Sidecar, new_id

import toolgate

try:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        ModelResponsePart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.tools import RunContext
    from pydantic_ai.usage import RunUsage

    from toolgate.pydantic_ai import toolset
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"pydantic-ai is not installed ({e}): pip install -e 'clients/python[pydantic-ai]'", pytrace=False
    )

SEARCH_SCHEMA = {
    "type": "object",
    "required": ["q"],
    "properties": {"q": {"type": "string", "maxLength": 512}},
}


class Script:
    """A FunctionModel function: answers model turn i with the parts of turn i, and keeps what it
    was sent each turn (the history and the tool definitions)."""

    def __init__(self, *turns: Sequence[ModelResponsePart]) -> None:
        self.turns = turns
        self.seen: list[tuple[list[ModelMessage], AgentInfo]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append((list(messages), info))
        return ModelResponse(parts=list(self.turns[len(self.seen) - 1]))

    def returns(self, turn: int) -> dict[str, ToolReturnPart]:
        """The tool returns the model was sent at the start of `turn`, by tool call id."""
        request = self.seen[turn][0][-1]
        assert isinstance(request, ModelRequest)
        return {p.tool_call_id: p for p in request.parts if isinstance(p, ToolReturnPart)}


def model_agent(script: Script, agent: toolgate.Agent) -> PydanticAgent[None, str]:
    """A pydantic-ai agent on `script` with the run's tools, instrumentation off (no network)."""
    model_agent = PydanticAgent(FunctionModel(script), toolsets=[toolset(agent)])
    model_agent.instrument = False
    return model_agent


def call(tool: str, args: dict[str, Any], tool_call_id: str) -> ToolCallPart:
    return ToolCallPart(tool_name=tool, args=args, tool_call_id=tool_call_id)


@pytest.fixture
def harness(sidecar: Sidecar) -> Any:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


def assert_ready(run: toolgate.Run, part: ToolReturnPart, tool: str) -> None:
    """The return the model got is the projected result of the READY record under the same id."""
    record = run.invocation(part.tool_call_id)
    assert (record["tool_call_id"], record["tool"], record["status"]) == (part.tool_call_id, tool, "READY")
    assert part.outcome == "success"
    assert part.content == record["agent_result"]
    assert part.metadata == {"evidence_status": record["evidence_status"]}


def assert_failed(part: ToolReturnPart, code: str) -> None:
    """The model got a failed tool result whose text starts with toolgate's code."""
    assert part.outcome == "failed"
    assert isinstance(part.content, str)
    assert part.content.startswith(f"{code}: "), part.content


def test_the_model_sees_the_configured_tools(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo"])
    agent = run.agent()
    script = Script([TextPart("nothing to call")])

    assert model_agent(script, agent).run_sync("hello").output == "nothing to call"

    defs = {d.name: d for d in script.seen[0][1].function_tools}
    assert set(defs) == {"search", "echo"}
    assert defs["search"].parameters_json_schema == SEARCH_SCHEMA
    assert defs["search"].description == "Search the sample index."
    assert defs["echo"].parameters_json_schema == {"type": "object"}
    assert defs["echo"].description == "Echo the input."
    listed = {t["name"]: t for t in agent.tools()}
    for name, d in defs.items():
        assert d.parameters_json_schema == listed[name]["input_schema"]
        assert d.strict is False
    run.end()


def test_parallel_calls_are_recorded_under_the_model_ids(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo"])
    s, e = new_id("call"), new_id("call")
    script = Script(
        [call("search", {"q": "redis"}, s), call("echo", {"text": "hi"}, e)],
        [TextPart("done")],
    )

    assert model_agent(script, run.agent()).run_sync("look it up").output == "done"

    returns = script.returns(1)
    assert set(returns) == {s, e}
    assert_ready(run, returns[s], "search")
    assert_ready(run, returns[e], "echo")
    assert returns[e].content == {"item": {"text": "hi"}}
    found = returns[s].content
    assert isinstance(found, dict)
    assert (found["total_items"], len(found["items"])) == (7, 5)
    facts = run.end()
    assert sorted(f.tool_call_id for f in facts.facts) == sorted([s, e])
    assert facts.excluded == 0


def test_facts_list_the_ready_ids_in_order(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo"])
    ids = [new_id("call") for _ in range(3)]
    script = Script(
        [call("echo", {"n": 1}, ids[0])],
        [call("search", {"q": "nothing"}, ids[1])],
        [call("echo", {"n": 3}, ids[2])],
        [TextPart("done")],
    )

    result = asyncio.run(model_agent(script, run.agent()).run("three steps"))

    assert result.output == "done"
    for turn, (tool_call_id, tool) in enumerate(zip(ids, ["echo", "search", "echo"], strict=True), start=1):
        part = script.returns(turn)[tool_call_id]
        assert_ready(run, part, tool)
    assert script.returns(2)[ids[1]].metadata == {"evidence_status": "NO_EVIDENCE"}
    assert [f.tool_call_id for f in run.facts().facts] == ids
    run.end()


def test_tool_errors_reach_the_model_and_the_run_goes_on(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["fail", "search", "echo"])
    f1, f2, bad, ok = (new_id("call") for _ in range(4))
    script = Script(
        [call("fail", {}, f1)],
        # The same tool failing again: pydantic-ai's retry budget (1 by default) is not spent.
        [call("fail", {}, f2)],
        # Not valid against the schema: toolgate, not pydantic-ai, refuses it.
        [call("search", {"q": 5}, bad)],
        [call("echo", {"after": "errors"}, ok)],
        [TextPart("recovered")],
    )

    assert model_agent(script, run.agent()).run_sync("try").output == "recovered"

    assert_failed(script.returns(1)[f1], "TOOL_EXECUTION_FAILED")
    assert_failed(script.returns(2)[f2], "TOOL_EXECUTION_FAILED")
    assert_failed(script.returns(3)[bad], "INVALID_INPUT")
    assert_ready(run, script.returns(4)[ok], "echo")
    for failed in (f1, f2):
        record = run.invocation(failed)
        assert (record["status"], record["error_code"]) == ("ERROR", "TOOL_EXECUTION_FAILED")
    with pytest.raises(toolgate.ToolgateError) as refused:
        run.invocation(bad)  # refused before any record was made
    assert refused.value.code == "NOT_FOUND"
    facts = run.end()
    assert [f.tool_call_id for f in facts.facts] == [ok]
    assert facts.excluded == 2


def test_a_replayed_turn_is_refused_as_duplicate(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["echo"])
    agent = run.agent()
    d = new_id("call")
    turns = ([call("echo", {"text": "once"}, d)], [TextPart("done")])
    first, replay = Script(*turns), Script(*turns)

    assert asyncio.run(model_agent(first, agent).run("go")).output == "done"
    assert_ready(run, first.returns(1)[d], "echo")
    record = run.invocation(d)
    # A new agent run replays the same model turn, with the same tool call id.
    assert asyncio.run(model_agent(replay, agent).run("go")).output == "done"

    assert_failed(replay.returns(1)[d], "DUPLICATE_TOOL_CALL")
    del record["ttl_ms"]
    again = run.invocation(d)
    del again["ttl_ms"]
    assert again == record  # the first record is left untouched
    facts = run.end()
    assert [f.tool_call_id for f in facts.facts] == [d]
    assert facts.excluded == 0


def test_an_id_with_a_colon_works(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["echo"])
    c = f"{new_id('call')}:0"
    script = Script([call("echo", {"text": "colon"}, c)], [TextPart("done")])

    assert model_agent(script, run.agent()).run_sync("go").output == "done"

    assert_ready(run, script.returns(1)[c], "echo")
    assert [f.tool_call_id for f in run.end().facts] == [c]


def test_a_call_without_an_id_is_refused(harness: toolgate.Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["echo"])
    tools = toolset(run.agent())
    ctx = RunContext[None](deps=None, model=FunctionModel(Script()), usage=RunUsage())

    async def main() -> None:
        tool = (await tools.get_tools(ctx))["echo"]
        await tools.call_tool("echo", {"text": "x"}, ctx, tool)

    with pytest.raises(UserError, match="without a tool call id"):
        asyncio.run(main())
    assert run.state()["calls_used"] == 0
    run.end()
