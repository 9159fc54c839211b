"""The recipe for an OpenAI Agents SDK user who keeps the SDK's own MCP support instead of
`toolgate.openai_agents.tools`: `MCPServerStreamableHttp` pointed at toolgate's `/mcp` with the run
token as bearer, and a `tool_meta_resolver` that puts the call's ids into the request's `_meta`.
The SDK's own loop and scripted test model drive it against a real toolgate: the records are keyed
by the model's call ids, and the model reads toolgate's answers, errors included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Sidecar, new_id

import toolgate

try:
    from agents import Agent, FunctionTool, RunConfig, Runner, RunResult
    from agents.items import TResponseOutputItem
    from agents.mcp import MCPServerStreamableHttp, MCPToolMetaContext
    from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call
    from agents.tool_context import ToolContext
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"The OpenAI Agents SDK is not installed ({e}): pip install -e 'clients/python[openai-agents]'",
        pytrace=False,
    )

# The SDK opens its MCP client with the mcp package's older entry point; not this recipe's concern.
pytestmark = pytest.mark.filterwarnings("ignore:Use `streamable_http_client` instead:DeprecationWarning")

TOOLS = ["echo", "fail", "search"]
NO_TRACING = RunConfig(tracing_disabled=True)


def toolgate_mcp(agent_url: str, run_token: str) -> MCPServerStreamableHttp:
    """The recipe: the SDK's MCP client on toolgate's `/mcp`, sending the call's ids in `_meta`.

    The SDK hands the resolver a `ToolContext` as `run_context`, whose `tool_call_id` is the
    model's `call_id`. With no id there is nothing to send: toolgate then refuses the call
    (`INVALID_TOOL_CALL_ID`), it never makes one up.
    """
    run_id = run_token.rsplit(".", 1)[0]  # a run token is `<run_id>.<mac>`

    def ids(call: MCPToolMetaContext) -> dict[str, Any]:
        meta: dict[str, Any] = {"toolgate.dev/run_id": run_id}
        if isinstance(call.run_context, ToolContext):
            meta["toolgate.dev/tool_call_id"] = call.run_context.tool_call_id
        return meta

    return MCPServerStreamableHttp(
        {"url": f"{agent_url}/mcp", "headers": {"Authorization": f"Bearer {run_token}"}},
        name="toolgate",
        tool_meta_resolver=ids,
    )


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[toolgate.Harness]:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


async def drive(llm: ScriptedModel, server: MCPServerStreamableHttp) -> RunResult:
    async with server:
        sdk_agent = Agent(name="assistant", instructions="Use the tools.", model=llm, mcp_servers=[server])
        result = await Runner.run(sdk_agent, "go", run_config=NO_TRACING)
    llm.assert_complete()
    return result


def model(*turns: list[TResponseOutputItem]) -> ScriptedModel:
    """The SDK's scripted model: the given turns, then a final answer."""
    return ScriptedModel([*turns, [assistant_message("done")]])


def outputs(call: ModelCall) -> dict[str, str]:
    """The tool outputs a model call was given, by call id: the text of toolgate's one text
    content block, which the SDK passes on as one `input_text` part."""
    found: dict[str, str] = {}
    for item in call.input:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            [part] = item["output"]
            assert part["type"] == "input_text"
            found[item["call_id"]] = part["text"]
    return found


def test_sdk_mcp_client_keys_records_by_the_model_call_ids(
    sidecar: Sidecar, harness: toolgate.Harness, run_id: str
) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    searched, echoed, failed, colon = new_id("call"), new_id("call"), new_id("call"), f"call:{new_id('x')}"
    llm = model(
        [
            function_call("search", {"q": "redis"}, call_id=searched),
            function_call("echo", {"msg": "hi"}, call_id=echoed),
        ],
        [
            function_call("fail", {}, call_id=failed),
            function_call("echo", {"msg": "colon"}, call_id=colon),
        ],
    )

    result = asyncio.run(drive(llm, toolgate_mcp(sidecar.agent_url, run.run_token)))

    assert result.final_output == "done"
    assert run.state()["calls_used"] == 4
    records = {i: run.invocation(i) for i in (searched, echoed, failed, colon)}
    assert {i: r["tool_call_id"] for i, r in records.items()} == {i: i for i in records}
    assert [r["status"] for r in records.values()] == ["READY", "READY", "ERROR", "READY"]

    # The schemas the model was shown are toolgate's, not made strict (the SDK's MCP default); the
    # SDK adds the empty `properties` the OpenAI API requires where a schema has none.
    shown = {t.name: t for t in llm.calls[0].tools if isinstance(t, FunctionTool)}
    assert sorted(shown) == TOOLS
    for spec in run.agent().tools():
        assert shown[spec["name"]].params_json_schema == {"properties": {}, **spec["input_schema"]}
        assert shown[spec["name"]].strict_json_schema is False

    second = outputs(llm.calls[1])
    assert json.loads(second[searched]) == records[searched]["agent_result"]
    assert json.loads(second[echoed]) == records[echoed]["agent_result"]
    later = outputs(llm.calls[2])
    assert records[failed]["error_code"] == "TOOL_EXECUTION_FAILED"
    assert later[failed].startswith("TOOL_EXECUTION_FAILED: ")
    assert json.loads(later[colon]) == records[colon]["agent_result"]

    facts = run.end()
    assert {f.tool_call_id for f in facts.facts[:2]} == {searched, echoed}
    assert [f.tool_call_id for f in facts.facts[2:]] == [colon]


def test_sdk_mcp_client_replay_is_refused_as_duplicate(
    sidecar: Sidecar, harness: toolgate.Harness, run_id: str
) -> None:
    run = harness.create_run(run_id, tools=TOOLS)
    once = new_id("call")
    turn = [function_call("echo", {"msg": "once"}, call_id=once)]
    asyncio.run(drive(model(turn), toolgate_mcp(sidecar.agent_url, run.run_token)))

    replay = model(turn)
    result = asyncio.run(drive(replay, toolgate_mcp(sidecar.agent_url, run.run_token)))

    assert result.final_output == "done"
    assert outputs(replay.calls[1])[once].startswith("DUPLICATE_TOOL_CALL: ")
    assert run.state()["calls_used"] == 1
    assert [f.tool_call_id for f in run.end().facts] == [once]
