"""The sync client: Harness (admin listener), Run (one run's handle) and Agent (agent listener)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from ._async_client import AsyncAgent

DEFAULT_TIMEOUT = _wire.DEFAULT_TIMEOUT


def _send(
    client: httpx.Client,
    base: str,
    call: _wire.Call,
    token: str,
    timeout: float | None,
    tool_call_id: str | None = None,
) -> tuple[Any, int]:
    """One request, never retried: its decoded JSON body and HTTP status, or a ToolgateError."""
    try:
        response = client.request(
            call.method, base + call.path, json=call.body, headers=_wire.bearer(token), timeout=timeout
        )
    except httpx.RequestError as exc:
        raise _wire.transport_error(exc, tool_call_id) from exc
    return _wire.decode(response, tool_call_id), response.status_code


class Harness:
    """The owner of runs, talking to toolgate's admin listener with the admin token.

    ``agent_url`` (the agent listener) is only needed for ``Run.agent()``. ``timeout`` bounds every
    request, in seconds (None: no bound). The harness owns the ``httpx.Client`` it creates and
    closes it in ``close()`` (or at the end of a ``with`` block); a client passed as
    ``http_client`` stays the caller's. Requests are never retried.

    Every toolgate error is raised as a ``ToolgateError``.
    """

    def __init__(
        self,
        admin_url: str,
        *,
        admin_token: str,
        agent_url: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        http_client: httpx.Client | None = None,
    ) -> None:
        if not admin_token:
            raise ValueError("admin_token is empty")
        self._admin_url = _wire.base_url(admin_url)
        self._agent_url = _wire.base_url(agent_url) if agent_url is not None else None
        self._admin_token = admin_token
        self._timeout = timeout
        self._owns_client = http_client is None
        self._client = http_client if http_client is not None else httpx.Client(timeout=timeout)

    @property
    def admin_url(self) -> str:
        """The admin listener's base URL."""
        return self._admin_url

    @property
    def agent_url(self) -> str | None:
        """The agent listener's base URL, if one was given."""
        return self._agent_url

    def __repr__(self) -> str:
        return f"Harness(admin_url={self._admin_url!r}, agent_url={self._agent_url!r})"

    def _send(self, call: _wire.Call) -> tuple[Any, int]:
        return _send(self._client, self._admin_url, call, self._admin_token, self._timeout)

    def create_run(
        self,
        run_id: str,
        *,
        tools: list[str] | None = None,
        timeout_ms: int | None = None,
        budget: dict[str, Any] | None = None,
        workspace: str | None = None,
        home: str | None = None,
    ) -> Run:
        """Create a run (``POST /v1/runs``) and return its handle, run token included.

        Arguments left None take the server's configured defaults; ``tools=None`` allows every
        configured tool. ``budget`` is ``{"max_calls", "max_calls_per_tool", "max_record_bytes"}``
        (any subset). A taken id raises ``RUN_EXISTS``; a bad field ``INVALID_INPUT``.
        """
        call = _wire.create_run(
            run_id, tools=tools, timeout_ms=timeout_ms, budget=budget, workspace=workspace, home=home
        )
        created = parse_created(*self._send(call))
        return Run(self, created.run_id, created.run_token, created.deadline)

    @contextmanager
    def run(
        self,
        run_id: str,
        *,
        tools: list[str] | None = None,
        timeout_ms: int | None = None,
        budget: dict[str, Any] | None = None,
        workspace: str | None = None,
        home: str | None = None,
    ) -> Iterator[Run]:
        """Create a run for a ``with`` block: ended when the block exits normally, cancelled when
        it raises (the exception then propagates; a failure to cancel does not replace it).

        Takes the arguments of ``create_run``. The facts stay readable after the block with
        ``run.facts()``.
        """
        run = self.create_run(
            run_id, tools=tools, timeout_ms=timeout_ms, budget=budget, workspace=workspace, home=home
        )
        try:
            yield run
        except BaseException:
            try:
                run.cancel()
            except ToolgateError:
                pass
            raise
        run.end()

    def attach(self, run_id: str, run_token: str) -> Run:
        """A handle on an existing run whose token the caller kept (another process created it).

        Reads the run (``NOT_FOUND`` if it does not exist) for its deadline. Raises ValueError when
        the token is not bound to ``run_id``.
        """
        if _wire.run_id_of(run_token) != run_id:
            raise ValueError("the run token is not bound to this run id")
        body, status = self._send(_wire.run_call("GET", run_id))
        return Run(self, run_id, run_token, run_deadline(body, status))

    def close(self) -> None:
        """Close the HTTP client if the harness created it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Run:
    """One run, as its harness sees it. Made by ``Harness.create_run`` (or ``run``, ``attach``).

    ``run_token`` is the credential the agent calls tools with: hand it to the agent only.
    """

    def __init__(self, harness: Harness, run_id: str, run_token: str, deadline: datetime) -> None:
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
        return f"Run(run_id={self._run_id!r}, deadline={self._deadline.isoformat()!r})"

    def agent(self) -> Agent:
        """An Agent for this run on the harness's ``agent_url``, sharing the harness's HTTP client
        (so it lives as long as the harness). ValueError if the harness has no ``agent_url``."""
        harness = self._harness
        if harness.agent_url is None:
            raise ValueError("the Harness has no agent_url: pass agent_url= to Harness() to use Run.agent()")
        return Agent(
            harness.agent_url, self._run_token, timeout=harness._timeout, http_client=harness._client
        )

    def end(self) -> Facts:
        """End the run (``ENDED``) and return its facts. Ending an ended run returns them again."""
        return parse_facts(*self._harness._send(_wire.run_call("POST", self._run_id, "end")))

    def cancel(self) -> dict[str, Any]:
        """Cancel the run (``CANCELLED``; calls in flight are aborted); returns the run view."""
        body, status = self._harness._send(_wire.run_call("POST", self._run_id, "cancel"))
        return as_object(body, "a run", status)

    def facts(self) -> Facts:
        """The run's facts so far: its READY calls in completion order."""
        return parse_facts(*self._harness._send(_wire.run_call("GET", self._run_id, "facts")))

    def state(self) -> dict[str, Any]:
        """The run view: ``run_id``, ``state`` (``ACTIVE``/``ENDED``/``CANCELLED``), ``deadline``,
        ``calls_used``, ``record_bytes_used``, ``budget``, ``tools``, ``workspace``, ``home``."""
        body, status = self._harness._send(_wire.run_call("GET", self._run_id))
        return as_object(body, "a run", status)

    def invocation(self, tool_call_id: str) -> dict[str, Any]:
        """The whole canonical record of one call, raw response included, plus ``ttl_ms``.
        ``NOT_FOUND`` if the run has no such record."""
        body, status = self._harness._send(_wire.invocation(self._run_id, tool_call_id))
        return as_object(body, "a record", status)

    def evidence(self) -> dict[str, Any]:
        """The run's signed evidence bundle (a JWS in its general JSON serialization), as a dict."""
        body, status = self._harness._send(_wire.run_call("GET", self._run_id, "evidence"))
        return as_object(body, "an evidence bundle", status)


class Agent:
    """A run's agent side: lists and calls tools on toolgate's agent listener with the run token.

    The run id is taken from the token (everything before its last ``.``). ``tool_call_id`` is the
    agent framework's own id of the call, sent unchanged; nothing is ever retried, since a second
    call with the same id is refused as ``DUPLICATE_TOOL_CALL``. The agent owns the
    ``httpx.Client`` it creates (``close()`` or ``with``); one passed as ``http_client`` stays the
    caller's.

    For async code: ``ainvoke``/``atools`` run the sync calls in a worker thread (they work in
    any event loop, and across loops), and ``async_twin()`` makes an ``AsyncAgent`` for the same
    run.
    """

    def __init__(
        self,
        agent_url: str,
        run_token: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._run_id = _wire.run_id_of(run_token)
        self._agent_url = _wire.base_url(agent_url)
        self._run_token = run_token
        self._timeout = timeout
        self._owns_client = http_client is None
        self._client = http_client if http_client is not None else httpx.Client(timeout=timeout)

    @property
    def run_id(self) -> str:
        """The run the token is bound to."""
        return self._run_id

    @property
    def agent_url(self) -> str:
        """The agent listener's base URL."""
        return self._agent_url

    def __repr__(self) -> str:
        return f"Agent(agent_url={self._agent_url!r}, run_id={self._run_id!r})"

    def tools(self) -> list[dict[str, Any]]:
        """The tools this run may call: ``[{"name", "description", "input_schema"}]``."""
        return parse_tools(*_send(self._client, self._agent_url, _wire.TOOLS, self._run_token, self._timeout))

    def invoke(self, tool: str, input: dict[str, Any], *, tool_call_id: str) -> ToolResult:
        """Call ``tool`` with ``input`` under the framework's ``tool_call_id``.

        Returns the READY result; any refusal or failure is raised as a ``ToolgateError``. After a
        ``TRANSPORT_ERROR`` the call may still have run: read it with ``Run.invocation``, do not
        repeat it.
        """
        call = _wire.invoke(self._run_id, tool, input, tool_call_id)
        body, status = _send(
            self._client, self._agent_url, call, self._run_token, self._timeout, tool_call_id
        )
        return parse_tool_result(body, status, tool_call_id)

    async def atools(self) -> list[dict[str, Any]]:
        """``tools()`` from async code, run in a worker thread."""
        import anyio.to_thread  # httpx's own dependency; imported here so sync use never loads it

        return await anyio.to_thread.run_sync(self.tools)

    async def ainvoke(self, tool: str, input: dict[str, Any], *, tool_call_id: str) -> ToolResult:
        """``invoke()`` from async code, run in a worker thread. Cancelling the awaiting task waits
        for the call to finish: a call that reached toolgate is never abandoned half way."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(
            functools.partial(self.invoke, tool, input, tool_call_id=tool_call_id)
        )

    def async_twin(self) -> AsyncAgent:
        """A new ``AsyncAgent`` for the same run, URL and timeout, with its own
        ``httpx.AsyncClient``: the caller closes it (``await twin.aclose()`` or ``async with``)."""
        from ._async_client import AsyncAgent

        return AsyncAgent(self._agent_url, self._run_token, timeout=self._timeout)

    def close(self) -> None:
        """Close the HTTP client if the agent created it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
