"""MCP adapter: a `tools/call` on an `mcp` `ClientSession` that carries toolgate's ids.

toolgate's `/mcp` endpoint keys each call by the ids in the request's `_meta`:
`toolgate.dev/run_id` and `toolgate.dev/tool_call_id`, the framework's own id of the call.
`call_tool(session, name, arguments, run_id=..., tool_call_id=...)` sends them there, through the
`meta` argument of `ClientSession.call_tool` (mcp 1.19 and later, and 2.x); an older session is
refused with a `TypeError` rather than sending a call toolgate would answer without the ids.

It returns the session's `CallToolResult` as is:

- `READY`: `isError` false, the projected result as `structuredContent` and as compact JSON text,
  and `_meta` with `toolgate.dev/tool_call_id` and `toolgate.dev/evidence_status`.
- every toolgate error (an unknown tool, a duplicate id, a failing upstream, ...): `isError` true,
  text `"CODE: message"`, the error body as `structuredContent`. Nothing is raised for these.

What the session itself raises propagates unchanged, in each SDK major's own way: a refused
token or an oversized body (HTTP 401/413, which toolgate answers outside MCP; mcp 2.x raises
`MCPError`, mcp 1.x closes the transport, so the call fails with `anyio.ClosedResourceError`
and leaving the session raises the `httpx.HTTPStatusError`), a broken connection, a JSON-RPC
error, a timeout. A call cut off after it was sent may still have run on the server: do not
repeat it with the same `tool_call_id` (it would be `DUPLICATE_TOOL_CALL`); read its record
through the harness instead.

The ids are checked only for being non-empty strings: toolgate itself judges their form and
answers a malformed one as an `isError` result. Nothing here ever makes an id up.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final

try:
    from mcp import ClientSession
    from mcp.types import CallToolResult
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("toolgate.mcp needs the MCP SDK: pip install 'toolgate[mcp]'") from e

__all__ = ["call_tool"]

_RUN_ID_KEY: Final = "toolgate.dev/run_id"
_TOOL_CALL_ID_KEY: Final = "toolgate.dev/tool_call_id"


async def call_tool(
    session: ClientSession,
    name: str,
    arguments: dict[str, Any] | None,
    *,
    run_id: str,
    tool_call_id: str,
) -> CallToolResult:
    """Call the tool `name` through toolgate's MCP endpoint under the framework's `tool_call_id`.

    `session` is an initialized `mcp.ClientSession` (mcp 1.x or 2.x; with mcp 2.x's `Client`,
    pass `client.session`) connected to toolgate's `/mcp` with the run's token. `arguments` is
    the tool input (None sends none, which toolgate reads as `{}`). `run_id` is the run the token
    belongs to, `tool_call_id` the id the framework gave this call: both go in the request's
    `_meta`.

    Returns the `CallToolResult`; toolgate errors come back as `isError` results whose text starts
    with the code (`DUPLICATE_TOOL_CALL: ...`). Raises `ValueError` for an empty or non-string id
    and `TypeError` for a session whose `call_tool` takes no `meta`; anything the session raises
    (transport failures, HTTP 401/413, JSON-RPC errors) propagates unchanged.
    """
    _require_id("run_id", run_id)
    _require_id("tool_call_id", tool_call_id)
    if not _takes_meta(session):
        raise TypeError(
            f"{type(session).__qualname__}.call_tool takes no `meta`, so it cannot send toolgate's "
            "ids: toolgate.mcp needs mcp 1.19 or later (pip install 'toolgate[mcp]')"
        )
    # The call is the same in both SDKs, but their types differ: 1.x takes `meta` as a dict, 2.x
    # as `RequestParamsMeta`, a TypedDict open to extra keys (PEP 728) that mypy cannot yet check
    # keys like these against. Hence the plain callable type.
    send: Callable[..., Awaitable[CallToolResult]] = session.call_tool
    return await send(name, arguments, meta={_RUN_ID_KEY: run_id, _TOOL_CALL_ID_KEY: tool_call_id})


def _require_id(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"{what} must be a non-empty string, got {value!r}: toolgate keys every call by the "
            "framework's own ids and never makes one up"
        )


def _takes_meta(session: ClientSession) -> bool:
    """Whether the session's `call_tool` accepts a `meta` keyword (mcp 1.19+, 2.x)."""
    try:
        params = inspect.signature(session.call_tool).parameters
    except (TypeError, ValueError):
        return True  # not introspectable (a C callable, a proxy): let the call itself decide
    return "meta" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
