"""The SDK tests' sidecar: a real `toolgate serve` on the memory store (and, for the Redis module,
on a six-node Redis Cluster), with the integration tests' fake tool behind it, all on free
loopback ports.

The binaries come from the debug build (`cargo build --bin toolgate --example fake_tool
--example redis_cluster` at the repository root); TOOLGATE_BIN, FAKE_TOOL_BIN and
REDIS_CLUSTER_BIN name others. A missing binary fails the session with the command that builds
it: nothing here is ever skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
ADMIN_TOKEN = "sdk-test-admin-token"
READY_SECONDS = 60.0

# The tools every SDK test may use. The fake tool's routes: /scenario/search answers search
# results, /scenario/fail HTTP 500, /scenario/slow after 3 s, /scenario/big about 2 MiB, /echo
# what it was sent.
TOOLS_YAML = """
tools:
  - name: search
    description: Search the sample index.
    upstream: {tool}/scenario/search
    read_only: true
    timeout_ms: 5000
    input_schema: {{type: object, required: [q], properties: {{q: {{type: string, maxLength: 512}}}}}}
    projection: {{select: /results, max_items: 5, fields: [title, url, snippet]}}
  - name: echo
    description: Echo the input.
    upstream: {tool}/echo
    read_only: true
    projection: {{select: /results/input}}
  - name: fail
    description: Always fails upstream.
    upstream: {tool}/scenario/fail
    read_only: true
  - name: slow
    description: Answers after its timeout.
    upstream: {tool}/scenario/slow
    read_only: true
    timeout_ms: 500
  - name: big
    description: Answers more than raw_bytes.
    upstream: {tool}/scenario/big
    read_only: true
  - name: read_file
    description: Read a file of the workspace.
    upstream: {tool}/echo
    read_only: true
    input_schema: {{type: object, required: [path], properties: {{path: {{type: string}}}}}}
    projection: {{select: /results/input}}
    params: {{/path: path}}
  - name: write_note
    description: Writes, so toolgate refuses it.
    upstream: {tool}/echo
    read_only: false
"""


@dataclass(frozen=True)
class Sidecar:
    """A running toolgate: its three listeners' base URLs and its admin token."""

    agent_url: str
    admin_url: str
    telemetry_url: str
    admin_token: str
    store: str


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def binary(env: str, default: str, build: str) -> Path:
    path = Path(os.environ.get(env) or ROOT / default)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `{build}` at the repository root, or set {env}", pytrace=False)
    return path


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def first_line(proc: subprocess.Popen[bytes], what: str, timeout: float = READY_SECONDS) -> str:
    """The first stdout line of a helper process that prints its address once it serves."""
    stdout: IO[bytes] | None = proc.stdout
    assert stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stdout.readline()
        if line:
            return line.decode().strip()
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it served", pytrace=False)
    pytest.fail(f"{what} printed nothing within {timeout}s", pytrace=False)


def start_sidecar(
    workdir: Path, store_yaml: str, tool_url: str, store: str
) -> tuple[subprocess.Popen[bytes], Sidecar]:
    toolgate = binary("TOOLGATE_BIN", "target/debug/toolgate", "cargo build --bin toolgate")
    agent, admin, telemetry = free_ports(3)
    config = workdir / f"toolgate-{store}.yaml"
    config.write_text(
        f'listen: {{agent: "127.0.0.1:{agent}", admin: "127.0.0.1:{admin}", '
        f'telemetry: "127.0.0.1:{telemetry}"}}\n'
        + store_yaml
        + "limits: {request_bytes: 65536, raw_bytes: 1048576, agent_bytes: 16384, record_bytes: 1179648}\n"
        + "runs: {default_timeout_ms: 600000, max_timeout_ms: 3600000, default_max_calls: 100}\n"
        + TOOLS_YAML.format(tool=tool_url)
    )
    log_path = workdir / f"toolgate-{store}.log"
    env = dict(os.environ, TOOLGATE_ADMIN_TOKEN=ADMIN_TOKEN, TOOLGATE_LOG="warn")
    # The child keeps its own descriptor of the log: this one closes at once.
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(toolgate), "serve", "--config", str(config)], stdout=log, stderr=log, env=env
        )
    sidecar = Sidecar(
        agent_url=f"http://127.0.0.1:{agent}",
        admin_url=f"http://127.0.0.1:{admin}",
        telemetry_url=f"http://127.0.0.1:{telemetry}",
        admin_token=ADMIN_TOKEN,
        store=store,
    )
    deadline = time.monotonic() + READY_SECONDS
    while True:
        if proc.poll() is not None:
            pytest.fail(f"toolgate exited with {proc.returncode}; see {log_path}", pytrace=False)
        try:
            if httpx.get(f"{sidecar.telemetry_url}/readyz", timeout=2.0).status_code == 200:
                return proc, sidecar
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"toolgate not ready within {READY_SECONDS}s; see {log_path}", pytrace=False)
        time.sleep(0.05)


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="toolgate-sdk-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def fake_tool(workdir: Path) -> Iterator[str]:
    """The fake tool's base URL."""
    exe = binary("FAKE_TOOL_BIN", "target/debug/examples/fake_tool", "cargo build --example fake_tool")
    proc = subprocess.Popen([str(exe), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE)
    try:
        yield first_line(proc, "fake_tool")
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def sidecar(workdir: Path, fake_tool: str) -> Iterator[Sidecar]:
    """toolgate on the memory store."""
    store = "store: {kind: memory, key_prefix: toolgate, record_ttl_ms: 3600000}\n"
    proc, side = start_sidecar(workdir, store, fake_tool, "memory")
    try:
        yield side
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def redis_sidecar(workdir: Path, fake_tool: str) -> Iterator[Sidecar]:
    """toolgate on a six-node Redis Cluster (examples/redis_cluster)."""
    exe = binary(
        "REDIS_CLUSTER_BIN", "target/debug/examples/redis_cluster", "cargo build --example redis_cluster"
    )
    # Its stdin is a pipe: when this process dies, end of file takes the cluster down too.
    cluster = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        nodes = first_line(cluster, "redis_cluster", timeout=120).split()
        store = (
            "store:\n  kind: redis-cluster\n  nodes: ["
            + ", ".join(nodes)
            + "]\n  key_prefix: toolgate\n  record_ttl_ms: 3600000\n"
        )
        proc, side = start_sidecar(workdir, store, fake_tool, "redis")
        try:
            yield side
        finally:
            stop(proc)
    finally:
        stop(cluster)


def new_id(prefix: str = "t") -> str:
    """A fresh safe id (run ids and tool call ids alike)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def run_id() -> str:
    """A run id no other test uses."""
    return new_id("run")
