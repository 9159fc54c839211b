"""The sync client on toolgate backed by a Redis Cluster: a run's whole life through the SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Sidecar

from toolgate import Harness, ToolgateError


@pytest.fixture
def harness(redis_sidecar: Sidecar) -> Iterator[Harness]:
    with Harness(
        redis_sidecar.admin_url, admin_token=redis_sidecar.admin_token, agent_url=redis_sidecar.agent_url
    ) as h:
        yield h


def test_a_run_on_redis(harness: Harness, run_id: str) -> None:
    run = harness.create_run(run_id, tools=["search", "echo", "fail"])
    with pytest.raises(ToolgateError) as info:
        harness.create_run(run_id)
    assert info.value.code == "RUN_EXISTS"

    agent = run.agent()
    result = agent.invoke("search", {"q": "redis"}, tool_call_id="call_1")
    assert (result.status, result.tool_call_id) == ("READY", "call_1")
    assert result.result["total_items"] == 7
    with pytest.raises(ToolgateError) as info:
        agent.invoke("search", {"q": "again"}, tool_call_id="call_1")
    assert (info.value.code, info.value.http_status) == ("DUPLICATE_TOOL_CALL", 409)
    with pytest.raises(ToolgateError) as info:
        agent.invoke("fail", {}, tool_call_id="call_2")
    assert info.value.code == "TOOL_EXECUTION_FAILED"
    agent.invoke("echo", {"x": 1}, tool_call_id="functions.echo:3")

    facts = run.facts()
    assert [f.tool_call_id for f in facts.facts] == ["call_1", "functions.echo:3"]
    assert (facts.excluded, facts.tampered) == (1, 0)
    record = run.invocation("call_1")
    assert (record["status"], record["request"]) == ("READY", {"q": "redis"})
    assert record["ttl_ms"] > 0
    assert run.invocation("call_2")["error_code"] == "TOOL_EXECUTION_FAILED"
    assert run.state()["calls_used"] == 3

    assert run.end() == facts
    assert run.state()["state"] == "ENDED"
    with pytest.raises(ToolgateError) as info:
        agent.invoke("echo", {}, tool_call_id="call_3")
    assert info.value.code == "RUN_INACTIVE"
