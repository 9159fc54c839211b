"""toolgate's Python client.

``Harness`` creates and ends runs on toolgate's admin listener; ``Agent`` lists and calls a run's
tools on the agent listener, under the agent framework's own tool call ids. ``AsyncHarness`` and
``AsyncAgent`` are their async twins. Every failure is a ``ToolgateError`` with a stable ``code``.
Framework adapters live in ``toolgate.langchain``, ``toolgate.openai_agents``,
``toolgate.pydantic_ai`` and ``toolgate.mcp`` (each needs its extra).
"""

from ._async_client import AsyncAgent, AsyncHarness, AsyncRun
from ._client import Agent, Harness, Run
from ._errors import ToolgateError
from ._models import Fact, Facts, ToolResult
from ._version import __version__

__all__ = [
    "Agent",
    "AsyncAgent",
    "AsyncHarness",
    "AsyncRun",
    "Fact",
    "Facts",
    "Harness",
    "Run",
    "ToolResult",
    "ToolgateError",
    "__version__",
]
