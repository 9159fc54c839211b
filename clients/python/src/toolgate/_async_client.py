"""The async twin of the client: AsyncHarness, AsyncRun and AsyncAgent, on httpx.AsyncClient.

Same methods, same answers and errors as the sync classes, awaitable; the wire format lives in
`_wire` and `_models`, shared by both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from . import _wire
from ._errors import ToolgateError
from ._models import (
    Facts,
    ToolResult,
    as_object,
    parse_created,
    parse_facts,
    parse_tool_result,
    parse_tools,
    run_deadline,
)

DEFAULT_TIMEOUT = _wire.DEFAULT_TIMEOUT


async def _send(
    client: httpx.AsyncClient,
    base: str,
    call: _wire.Call,
    token: str,
    timeout: float | None,
    tool_call_id: str | None = None,
) -> tuple[Any, int]:
    """One request, never retried: its decoded JSON body and HTTP status, or a ToolgateError."""
    try:
        response = await client.request(
            call.method, base + call.path, json=call.body, headers=_wire.bearer(token), timeout=timeout
        )
    except httpx.RequestError as exc:
        raise _wire.transport_error(exc, tool_call_id) from exc
    return _wire.decode(response, tool_call_id), response.status_code


class AsyncHarness:
    """The async ``Harness``: the owner of runs, on toolgate's admin listener.

    Owns the ``httpx.AsyncClient`` it creates (``await aclose()`` or ``async with``); one passed
    as ``http_client`` stays the caller's. Requests are never retried; every toolgate error is
    raised as a ``ToolgateError``.
    """

    def __init__(
        self,
        admin_url: str,
        *,
        admin_token: str,
        agent_url: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if not admin_token:
            raise ValueError("admin_token is empty")
        self._admin_url = _wire.base_url(admin_url)
        self._agent_url = _wire.base_url(agent_url) if agent_url is not None else None
        self._admin_token = admin_token
        self._timeout = timeout
        self._owns_client = http_client is None
        self._client = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout)

    @property
    def admin_url(self) -> str:
        """The admin listener's base URL."""
        return self._admin_url

    @property
    def agent_url(self) -> str | None:
        """The agent listener's base URL, if one was given."""
        return self._agent_url

    def __repr__(self) -> str:
        return f"AsyncHarness(admin_url={self._admin_url!r}, agent_url={self._agent_url!r})"

    async def _send(self, call: _wire.Call) -> tuple[Any, int]:
        return await _send(self._client, self._admin_url, call, self._admin_token, self._timeout)

    async def create_run(
        self,
        run_id: str,
        *,
        tools: list[str] | None = None,
        timeout_ms: int | None = None,
        budget: dict[str, Any] | None = None,
        workspace: str | None = None,
        home: str | None = None,
    ) -> AsyncRun:
        """Create a run and return its handle, run token included (see ``Harness.create_run``)."""
        call = _wire.create_run(
            run_id, tools=tools, timeout_ms=timeout_ms, budget=budget, workspace=workspace, home=home
        )
        created = parse_created(*await self._send(call))
        return AsyncRun(self, created.run_id, created.run_token, created.deadline)

    @asynccontextmanager
    async def run(
        self,
        run_id: str,
        *,
        tools: list[str] | None = None,
        timeout_ms: int | None = None,
        budget: dict[str, Any] | None = None,
        workspace: str | None = None,
        home: str | None = None,
    ) -> AsyncIterator[AsyncRun]:
        """Create a run for an ``async with`` block: ended when the block exits normally,
        cancelled when it raises (the exception then propagates; a failure to cancel does not
        replace it). Takes the arguments of ``create_run``."""
        run = await self.create_run(
            run_id, tools=tools, timeout_ms=timeout_ms, budget=budget, workspace=workspace, home=home
        )
        try:
            yield run
        except BaseException:
            try:
                await run.cancel()
            except ToolgateError:
                pass
            raise
        await run.end()

    async def attach(self, run_id: str, run_token: str) -> AsyncRun:
        """A handle on an existing run whose token the caller kept (see ``Harness.attach``)."""
        if _wire.run_id_of(run_token) != run_id:
            raise ValueError("the run token is not bound to this run id")
        body, status = await self._send(_wire.run_call("GET", run_id))
        return AsyncRun(self, run_id, run_token, run_deadline(body, status))

    async def aclose(self) -> None:
        """Close the HTTP client if the harness created it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncHarness:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncRun:
    """One run, as its async harness sees it (see ``Run``)."""

    def __init__(self, harness: AsyncHarness, run_id: str, run_token: str, deadline: datetime) -> None:
        self._harness = harness
        self._run_id = run_id
        self._run_token = run_token
        self._deadline = deadline

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._run_id

    @property
    def run_token(self) -> str:
        """The run token (``<run_id>.<mac>``): the agent's credential for this run."""
        return self._run_token

    @property
    def deadline(self) -> datetime:
        """When the run times out: an aware datetime (UTC)."""
        return self._deadline

    def __repr__(self) -> str:
        return f"AsyncRun(run_id={self._run_id!r}, deadline={self._deadline.isoformat()!r})"

    def agent(self) -> AsyncAgent:
        """An AsyncAgent for this run on the harness's ``agent_url``, sharing its HTTP client.
        ValueError if the harness has no ``agent_url``."""
        harness = self._harness
        if harness.agent_url is None:
            raise ValueError(
                "the AsyncHarness has no agent_url: pass agent_url= to AsyncHarness() to use AsyncRun.agent()"
            )
        return AsyncAgent(
            harness.agent_url, self._run_token, timeout=harness._timeout, http_client=harness._client
        )

    async def end(self) -> Facts:
        """End the run (``ENDED``) and return its facts. Ending an ended run returns them again."""
        return parse_facts(*await self._harness._send(_wire.run_call("POST", self._run_id, "end")))

    async def cancel(self) -> dict[str, Any]:
        """Cancel the run (``CANCELLED``; calls in flight are aborted); returns the run view."""
        body, status = await self._harness._send(_wire.run_call("POST", self._run_id, "cancel"))
        return as_object(body, "a run", status)

    async def facts(self) -> Facts:
        """The run's facts so far: its READY calls in completion order."""
        return parse_facts(*await self._harness._send(_wire.run_call("GET", self._run_id, "facts")))

    async def state(self) -> dict[str, Any]:
        """The run view (see ``Run.state``)."""
        body, status = await self._harness._send(_wire.run_call("GET", self._run_id))
        return as_object(body, "a run", status)

    async def invocation(self, tool_call_id: str) -> dict[str, Any]:
        """The whole canonical record of one call plus ``ttl_ms``; ``NOT_FOUND`` if absent."""
        body, status = await self._harness._send(_wire.invocation(self._run_id, tool_call_id))
        return as_object(body, "a record", status)

    async def evidence(self) -> dict[str, Any]:
        """The run's signed evidence bundle, as a dict."""
        body, status = await self._harness._send(_wire.run_call("GET", self._run_id, "evidence"))
        return as_object(body, "an evidence bundle", status)


class AsyncAgent:
    """The async ``Agent``: lists and calls tools with the run token (see ``Agent``).

    An ``httpx.AsyncClient`` belongs to the event loop it first connects in: use an AsyncAgent
    within one loop.
    """

    def __init__(
        self,
        agent_url: str,
        run_token: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._run_id = _wire.run_id_of(run_token)
        self._agent_url = _wire.base_url(agent_url)
        self._run_token = run_token
        self._timeout = timeout
        self._owns_client = http_client is None
        self._client = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout)

    @property
    def run_id(self) -> str:
        """The run the token is bound to."""
        return self._run_id

    @property
    def agent_url(self) -> str:
        """The agent listener's base URL."""
        return self._agent_url

    def __repr__(self) -> str:
        return f"AsyncAgent(agent_url={self._agent_url!r}, run_id={self._run_id!r})"

    async def tools(self) -> list[dict[str, Any]]:
        """The tools this run may call: ``[{"name", "description", "input_schema"}]``."""
        return parse_tools(
            *await _send(self._client, self._agent_url, _wire.TOOLS, self._run_token, self._timeout)
        )

    async def invoke(self, tool: str, input: dict[str, Any], *, tool_call_id: str) -> ToolResult:
        """Call ``tool`` with ``input`` under the framework's ``tool_call_id`` (see
        ``Agent.invoke``)."""
        call = _wire.invoke(self._run_id, tool, input, tool_call_id)
        body, status = await _send(
            self._client, self._agent_url, call, self._run_token, self._timeout, tool_call_id
        )
        return parse_tool_result(body, status, tool_call_id)

    async def aclose(self) -> None:
        """Close the HTTP client if the agent created it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncAgent:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
