"""ToolgateError: the one exception the client raises for anything toolgate (or the wire) refuses."""

from __future__ import annotations

from typing import Any

TRANSPORT_ERROR = "TRANSPORT_ERROR"
"""No answer came back: the connection failed, broke off or timed out (``http_status`` is None)."""

UNEXPECTED_RESPONSE = "UNEXPECTED_RESPONSE"
"""An answer came back that is not toolgate's: not JSON, or not the shape toolgate sends."""


class ToolgateError(Exception):
    """A call that did not succeed.

    ``code`` is the stable error code toolgate answered (``DUPLICATE_TOOL_CALL``, ``NOT_FOUND``,
    ``UNAUTHENTICATED``, …), or one of the two codes the client itself uses:

    - ``TRANSPORT_ERROR``: no answer came back (connection refused, broken off, timed out);
      ``http_status`` is None. A tool call that failed this way may still have run on the
      server: do not repeat it with the same ``tool_call_id`` (it would be
      ``DUPLICATE_TOOL_CALL``); read its record with ``Run.invocation`` instead.
    - ``UNEXPECTED_RESPONSE``: something answered with a body that is not toolgate's (a proxy's
      error page, a 2xx that is not the expected JSON); ``http_status`` is its status.

    ``message`` is toolgate's fixed sentence for the code (or the client's own for the two codes
    above); it never carries tokens, payloads or response bodies. ``tool_call_id`` is the id the
    error answer carried (toolgate echoes a safe one and sends null otherwise); for the client's
    own codes on a tool call it is the id the call was made with. ``str(error)`` is
    ``"CODE: message"``.
    """

    code: str
    http_status: int | None
    message: str
    tool_call_id: str | None

    def __init__(
        self, code: str, message: str, *, http_status: int | None = None, tool_call_id: str | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.http_status = http_status
        self.message = message
        self.tool_call_id = tool_call_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"ToolgateError(code={self.code!r}, http_status={self.http_status!r}, "
            f"message={self.message!r}, tool_call_id={self.tool_call_id!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields do not survive Exception's default pickling (multiprocessing, workers).
        return (_rebuild, (self.code, self.message, self.http_status, self.tool_call_id))


def _rebuild(code: str, message: str, http_status: int | None, tool_call_id: str | None) -> ToolgateError:
    return ToolgateError(code, message, http_status=http_status, tool_call_id=tool_call_id)
