"""OpenAI Agents SDK adapter: a run's toolgate tools as the SDK's own `FunctionTool`s.

`tools(agent)` asks toolgate once for the tools the run may call and builds one
`agents.FunctionTool` per tool: its name, description and JSON schema as configured, with
`strict_json_schema=False`, since the SDK's strict mode would rewrite the schema (every property
required, `additionalProperties: false`) before the model sees it. toolgate checks the arguments
against the configured schema and answers `INVALID_INPUT`. The one addition: an object schema
without `properties` (`{"type": "object"}`, the schema of a tool configured without one) gets an
empty `properties`, because the OpenAI API refuses a function whose parameters lack it ("object
schema missing properties"). It accepts exactly the same arguments, and it is what the SDK's own
MCP client shows the model for the same tool.

Each call carries the SDK's own id of that call, `ToolContext.tool_call_id` (the model's
`call_id`), to toolgate unchanged. A context without one (the tool invoked by hand with a bare
`RunContextWrapper`) is refused before anything is sent: toolgate never invents an id, and neither
does this adapter.

The tool's output, which the SDK sends back to the model as the call's `function_call_output`:

- `READY`: the projected result as compact JSON text.
- a toolgate error (a duplicate id, a tool the run may not call, a failing upstream, a transport
  failure, ...): `"CODE: message"` (`DUPLICATE_TOOL_CALL: ...`), returned as the output, never
  raised. The SDK ends the whole run on an exception from a tool; returned, the error reaches the
  model, which can adapt, and the run goes on.
- arguments that are not a JSON object: `INVALID_INPUT: ...`, with nothing sent.

The HTTP call runs in a worker thread (`Agent.ainvoke`), so the event loop stays free and the
parallel calls of one model turn run in parallel, under `Runner.run` and `Runner.run_sync` alike.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from ._client import Agent
from ._errors import ToolgateError

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.tool_context import ToolContext
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolgate.openai_agents needs the OpenAI Agents SDK: pip install 'toolgate[openai-agents]'"
    ) from e

__all__ = ["tools"]

NO_TOOL_CALL_ID = (
    "INVALID_TOOL_CALL_ID: toolgate needs the id of this tool call and the tool context carries none; "
    "run the tool through the Agents SDK Runner, which passes the model's call_id."
)
NOT_JSON = "INVALID_INPUT: the tool arguments are not valid JSON."
NOT_AN_OBJECT = "INVALID_INPUT: the tool arguments must be a JSON object."


def tools(agent: Agent) -> list[FunctionTool]:
    """The tools `agent`'s run may call, as OpenAI Agents SDK function tools.

    Pass them to `agents.Agent(tools=...)`. The tool list is fetched once, here (`GET /v1/tools`).
    """
    return [
        FunctionTool(
            name=spec["name"],
            description=spec.get("description") or "",
            params_json_schema=_parameters(spec.get("input_schema") or {"type": "object"}),
            on_invoke_tool=_invoker(agent, spec["name"]),
            strict_json_schema=False,
        )
        for spec in agent.tools()
    ]


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The configured schema as the model is shown it: unchanged, except that an object schema
    without `properties`, which the OpenAI API refuses, gets an empty one (same arguments valid)."""
    if schema.get("type") == "object" and "properties" not in schema:
        return {**schema, "properties": {}}
    return schema


def _invoker(agent: Agent, tool: str) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    """The `on_invoke_tool` of one tool: the model-visible output text, never an exception."""

    async def on_invoke_tool(ctx: ToolContext[Any] | RunContextWrapper[Any], args_json: str) -> str:
        tool_call_id = getattr(ctx, "tool_call_id", None)
        if not isinstance(tool_call_id, str) or not tool_call_id:
            return NO_TOOL_CALL_ID
        try:
            # A tool without parameters may be called with no argument text at all.
            arguments = json.loads(args_json) if args_json.strip() else {}
        except ValueError:
            return NOT_JSON
        if not isinstance(arguments, dict):
            return NOT_AN_OBJECT
        try:
            result = await agent.ainvoke(tool, arguments, tool_call_id=tool_call_id)
        except ToolgateError as e:
            return str(e)
        return json.dumps(result.result, ensure_ascii=False, separators=(",", ":"))

    return on_invoke_tool
