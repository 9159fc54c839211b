"""LangChain/LangGraph adapter: a run's toolgate tools as LangChain tools.

`tools(agent)` asks toolgate once for the tools the run may call and builds one `ToolgateTool`
(a `langchain_core.tools.BaseTool`) per tool: its name, description and JSON schema exactly as
configured, the schema given as `args_schema` unchanged. LangChain does not validate a JSON-schema
`args_schema` itself: toolgate checks the arguments and answers `INVALID_INPUT`.

Each call carries the framework's own id of that call, the `ToolCall`'s `id`, to toolgate
unchanged. LangChain hands that id to a tool only when the tool is invoked with the whole
`ToolCall` (`tool.invoke({"type": "tool_call", "id": ..., "name": ..., "args": ...})`, which is
what LangGraph's `ToolNode` and `create_react_agent` do) or with `tool.run(args,
tool_call_id=...)`; `BaseTool._run` itself never sees it. `ToolgateTool` takes it where
langchain-core turns the call into `_run`'s arguments (`_to_args_and_kwargs`, the hook
langchain-core's own `Tool` overrides), so every path that knows the id passes it. A call without
one (`tool.invoke({"q": ...})`) is refused with a `ValueError` before anything is sent: toolgate
never invents an id, and neither does this adapter.

The answer is a `ToolMessage` under the call's id:

- `READY`: `content` is the projected result as compact JSON text, `status="success"`, and
  `artifact` is `{"result": <the projected result>, "evidence_status": ...}`, which the
  application sees and the model does not.
- a toolgate error (a duplicate id, a tool the run may not call, a failing upstream, a transport
  failure, ...): `content` is `"CODE: message"` (`DUPLICATE_TOOL_CALL: ...`) and
  `status="error"`. The tool raises it as a `ToolException`, which langchain-core itself turns
  into that message (`handle_tool_error=True`), so the model sees the failure and the graph goes
  on.

Sync runs (`invoke`, `stream`) make the HTTP call in the calling thread; async runs (`ainvoke`,
`astream`) use `Agent.ainvoke`, the sync call in a worker thread, so the event loop stays free
and parallel tool calls run in parallel.
"""

from __future__ import annotations

import json
from typing import Any

from ._client import Agent
from ._errors import ToolgateError
from ._models import ToolResult

try:
    from langchain_core.tools import BaseTool, ToolException
    from pydantic import PrivateAttr
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("toolgate.langchain needs langchain-core: pip install 'toolgate[langchain]'") from e

__all__ = ["ToolgateTool", "tools"]


def tools(agent: Agent) -> list[BaseTool]:
    """The tools `agent`'s run may call, as LangChain tools.

    Pass them to LangGraph's `create_react_agent`, a `ToolNode`, or a chat model's
    `bind_tools`. The tool list is fetched once, here (`GET /v1/tools`).
    """
    return [
        ToolgateTool(
            agent,
            name=spec["name"],
            description=spec.get("description") or "",
            args_schema=spec.get("input_schema") or {"type": "object"},
        )
        for spec in agent.tools()
    ]


class ToolgateTool(BaseTool):
    """A LangChain tool whose calls go through toolgate, keyed by the `ToolCall`'s `id`.

    Made by `tools(agent)`; build one directly only to name a tool the run's list does not
    offer. Invoke it with a whole `ToolCall`, as LangGraph does: plain arguments carry no id and
    are refused.
    """

    # Private, so the agent (and its run token) stays out of the tool's fields, repr and schema.
    _agent: Agent = PrivateAttr()

    def __init__(self, agent: Agent, *, name: str, description: str, args_schema: dict[str, Any]) -> None:
        """A tool named `name` on `agent`'s run, shown to the model with `description` and the JSON
        schema `args_schema` exactly as given."""
        super().__init__(
            name=name,
            description=description,
            args_schema=args_schema,
            # A toolgate error (a ToolException) becomes an error ToolMessage, not an exception.
            handle_tool_error=True,
            # The JSON text goes to the model; the structured result is the message's artifact.
            response_format="content_and_artifact",
        )
        self._agent = agent

    @property
    def args(self) -> dict[str, Any]:
        """The schema's `properties` (none for a schema that declares no properties)."""
        # BaseTool.args indexes `properties`, which `{"type": "object"}` does not have.
        schema = self.args_schema if isinstance(self.args_schema, dict) else {}
        properties = schema.get("properties", {})
        return properties if isinstance(properties, dict) else {}

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        # The one place where langchain-core hands a tool its call id: pass it on to `_run`.
        _, arguments = super()._to_args_and_kwargs(tool_input, tool_call_id)
        if tool_call_id is None:
            raise ValueError(
                f"toolgate tool {self.name!r} needs a tool_call_id: invoke it with the model's whole "
                "ToolCall ({'type': 'tool_call', 'id': ..., 'name': ..., 'args': ...}), as LangGraph's "
                "ToolNode does, not with bare arguments; toolgate keys every call by the framework's "
                "own id and never invents one"
            )
        return (), {"arguments": arguments, "tool_call_id": tool_call_id}

    def _run(self, arguments: dict[str, Any], tool_call_id: str) -> tuple[str, dict[str, Any]]:
        try:
            result = self._agent.invoke(self.name, arguments, tool_call_id=tool_call_id)
        except ToolgateError as e:
            raise ToolException(str(e)) from e
        return _ready(result)

    async def _arun(self, arguments: dict[str, Any], tool_call_id: str) -> tuple[str, dict[str, Any]]:
        try:
            result = await self._agent.ainvoke(self.name, arguments, tool_call_id=tool_call_id)
        except ToolgateError as e:
            raise ToolException(str(e)) from e
        return _ready(result)


def _ready(result: ToolResult) -> tuple[str, dict[str, Any]]:
    """A READY answer as (content, artifact): compact JSON text as toolgate measures it (no
    whitespace, non-ASCII as is), and the structured result with its evidence status."""
    text = json.dumps(result.result, ensure_ascii=False, separators=(",", ":"))
    return text, {"result": result.result, "evidence_status": result.evidence_status}
