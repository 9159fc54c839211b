#!/usr/bin/env bash
# End-to-end scenario on this machine, no Kubernetes: a six-node Redis Cluster
# (scripts/redis-cluster.sh), the sample tools (deploy/scenario/sample_tools.py) and `toolgate
# serve` with deploy/scenario/toolgate-redis.yaml, all on free loopback ports; then
# deploy/scenario/scenario.py drives a run through the sidecar. Then two edits of the config file
# must be counted by the file watch (one accepted, one refused as restart-only), and toolgate must
# exit 0 on SIGTERM (clean drain).
#
#   TOOLGATE_BIN=target/debug/toolgate scripts/e2e-local.sh
#
# It builds nothing: TOOLGATE_BIN (default target/debug/toolgate) must exist. E2E_STORE=memory
# runs the same scenario on the memory store (deploy/scenario/toolgate-local.yaml, no Redis).
# KEEP_WORK=1 keeps the temporary directory (config, logs). Exit status: the scenario's, or 1 when
# the setup, the reload check or the shutdown fails.
# shellcheck disable=SC2317  # stop_pid and cleanup run from the EXIT trap
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

[[ -x $TOOLGATE_BIN ]] || die "no toolgate binary at $TOOLGATE_BIN: run 'cargo build --bin toolgate' or set TOOLGATE_BIN"
command -v python3 >/dev/null || die "python3 is required"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-e2e.XXXXXX")
TOOLS_PID=""
TOOLGATE_PID=""
REDIS_STARTED=""

stop_pid() {
    local pid=$1 name=$2 end
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    end=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not stop on SIGTERM; killing it"
        kill -9 "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$TOOLGATE_PID" toolgate
    stop_pid "$TOOLS_PID" "sample tools"
    if [[ -n $REDIS_STARTED ]]; then
        scripts/redis-cluster.sh stop "$WORK/redis" >/dev/null 2>&1 || true
    fi
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

# Free loopback ports: a Redis base with six consecutive ports (and their +10000 bus ports), then
# four single ports for the tools and toolgate's three listeners.
read -r REDIS_BASE TOOLS_PORT AGENT_PORT ADMIN_PORT TELEMETRY_PORT < <(python3 - <<'EOF'
import random
import socket

def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

rng = random.SystemRandom()
taken = set()
while True:
    base = rng.randrange(20000, 30000)
    ports = [base + i for i in range(6)] + [base + 10000 + i for i in range(6)]
    if all(free(p) for p in ports):
        taken.update(ports)
        break
singles = []
while len(singles) < 4:
    port = rng.randrange(41000, 49000)
    if port not in taken and free(port):
        taken.add(port)
        singles.append(port)
print(base, *singles)
EOF
)
log "store $E2E_STORE ($CONFIG), redis 127.0.0.1:$REDIS_BASE..$((REDIS_BASE + 5)), tools :$TOOLS_PORT, agent :$AGENT_PORT, admin :$ADMIN_PORT, telemetry :$TELEMETRY_PORT"

# The scenario config with its addresses moved to those ports.
sed_args=(
    -e "s/127\.0\.0\.1:15001\b/127.0.0.1:$AGENT_PORT/g"
    -e "s/127\.0\.0\.1:15002\b/127.0.0.1:$ADMIN_PORT/g"
    -e "s/127\.0\.0\.1:15090\b/127.0.0.1:$TELEMETRY_PORT/g"
    -e "s/127\.0\.0\.1:18080\b/127.0.0.1:$TOOLS_PORT/g"
)
for i in 0 1 2 3 4 5; do
    sed_args+=(-e "s/127\.0\.0\.1:710$i\b/127.0.0.1:$((REDIS_BASE + i))/g")
done
grep -v '^ *#' "$CONFIG" | sed "${sed_args[@]}" >"$WORK/toolgate.yaml"
if grep -qE '127\.0\.0\.1:(15001|15002|15090|18080|710[0-5])\b' "$WORK/toolgate.yaml"; then
    die "$CONFIG has an address this script does not rewrite"
fi

# wait_http URL PID SECONDS: poll URL until it answers 200, failing early if PID has exited.
wait_http() {
    python3 - "$@" <<'EOF'
import sys
import time
import urllib.request

url, pid, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + seconds
last = "no answer"
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "Z"
    if state == "Z":
        sys.exit(f"process {pid} exited while waiting for {url}")
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                sys.exit(0)
            last = str(resp.status)
    except Exception as err:  # noqa: BLE001 - any failure means "not yet"
        last = str(err)
    time.sleep(0.2)
sys.exit(f"{url} did not answer 200 within {seconds:g}s (last: {last})")
EOF
}

# wait_metric URL SAMPLE SECONDS: poll a Prometheus exposition until SAMPLE (name{labels}) is >= 1.
wait_metric() {
    python3 - "$@" <<'EOF'
import re
import sys
import time
import urllib.request

url, sample, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
name, _, labels = sample.partition("{")
want = dict(re.findall(r'(\w+)="([^"]*)"', labels))
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    with urllib.request.urlopen(url, timeout=2) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)", line)
        if m and m.group(1) == name and float(m.group(3)) >= 1:
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in want.items()):
                print(f"ok   config reload: {sample} counted", flush=True)
                sys.exit(0)
    time.sleep(0.2)
print(f"FAIL config reload: {sample} not counted within {seconds:g}s", flush=True)
sys.exit(1)
EOF
}

if [[ $E2E_STORE == redis ]]; then
    scripts/redis-cluster.sh start "$WORK/redis" "$REDIS_BASE" >&2
    REDIS_STARTED=1
fi

python3 deploy/scenario/sample_tools.py --port "$TOOLS_PORT" --slow-seconds 3 >"$WORK/tools.log" 2>&1 &
TOOLS_PID=$!
wait_http "http://127.0.0.1:$TOOLS_PORT/healthz" "$TOOLS_PID" 10 || die "sample tools did not start (see $WORK/tools.log)"

TOOLGATE_ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
export TOOLGATE_ADMIN_TOKEN
"$TOOLGATE_BIN" serve --config "$WORK/toolgate.yaml" >"$WORK/toolgate.log" 2>&1 &
TOOLGATE_PID=$!
wait_http "http://127.0.0.1:$TELEMETRY_PORT/readyz" "$TOOLGATE_PID" "$READY_SECONDS" ||
    die "toolgate was not ready within ${READY_SECONDS}s"
log "toolgate is ready (pid $TOOLGATE_PID)"

status=0
python3 deploy/scenario/scenario.py \
    --agent "http://127.0.0.1:$AGENT_PORT" \
    --admin "http://127.0.0.1:$ADMIN_PORT" \
    --telemetry "http://127.0.0.1:$TELEMETRY_PORT" || status=$?

# The config file is watched: an allowed change is counted result="ok", a change that needs a
# restart (a listener address) result="error" and ignored.
if ((status == 0)); then
    sed -i 's/default_max_calls: 100/default_max_calls: 101/' "$WORK/toolgate.yaml"
    wait_metric "http://127.0.0.1:$TELEMETRY_PORT/metrics" 'toolgate_config_reloads_total{result="ok"}' 10 ||
        status=1
    sed -i "s/127\.0\.0\.1:$AGENT_PORT/127.0.0.1:$((AGENT_PORT + 1))/" "$WORK/toolgate.yaml"
    wait_metric "http://127.0.0.1:$TELEMETRY_PORT/metrics" 'toolgate_config_reloads_total{result="error"}' 10 ||
        status=1
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
