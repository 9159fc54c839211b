"""The README's examples, run exactly as pasted, against `toolgate demo`.

Every ```python block that follows an `<!-- example: NAME -->` comment in clients/python/README.md
is a complete script for the demo sidecar (agent 127.0.0.1:15001, admin 127.0.0.1:15002, admin
token `demo-admin-token`). Each one runs twice in a subprocess of this interpreter (a second paste
must work too: every run gets a fresh id), and must exit 0 and print what the README promises:
the model's own tool call ids on what the model read back, on the facts and on the record.

The demo listens on fixed ports (15001, 15002, 15090): they must be free. The binary is
TOOLGATE_BIN, else the debug build (`cargo build --bin toolgate` at the repository root).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, binary, stop

README = Path(__file__).resolve().parents[1] / "README.md"
# The repository's own README opens with the core example (its quick start).
READMES = [README, ROOT / "README.md"]
ADMIN_URL = "http://127.0.0.1:15002"
# The demo's listeners: agent, admin, telemetry (the last on every interface).
DEMO_PORTS = [("127.0.0.1", 15001), ("127.0.0.1", 15002), ("0.0.0.0", 15090)]
READY_SECONDS = 60.0
RUN_SECONDS = 120.0

# A marked block: the comment, then a ```python fence right after it.
EXAMPLE = re.compile(r"^<!-- example: ([a-z0-9-]+) -->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# What each example must print: its ids, where the README says they show. The model's ids reach
# the model's tool results, the run's facts and the record the harness reads.
EXPECTED: dict[str, list[str]] = {
    "quickstart": [
        "['search']",
        "READY EVIDENCE_FOUND {'items': [{'title': 'redis result 1'",
        "['call_quickstart_1']",
    ],
    "core": [
        "READY EVIDENCE_FOUND 5",
        "refused: DUPLICATE_TOOL_CALL 409 call_1",
        "facts: [('call_1', 'search')] excluded: 0",
        "record: call_1 READY {'q': 'redis'}",
    ],
    "langgraph": [
        'call_lg_search success: {"items":[{"title":"redis result 1"',
        "call_lg_log error: RESULT_TOO_LARGE: ",
        "answer: Redis it is.",
        "facts: [('call_lg_search', 'search')] excluded: 1",
        "record: call_lg_search READY {'q': 'redis'}",
    ],
    "openai-agents": [
        'call_oa_search: {"items":[{"title":"redis result 1"',
        "call_oa_log: RESULT_TOO_LARGE: ",
        "answer: Redis it is.",
        "facts: [('call_oa_search', 'search')] excluded: 1",
        "record: call_oa_search READY {'q': 'redis'}",
    ],
    "pydantic-ai": [
        "call_pa_search success: {'items': [{'title': 'redis result 1'",
        "call_pa_log failed: RESULT_TOO_LARGE: ",
        "answer: Redis it is.",
        "facts: [('call_pa_search', 'search')] excluded: 1",
        "record: call_pa_search READY {'q': 'redis'}",
    ],
    "mcp": [
        'call_mcp_search: {"items":[{"title":"redis result 1"',
        "call_mcp_log: RESULT_TOO_LARGE: ",
        "facts: [('call_mcp_search', 'search')] excluded: 1",
        "record: call_mcp_search READY {'q': 'redis'}",
    ],
}

# The ids each example's model (or, for the core and MCP, its caller) gives its calls.
IDS: dict[str, list[str]] = {
    "quickstart": ["call_quickstart_1"],
    "core": ["call_1"],
    "langgraph": ["call_lg_search", "call_lg_log"],
    "openai-agents": ["call_oa_search", "call_oa_log"],
    "pydantic-ai": ["call_pa_search", "call_pa_log"],
    "mcp": ["call_mcp_search", "call_mcp_log"],
}


def examples() -> dict[str, str]:
    """The READMEs' marked examples by name, each exactly as a reader would copy it."""
    found: dict[str, str] = {}
    for readme in READMES:
        for m in EXAMPLE.finditer(readme.read_text(encoding="utf-8")):
            name, code = m.group(1), m.group(2)
            assert name not in found, f"two README examples are marked {name!r}"
            found[name] = code
    return found


def taken(host: str, port: int) -> bool:
    """Whether a listener holds the port. SO_REUSEADDR, as toolgate binds: the connections that
    the last run left in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`toolgate demo` on its fixed ports, with the README's admin token."""
    busy = [f"{host}:{port}" for host, port in DEMO_PORTS if taken(host, port)]
    if busy:
        pytest.fail(
            f"toolgate demo needs {', '.join(busy)}, which something else listens on "
            "(another `toolgate demo`?): stop it and run the tests again",
            pytrace=False,
        )
    toolgate = binary("TOOLGATE_BIN", "target/debug/toolgate", "cargo build --bin toolgate")
    log_path = tmp_path_factory.mktemp("demo") / "toolgate-demo.log"
    env = dict(os.environ, TOOLGATE_ADMIN_TOKEN="demo-admin-token", TOOLGATE_LOG="warn")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(toolgate), "demo"], stdout=log, stderr=log, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"toolgate demo exited with {proc.returncode}:\n{log_path.read_text()}", pytrace=False
                )
            try:
                httpx.get(ADMIN_URL, timeout=2.0)  # any answer: the admin listener serves
                break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"toolgate demo did not answer on {ADMIN_URL} within {READY_SECONDS}s", pytrace=False
                )
            time.sleep(0.1)
        yield
    finally:
        stop(proc)


def test_every_example_is_in_the_readme() -> None:
    found = examples()
    missing = sorted(set(EXPECTED) - set(found))
    assert not missing, f"README.md has no `<!-- example: NAME -->` block for {missing}"
    assert sorted(found) == sorted(EXPECTED), f"a README example this test does not check: {sorted(found)}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_as_pasted(demo: None, name: str, tmp_path: Path) -> None:
    code = examples().get(name)
    if code is None:
        pytest.fail(f"README.md has no `<!-- example: {name} -->` block", pytrace=False)
    for tool_call_id in IDS[name]:
        assert f'"{tool_call_id}"' in code, f"the {name} example does not make the call {tool_call_id}"
    # Its own directory, under a name no import can mistake for a package (`langgraph.py` would).
    script = tmp_path / f"readme_example_{name.replace('-', '_')}.py"
    script.write_text(code, encoding="utf-8")
    # No tracing or telemetry export, whatever the calling environment says: nothing leaves the host.
    env = dict(os.environ, LANGCHAIN_TRACING_V2="false", LANGSMITH_TRACING="false", OTEL_SDK_DISABLED="true")
    for paste in (1, 2):  # pasted twice: the second run gets a new run id and works the same
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_SECONDS,
        )
        assert done.returncode == 0, f"paste {paste} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        for line in EXPECTED[name]:
            assert line in done.stdout, f"paste {paste} did not print {line!r}:\n{done.stdout}\n{done.stderr}"
        for tool_call_id in IDS[name]:
            assert tool_call_id in done.stdout


def test_examples_pass_ruff(tmp_path: Path) -> None:
    # As a reader's project would lint them: toolgate is a third-party package there.
    files = []
    for name, code in examples().items():
        path = tmp_path / f"readme_example_{name.replace('-', '_')}.py"
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    common = ["--isolated", "--line-length", "110", "--target-version", "py310"]
    ruff = [sys.executable, "-m", "ruff"]
    for args in (["check", "--select", "E,W,F,B,UP,I"], ["format", "--check", "--diff"]):
        # From the examples' directory: ruff takes a `src/toolgate` below the working directory
        # for first-party code, which a reader's project does not have.
        done = subprocess.run([*ruff, *args, *common, *files], cwd=tmp_path, capture_output=True, text=True)
        if "No module named ruff" in done.stderr:
            pytest.fail("ruff is not installed: pip install ruff (the dev dependency group)", pytrace=False)
        assert done.returncode == 0, f"ruff {args[0]} on the README examples:\n{done.stdout}\n{done.stderr}"
