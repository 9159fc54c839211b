#!/usr/bin/env bash
# Holds the running sidecar to its API description: `toolgate serve` (memory store) with a few
# tools on the fake tool (examples/fake_tool.rs), all on free loopback ports; then
# scripts/schemathesis_check.py checks the document that GET /openapi.json serves (it must be
# docs/openapi.yaml, a valid OpenAPI 3.1 document whose response examples fit their schemas),
# creates the run `run-42` that the document's examples name, and runs schemathesis against the
# agent listener (with run-42's token) and the admin listener (with the admin token).
#
#   TOOLGATE_BIN=target/debug/toolgate scripts/schemathesis-check.sh
#
# TOOLGATE_BIN (default target/debug/toolgate) must exist and be built from this docs/openapi.yaml
# (it is compiled in); the fake tool is built with cargo unless FAKE_TOOL_BIN names it.
# SCHEMATHESIS_MAX_EXAMPLES (default 100) and SCHEMATHESIS_SEED (default 20261129) tune the run.
# KEEP_WORK=1 keeps the temporary directory (config, logs, schemathesis reports). Exit status:
# 0 when every check passed, 1 otherwise.
# shellcheck disable=SC2317  # cleanup runs from the EXIT trap
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TOOLGATE_BIN=${TOOLGATE_BIN:-target/debug/toolgate}
READY_SECONDS=${READY_SECONDS:-30}

log() { echo "schemathesis-check: $*" >&2; }
die() {
    log "$*"
    exit 1
}
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

[[ -x $TOOLGATE_BIN ]] || die "no toolgate binary at $TOOLGATE_BIN: run 'cargo build --bin toolgate' or set TOOLGATE_BIN"
use_venv

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-schemathesis.XXXXXX")
FAKE_TOOL_PID=""
TOOLGATE_PID=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$TOOLGATE_PID" toolgate
    stop_pid "$FAKE_TOOL_PID" "fake tool"
    if ((rc != 0)) && [[ -f $WORK/toolgate.log ]]; then
        log "last lines of the toolgate log:"
        tail -n 20 "$WORK/toolgate.log" >&2 || true
    fi
    if [[ ${KEEP_WORK:-} == 1 ]]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r TOOLS_PORT AGENT_PORT ADMIN_PORT TELEMETRY_PORT < <(free_ports 4)
TOOLS=http://127.0.0.1:$TOOLS_PORT

# One tool per outcome the document's examples name (see the examples of POST /v1/invoke);
# run-42 may call all of them but `hidden`.
cat >"$WORK/toolgate.yaml" <<EOF
listen: {agent: "127.0.0.1:$AGENT_PORT", admin: "127.0.0.1:$ADMIN_PORT", telemetry: "127.0.0.1:$TELEMETRY_PORT"}
store: {kind: memory, record_ttl_ms: 3600000}
limits: {request_bytes: 65536, raw_bytes: 1048576, agent_bytes: 16384, record_bytes: 1179648}
runs: {default_timeout_ms: 600000, max_timeout_ms: 3600000, default_max_calls: 100, default_max_record_bytes: 8388608}
paths: {workspace: /workspace, home: /home/agent}
tools:
  - name: search
    upstream: $TOOLS/search
    read_only: true
    timeout_ms: 2000
    description: Searches the fake index.
    input_schema: {type: object, required: [q], properties: {q: {type: string, maxLength: 512}}}
    projection: {select: /results, max_items: 5, fields: [title, url]}
  - name: lookup
    upstream: $TOOLS/object
    read_only: true
    timeout_ms: 2000
    projection: {select: /results, fields: [title, url]}
  - name: nothing
    upstream: $TOOLS/empty
    read_only: true
    timeout_ms: 2000
    projection: {select: /results}
  - name: capped
    upstream: $TOOLS/search
    read_only: true
    timeout_ms: 2000
    projection: {select: /results, max_items: 0}
  - name: fail
    upstream: $TOOLS/fail
    read_only: true
    timeout_ms: 2000
  - name: notjson
    upstream: $TOOLS/notjson
    read_only: true
    timeout_ms: 2000
  - name: unresolved
    upstream: $TOOLS/unresolved
    read_only: true
    timeout_ms: 2000
    projection: {select: /results}
  - name: big
    upstream: $TOOLS/big
    read_only: true
    timeout_ms: 2000
  - name: slow
    upstream: $TOOLS/slow
    read_only: true
    timeout_ms: 300
    projection: {select: /results}
  - name: files
    upstream: $TOOLS/echo
    read_only: true
    timeout_ms: 2000
    params: {/path: path}
    projection: {select: /results/input}
  - name: fetch
    upstream: $TOOLS/echo
    read_only: true
    timeout_ms: 2000
    params: {/url: network_target}
    projection: {select: /results/input}
  - name: writer
    upstream: $TOOLS/echo
    timeout_ms: 2000
  - name: tiny
    upstream: $TOOLS/search
    read_only: true
    timeout_ms: 2000
    limits: {request_bytes: 128}
  - name: hidden
    upstream: $TOOLS/search
    read_only: true
    timeout_ms: 2000
EOF
"$TOOLGATE_BIN" check --config "$WORK/toolgate.yaml" >/dev/null || die "the generated config does not validate"

start_fake_tool "$TOOLS_PORT" "$WORK/tools.log"

TOOLGATE_ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
export TOOLGATE_ADMIN_TOKEN
TOOLGATE_LOG=warn "$TOOLGATE_BIN" serve --config "$WORK/toolgate.yaml" >"$WORK/toolgate.log" 2>&1 &
TOOLGATE_PID=$!
python3 scripts/wait.py http "http://127.0.0.1:$TELEMETRY_PORT/readyz" --pid "$TOOLGATE_PID" --timeout "$READY_SECONDS" ||
    die "toolgate was not ready within ${READY_SECONDS}s"
log "toolgate is ready: agent :$AGENT_PORT, admin :$ADMIN_PORT, tools :$TOOLS_PORT"

"$PY" scripts/schemathesis_check.py \
    --agent "http://127.0.0.1:$AGENT_PORT" \
    --admin "http://127.0.0.1:$ADMIN_PORT" \
    --document docs/openapi.yaml \
    --report-dir "$WORK/reports" \
    --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-100}" \
    --seed "${SCHEMATHESIS_SEED:-20261129}"
