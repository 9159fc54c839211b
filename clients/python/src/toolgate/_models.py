"""The typed answers (ToolResult, Fact, Facts) and the parsing of toolgate's JSON into them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ._errors import UNEXPECTED_RESPONSE, ToolgateError


@dataclass(frozen=True)
class ToolResult:
    """A tool call that succeeded: toolgate's ``READY`` answer.

    ``result`` is the bounded projection of the tool's response (any JSON value), never the raw
    response; ``evidence_status`` is ``EVIDENCE_FOUND`` or ``NO_EVIDENCE`` (a negative
    observation, not an error).
    """

    status: str
    tool_call_id: str
    evidence_status: str
    result: Any


@dataclass(frozen=True)
class Fact:
    """One READY call of a run, as the run's facts list it."""

    tool_call_id: str
    tool: str
    evidence_status: str
    result: Any


@dataclass(frozen=True)
class Facts:
    """A run's progress: its READY calls in completion order.

    ``excluded`` counts the run's finalized calls that are not facts (errors, expired or foreign
    records, records failing their seal); ``tampered`` is how many of those failed the seal (0
    from a server that does not report it).
    """

    run_id: str
    facts: list[Fact]
    excluded: int
    tampered: int = 0


@dataclass(frozen=True)
class CreatedRun:
    """The answer to creating a run."""

    run_id: str
    run_token: str
    deadline: datetime


def unexpected(what: str, http_status: int | None, tool_call_id: str | None = None) -> ToolgateError:
    """The error for an answer that is not the shape toolgate sends."""
    return ToolgateError(
        UNEXPECTED_RESPONSE,
        f"toolgate's answer is not {what}.",
        http_status=http_status,
        tool_call_id=tool_call_id,
    )


def _field(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str, status: int) -> Any:
    value = body.get(key)
    # bool is an int in Python; a count must not be True.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise unexpected(what, status)
    return value


def as_object(body: Any, what: str, status: int) -> dict[str, Any]:
    """``body`` if it is a JSON object, else UNEXPECTED_RESPONSE."""
    if not isinstance(body, dict):
        raise unexpected(what, status)
    return body


def parse_tool_result(body: Any, status: int, tool_call_id: str | None) -> ToolResult:
    """A tool call's 2xx answer."""
    what = "a tool result"
    if not isinstance(body, dict) or body.get("status") != "READY" or "result" not in body:
        raise unexpected(what, status, tool_call_id)
    call_id = body.get("tool_call_id")
    evidence = body.get("evidence_status")
    if not isinstance(call_id, str) or not isinstance(evidence, str):
        raise unexpected(what, status, tool_call_id)
    return ToolResult(status="READY", tool_call_id=call_id, evidence_status=evidence, result=body["result"])


def parse_facts(body: Any, status: int) -> Facts:
    """The answer of ``GET …/facts`` and ``POST …/end``."""
    what = "a run's facts"
    obj = as_object(body, what, status)
    items = _field(obj, "facts", list, what, status)
    facts = []
    for item in items:
        fact = as_object(item, what, status)
        if "result" not in fact:
            raise unexpected(what, status)
        facts.append(
            Fact(
                tool_call_id=_field(fact, "tool_call_id", str, what, status),
                tool=_field(fact, "tool", str, what, status),
                evidence_status=_field(fact, "evidence_status", str, what, status),
                result=fact["result"],
            )
        )
    tampered = obj.get("tampered", 0)
    if not isinstance(tampered, int) or isinstance(tampered, bool):
        raise unexpected(what, status)
    return Facts(
        run_id=_field(obj, "run_id", str, what, status),
        facts=facts,
        excluded=_field(obj, "excluded", int, what, status),
        tampered=tampered,
    )


def parse_created(body: Any, status: int) -> CreatedRun:
    """The answer of ``POST /v1/runs``."""
    what = "a created run"
    obj = as_object(body, what, status)
    deadline = parse_time(_field(obj, "deadline", str, what, status))
    if deadline is None:
        raise unexpected(what, status)
    return CreatedRun(
        run_id=_field(obj, "run_id", str, what, status),
        run_token=_field(obj, "run_token", str, what, status),
        deadline=deadline,
    )


def run_deadline(body: Any, status: int) -> datetime:
    """The deadline of a run view (``GET /v1/runs/{run_id}``)."""
    deadline = as_object(body, "a run", status).get("deadline")
    parsed = parse_time(deadline) if isinstance(deadline, str) else None
    if parsed is None:
        raise unexpected("a run", status)
    return parsed


def parse_tools(body: Any, status: int) -> list[dict[str, Any]]:
    """The answer of ``GET /v1/tools``: its ``tools`` list."""
    what = "a tool list"
    tools: list[dict[str, Any]] = []
    for item in _field(as_object(body, what, status), "tools", list, what, status):
        tool = as_object(item, what, status)
        if not isinstance(tool.get("name"), str):
            raise unexpected(what, status)
        tools.append(tool)
    return tools


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as an aware datetime, or None if it is not one.

    Written out because ``datetime.fromisoformat`` on Python 3.10 takes neither ``Z`` nor a
    fraction of other than 3 or 6 digits.
    """
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micros = int((m.group(7) or "0")[:6].ljust(6, "0"))
    if m.group(8):
        tz = timezone.utc
    else:
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(-offset if m.group(9) == "-" else offset)
    try:
        return datetime(year, month, day, hour, minute, min(second, 59), micros, tzinfo=tz)
    except ValueError:
        return None
