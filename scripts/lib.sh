# shellcheck shell=bash
# Shared by the bash scripts (sourced, not run): the virtualenv, the example binaries, the fake
# tool and the Redis Cluster, and stopping what a script started. Expects `set -euo pipefail`,
# ROOT (the repository root) and a `die` function.

# use_venv: installs the Python tools when missing and sets PY to the virtualenv's python.
use_venv() {
    "$ROOT/scripts/install-deps.sh" python
    # shellcheck disable=SC2034  # for the caller
    PY=${TOOLGATE_VENV:-$ROOT/.venv}/bin/python
}

# free_ports N: N free loopback ports, space-separated (the one port helper, scripts/ports.py).
free_ports() {
    python3 "$ROOT/scripts/ports.py" "$1"
}

# cargo_target_dir: cargo's target directory (CARGO_TARGET_DIR or target/ of the repository).
cargo_target_dir() {
    (cd "$ROOT" && cargo metadata --format-version 1 --no-deps) |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# example_bin NAME: the path of the example binary NAME (examples/NAME.rs), built in the debug
# profile when NAME_BIN (FAKE_TOOL_BIN, REDIS_CLUSTER_BIN) does not name one.
example_bin() {
    local name=$1 var
    var=$(tr '[:lower:]' '[:upper:]' <<<"$name")_BIN
    if [[ -n ${!var:-} ]]; then
        [[ -x ${!var} ]] || die "$var=${!var} is not an executable"
        echo "${!var}"
        return
    fi
    (cd "$ROOT" && cargo build --quiet --locked --example "$name" >&2) || die "cargo build --example $name failed"
    echo "$(cargo_target_dir)/debug/examples/$name"
}

# start_fake_tool PORT LOG: runs examples/fake_tool on 127.0.0.1:PORT and waits for its /healthz;
# sets FAKE_TOOL_PID.
start_fake_tool() {
    local port=$1 log=$2 bin
    bin=$(example_bin fake_tool)
    "$bin" --listen "127.0.0.1:$port" >"$log" 2>&1 &
    FAKE_TOOL_PID=$!
    python3 "$ROOT/scripts/wait.py" http "http://127.0.0.1:$port/healthz" --pid "$FAKE_TOOL_PID" --timeout 15 ||
        { tail -n 20 "$log" >&2; die "the fake tool did not start"; }
}

# start_redis_cluster LOG: runs examples/redis_cluster as a coprocess, whose stdin is a pipe from
# this shell, so the cluster also goes when the script dies; sets REDIS_URLS (the six node URLs)
# and REDIS_CLUSTER_PID.
start_redis_cluster() {
    local log=$1 bin line
    bin=$(example_bin redis_cluster)
    coproc REDIS_CLUSTER { exec "$bin" 2>"$log"; }
    if ! read -r -t 120 -u "${REDIS_CLUSTER[0]}" line || [[ $line != redis://* ]]; then
        tail -n 40 "$log" >&2
        die "the Redis Cluster did not form"
    fi
    # shellcheck disable=SC2034  # for the caller
    read -r -a REDIS_URLS <<<"$line"
}

# stop_pid PID NAME: SIGTERM, up to 15 s for it to exit, then SIGKILL; reaps it.
stop_pid() {
    local pid=$1 name=$2 end
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    end=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] &&
        ((SECONDS < end)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
        echo "$name did not stop on SIGTERM; killing it" >&2
        kill -9 "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# stop_driver DRIVER_PID PIDFILE: the backstop of a Python driver that keeps its children's pids
# in PIDFILE (scripts/procs.py). The driver stops its own children; this stops the driver if it is
# still running, then every pid left in the file, in case the driver was killed outright.
stop_driver() {
    local driver=$1 pidfile=$2 pid
    if [[ -n $driver ]] && kill -0 "$driver" 2>/dev/null; then
        kill -TERM "$driver" 2>/dev/null || true
        wait "$driver" 2>/dev/null || true
    fi
    if [[ -f $pidfile ]]; then
        while read -r pid; do
            stop_pid "$pid" "process $pid"
        done <"$pidfile"
    fi
}

# run_driver NAME KEEP CMD...: runs the Python driver CMD, which keeps its children's pids in
# $WORK/pids, and exits with its status. However the script ends (the driver's exit, a signal),
# the driver and its children are stopped, and $WORK is removed, unless the driver failed (a
# status from 1 to 127) or KEEP is 1: then its logs and configs stay, and a line says where.
run_driver() {
    DRIVER_NAME=$1 DRIVER_KEEP=$2
    shift 2
    trap _driver_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    "$@" &
    DRIVER=$!
    wait "$DRIVER"
}

# shellcheck disable=SC2317  # runs from the EXIT trap run_driver sets
_driver_cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    stop_driver "${DRIVER:-}" "$WORK/pids"
    if [[ $DRIVER_KEEP == 1 ]] || ((rc != 0 && rc < 128)); then
        echo "$DRIVER_NAME: logs and configs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
