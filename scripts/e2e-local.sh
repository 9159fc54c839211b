#!/usr/bin/env bash
# End-to-end scenario on this machine, no Kubernetes: a six-node Redis Cluster
# (examples/redis_cluster.rs), the fake tool's scenario routes (examples/fake_tool.rs) and
# `toolgate serve` with deploy/scenario/toolgate-redis.yaml, all on free loopback ports; then
# deploy/scenario/scenario.py drives a run through the sidecar. Then two edits of the config file
# must be counted by the file watch (one accepted, one refused as restart-only), and toolgate must
# exit 0 on SIGTERM (clean drain).
#
#   TOOLGATE_BIN=target/debug/toolgate scripts/e2e-local.sh
#
# TOOLGATE_BIN (default target/debug/toolgate) must exist; the two examples are built with cargo
# unless FAKE_TOOL_BIN / REDIS_CLUSTER_BIN name them. E2E_STORE=memory runs the same scenario on
# the memory store (deploy/scenario/toolgate-local.yaml, no Redis). KEEP_WORK=1 keeps the
# temporary directory (config, logs). Exit status: the scenario's, or 1 when the setup, the reload
# check or the shutdown fails.
# shellcheck disable=SC2317  # cleanup runs from the EXIT trap
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TOOLGATE_BIN=${TOOLGATE_BIN:-target/debug/toolgate}
READY_SECONDS=${READY_SECONDS:-30}
case ${E2E_STORE:=redis} in
redis) CONFIG=deploy/scenario/toolgate-redis.yaml ;;
memory) CONFIG=deploy/scenario/toolgate-local.yaml ;;
*)
    echo "e2e-local: E2E_STORE must be redis or memory" >&2
    exit 64
    ;;
esac

log() { echo "e2e-local: $*" >&2; }
die() {
    log "$*"
    exit 1
}
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

[[ -x $TOOLGATE_BIN ]] || die "no toolgate binary at $TOOLGATE_BIN: run 'cargo build --bin toolgate' or set TOOLGATE_BIN"
command -v python3 >/dev/null || die "python3 is required"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-e2e.XXXXXX")
FAKE_TOOL_PID=""
TOOLGATE_PID=""
REDIS_CLUSTER_PID=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$TOOLGATE_PID" toolgate
    stop_pid "$FAKE_TOOL_PID" "fake tool"
    stop_pid "$REDIS_CLUSTER_PID" "Redis Cluster"
    if ((rc != 0)) && [[ -f $WORK/toolgate.log ]]; then
        log "last lines of the toolgate log:"
        tail -n 40 "$WORK/toolgate.log" >&2 || true
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

# The scenario config with its addresses moved to those ports (and the cluster's nodes).
sed_args=(
    -e "s/127\.0\.0\.1:15001\b/127.0.0.1:$AGENT_PORT/g"
    -e "s/127\.0\.0\.1:15002\b/127.0.0.1:$ADMIN_PORT/g"
    -e "s/127\.0\.0\.1:15090\b/127.0.0.1:$TELEMETRY_PORT/g"
    -e "s/127\.0\.0\.1:18080\b/127.0.0.1:$TOOLS_PORT/g"
)
if [[ $E2E_STORE == redis ]]; then
    start_redis_cluster "$WORK/redis-cluster.log"
    ((${#REDIS_URLS[@]} == 6)) || die "expected six Redis nodes, got: ${REDIS_URLS[*]}"
    for i in 0 1 2 3 4 5; do
        sed_args+=(-e "s|redis://127\.0\.0\.1:710$i\b|${REDIS_URLS[$i]}|g")
    done
    log "Redis Cluster: ${REDIS_URLS[*]}"
fi
log "store $E2E_STORE ($CONFIG), tools :$TOOLS_PORT, agent :$AGENT_PORT, admin :$ADMIN_PORT, telemetry :$TELEMETRY_PORT"
grep -v '^ *#' "$CONFIG" | sed "${sed_args[@]}" >"$WORK/toolgate.yaml"
if grep -qE '127\.0\.0\.1:(15001|15002|15090|18080|710[0-5])\b' "$WORK/toolgate.yaml"; then
    die "$CONFIG has an address this script does not rewrite"
fi

start_fake_tool "$TOOLS_PORT" "$WORK/tools.log"

TOOLGATE_ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
export TOOLGATE_ADMIN_TOKEN
"$TOOLGATE_BIN" serve --config "$WORK/toolgate.yaml" >"$WORK/toolgate.log" 2>&1 &
TOOLGATE_PID=$!
python3 scripts/wait.py http "http://127.0.0.1:$TELEMETRY_PORT/readyz" --pid "$TOOLGATE_PID" --timeout "$READY_SECONDS" ||
    die "toolgate was not ready within ${READY_SECONDS}s"
log "toolgate is ready (pid $TOOLGATE_PID)"

status=0
python3 deploy/scenario/scenario.py \
    --agent "http://127.0.0.1:$AGENT_PORT" \
    --admin "http://127.0.0.1:$ADMIN_PORT" \
    --telemetry "http://127.0.0.1:$TELEMETRY_PORT" || status=$?

# The config file is watched: an allowed change is counted result="ok", a change that needs a
# restart (a listener address) result="error" and ignored.
metrics="http://127.0.0.1:$TELEMETRY_PORT/metrics"
if ((status == 0)); then
    sed -i 's/default_max_calls: 100/default_max_calls: 101/' "$WORK/toolgate.yaml"
    if python3 scripts/wait.py metric "$metrics" 'toolgate_config_reloads_total{result="ok"}'; then
        echo "ok   config reload: an allowed change is applied"
    else
        echo "FAIL config reload: an allowed change was not counted result=\"ok\""
        status=1
    fi
    sed -i "s/127\.0\.0\.1:$AGENT_PORT/127.0.0.1:$((AGENT_PORT + 1))/" "$WORK/toolgate.yaml"
    if python3 scripts/wait.py metric "$metrics" 'toolgate_config_reloads_total{result="error"}'; then
        echo "ok   config reload: a restart-only change is refused"
    else
        echo "FAIL config reload: a restart-only change was not counted result=\"error\""
        status=1
    fi
fi

# SIGTERM must drain and exit 0.
kill -TERM "$TOOLGATE_PID"
end=$((SECONDS + 20))
while kill -0 "$TOOLGATE_PID" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$TOOLGATE_PID/stat" 2>/dev/null) != Z ]] && ((SECONDS < end)); do
    sleep 0.1
done
toolgate_rc=0
if kill -0 "$TOOLGATE_PID" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$TOOLGATE_PID/stat" 2>/dev/null) != Z ]]; then
    log "toolgate did not exit within 20s of SIGTERM"
    toolgate_rc=1
else
    wait "$TOOLGATE_PID" || toolgate_rc=$?
    TOOLGATE_PID=""
fi
if ((toolgate_rc != 0)); then
    log "toolgate did not shut down cleanly after SIGTERM (exit $toolgate_rc)"
    ((status != 0)) || status=1
else
    log "toolgate drained and exited 0 on SIGTERM"
fi

if ((status == 0)); then
    log "passed"
else
    log "failed (exit $status)"
fi
exit "$status"
