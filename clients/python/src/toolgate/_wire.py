"""The wire protocol, shared by the sync and async clients: requests to send and answers to decode.

Everything here is pure: the clients only move a `Call` over their own httpx client and hand the
response (or the transport failure) back here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ._errors import TRANSPORT_ERROR, ToolgateError
from ._models import unexpected

DEFAULT_TIMEOUT = 30.0
"""Seconds a request may take, connecting included, before it fails with TRANSPORT_ERROR."""


@dataclass(frozen=True)
class Call:
    """One HTTP request: method, path below the listener's base URL, and JSON body (None: none)."""

    method: str
    path: str
    body: dict[str, Any] | None = None


def segment(value: str) -> str:
    """A path segment: percent-encoded with nothing left safe (toolgate decodes it once)."""
    return quote(value, safe="")


def base_url(url: str) -> str:
    """A listener's base URL without its trailing slash, so paths can be appended."""
    return url.rstrip("/")


def run_id_of(run_token: str) -> str:
    """The run a run token is bound to: everything before its last ``.``."""
    run_id, dot, mac = run_token.rpartition(".")
    if not dot or not run_id or not mac:
        # Never echo the token: it is a credential.
        raise ValueError("not a run token: a run token is '<run_id>.<mac>'")
    return run_id


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for a token."""
    return {"Authorization": f"Bearer {token}"}


def create_run(
    run_id: str,
    *,
    tools: list[str] | None,
    timeout_ms: int | None,
    budget: dict[str, Any] | None,
    workspace: str | None,
    home: str | None,
) -> Call:
    """``POST /v1/runs``; fields left None are omitted, so the server's defaults apply."""
    body: dict[str, Any] = {"run_id": run_id}
    if tools is not None:
        body["tools"] = list(tools)
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    if budget is not None:
        body["budget"] = budget
    if workspace is not None:
        body["workspace"] = workspace
    if home is not None:
        body["home"] = home
    return Call("POST", "/v1/runs", body)


def run_call(method: str, run_id: str, action: str = "") -> Call:
    """A request on one run: ``/v1/runs/{run_id}`` or ``/v1/runs/{run_id}/{action}``."""
    path = f"/v1/runs/{segment(run_id)}"
    return Call(method, f"{path}/{action}" if action else path)


def invocation(run_id: str, tool_call_id: str) -> Call:
    """``GET /v1/runs/{run_id}/invocations/{tool_call_id}``."""
    return Call("GET", f"/v1/runs/{segment(run_id)}/invocations/{segment(tool_call_id)}")


def invoke(run_id: str, tool: str, input: dict[str, Any], tool_call_id: str) -> Call:
    """``POST /v1/invoke``: the envelope form of a tool call."""
    return Call(
        "POST", "/v1/invoke", {"run_id": run_id, "tool_call_id": tool_call_id, "tool": tool, "input": input}
    )


TOOLS = Call("GET", "/v1/tools")
"""``GET /v1/tools``: the tools the token's run may call."""


def decode(response: httpx.Response, tool_call_id: str | None = None) -> Any:
    """The JSON body of a 2xx answer; any other answer raised as a ToolgateError.

    ``tool_call_id`` is the id of the tool call the request made, if any: it goes on the
    client's own UNEXPECTED_RESPONSE errors (toolgate's own errors carry the id it echoed).
    """
    status = response.status_code
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
        parsed = False
    else:
        parsed = True
    if 200 <= status < 300:
        if not parsed:
            raise unexpected("JSON", status, tool_call_id)
        return body
    if isinstance(body, dict):
        error = body.get("error")
        echoed = body.get("tool_call_id")
        if (
            body.get("status") == "ERROR"
            and isinstance(error, dict)
            and isinstance(error.get("code"), str)
            and isinstance(error.get("message"), str)
            and (echoed is None or isinstance(echoed, str))
        ):
            raise ToolgateError(error["code"], error["message"], http_status=status, tool_call_id=echoed)
    raise unexpected("a toolgate error", status, tool_call_id)


def transport_error(exc: httpx.RequestError, tool_call_id: str | None = None) -> ToolgateError:
    """A request that got no answer. The message names the kind of failure only: the exception's
    own text can carry URLs and host names."""
    if isinstance(exc, httpx.TimeoutException):
        message = "toolgate did not answer in time."
    elif isinstance(exc, httpx.ConnectError):
        message = "Could not connect to toolgate."
    else:
        message = f"The request to toolgate failed ({type(exc).__name__})."
    return ToolgateError(TRANSPORT_ERROR, message, http_status=None, tool_call_id=tool_call_id)
