"""PydanticAI adapter: a run's toolgate tools as one pydantic-ai toolset.

`toolset(agent)` asks toolgate once for the tools the run may call and builds one
`ToolDefinition` per tool: its name, description and JSON schema exactly as configured, with
`strict=False` so no provider rewrites the schema for its strict mode. pydantic-ai's own argument
validation is reduced to "the arguments are a JSON object": toolgate checks them against the
schema itself and answers `INVALID_INPUT`.

Each call carries the framework's own id of that call, `RunContext.tool_call_id`, to toolgate
unchanged. (When a provider sends no id, pydantic-ai gives the call one of its own, `pyd_ai_…`,
and keeps it in the message history; that is the id toolgate sees.) A context without one is
refused with `UserError`: toolgate never invents an id, and neither does this adapter.

A `READY` call returns the projected result as a JSON value, which pydantic-ai hands the model as
the tool's structured return (or its JSON text, for providers that only take text). The call's
evidence status goes in the return part's `metadata`, which the application sees and the model
does not.

A toolgate error is raised as `pydantic_ai.exceptions.ToolFailed("CODE: message")`. pydantic-ai
turns it into the call's `ToolReturnPart` with `outcome="failed"`, sent through the provider's
native tool-error channel (or as `{"error": "CODE: ..."}` where there is none), and the run goes
on. The alternatives fit worse:

- `ModelRetry` spends the tool's retry budget, so a second toolgate error on one tool would end
  the run; it also tells the model to fix and repeat a call that toolgate refused for reasons the
  model mostly cannot change (a duplicate id, a spent budget, a failing upstream).
- returning the error text as an ordinary result would hide from the model, the provider and the
  application that the call failed.

The HTTP call is `Agent.ainvoke`: the sync call in a worker thread, so the event loop stays free
and the calls the model makes in parallel run in parallel.
"""

from __future__ import annotations

from typing import Any

from ._client import Agent
from ._errors import ToolgateError

try:
    from pydantic_ai.exceptions import ToolFailed, UserError
    from pydantic_ai.messages import ToolReturn
    from pydantic_ai.tools import RunContext, ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("toolgate.pydantic_ai needs pydantic-ai: pip install 'toolgate[pydantic-ai]'") from e

__all__ = ["ToolgateToolset", "toolset"]

# Any JSON object: the schema itself is toolgate's to check.
_ARGS_VALIDATOR = SchemaValidator(core_schema.dict_schema(keys_schema=core_schema.str_schema()))


def toolset(agent: Agent, *, id: str = "toolgate") -> AbstractToolset[Any]:
    """The tools `agent`'s run may call, as a pydantic-ai toolset.

    Pass it to `pydantic_ai.Agent(..., toolsets=[...])` or to one run's `toolsets=`. The tool list
    is fetched once, here; `id` names the toolset among the agent's others.
    """
    return ToolgateToolset(agent, id=id)


class ToolgateToolset(AbstractToolset[Any]):
    """A pydantic-ai toolset whose calls go through toolgate, keyed by the framework's call ids."""

    def __init__(self, agent: Agent, *, id: str = "toolgate") -> None:
        """List `agent`'s tools (`GET /v1/tools`) and keep their definitions."""
        self._agent = agent
        self._id = id
        self._tool_defs = [
            ToolDefinition(
                name=tool["name"],
                description=tool.get("description"),
                parameters_json_schema=tool["input_schema"],
                strict=False,
            )
            for tool in agent.tools()
        ]

    @property
    def id(self) -> str:
        """The toolset's id among the pydantic-ai agent's toolsets."""
        return self._id

    @property
    def tool_defs(self) -> list[ToolDefinition]:
        """The definitions the model is shown, one per tool of the run."""
        return list(self._tool_defs)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One tool per definition; the retry budget only covers arguments that are not an object."""
        return {
            tool_def.name: ToolsetTool[Any](
                toolset=self,
                tool_def=tool_def,
                max_retries=ctx.max_retries,
                args_validator=_ARGS_VALIDATOR,
            )
            for tool_def in self._tool_defs
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> ToolReturn[Any]:
        """Invoke `name` through toolgate under `ctx.tool_call_id`.

        Returns the projected result; a toolgate error is raised as `ToolFailed` with its code
        first, so the model sees it as the call's failed result and the run goes on.
        """
        tool_call_id = ctx.tool_call_id
        if tool_call_id is None:
            raise UserError(
                f"toolgate tool {name!r} was called without a tool call id (RunContext.tool_call_id "
                "is None); toolgate keys every call by the framework's own id and never invents one"
            )
        try:
            result = await self._agent.ainvoke(name, tool_args, tool_call_id=tool_call_id)
        except ToolgateError as e:
            raise ToolFailed(str(e)) from e
        return ToolReturn(return_value=result.result, metadata={"evidence_status": result.evidence_status})
