#!/usr/bin/env bash
# A throwaway six-node Redis Cluster (three primaries, three replicas) on 127.0.0.1 for local runs
# and tests of toolgate's redis-cluster store.
#
#   scripts/redis-cluster.sh start DIR BASEPORT   nodes on BASEPORT..BASEPORT+5 (bus ports +10000);
#                                                 pid files, logs and nodes.conf files go in DIR
#   scripts/redis-cluster.sh stop DIR             stops the nodes whose pid files are in DIR
#
# start returns once every node reports cluster_state:ok and every replica's link to its primary
# is up. Nothing is persisted (no RDB, no AOF).
set -euo pipefail

NODES=6
DEADLINE_SECONDS=${REDIS_CLUSTER_DEADLINE_SECONDS:-30}

die() {
    echo "redis-cluster: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 start DIR BASEPORT | stop DIR" >&2
    exit 64
}

need_redis() {
    local tool
    for tool in redis-server redis-cli; do
        command -v "$tool" >/dev/null 2>&1 ||
            die "$tool not found: install Redis 7 or later (Debian/Ubuntu: apt-get install redis-server; it brings redis-cli too)"
    done
}

cli() {
    redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null
}

# poll DESCRIPTION COMMAND...: run COMMAND until it succeeds or the deadline passes.
poll() {
    local what=$1
    shift
    local end=$((SECONDS + DEADLINE_SECONDS))
    until "$@"; do
        if ((SECONDS >= end)); then
            return 1
        fi
        sleep 0.1
    done
    echo "redis-cluster: $what" >&2
}

node_answers() {
    [[ $(cli "$1" ping) == PONG ]]
}

all_answer() {
    local port
    for port in "${PORTS[@]}"; do
        node_answers "$port" || return 1
    done
}

cluster_ready() {
    local port info repl
    for port in "${PORTS[@]}"; do
        info=$(cli "$port" cluster info) || return 1
        [[ $info == *cluster_state:ok* ]] || return 1
        repl=$(cli "$port" info replication) || return 1
        if [[ $repl == *role:slave* && $repl != *master_link_status:up* ]]; then
            return 1
        fi
    done
    # Every node must see the final layout (three replicas): until the gossip settles, a node may
    # still list a replica as a primary.
    local replicas
    for port in "${PORTS[@]}"; do
        replicas=$(cli "$port" cluster nodes | grep -cE '[ ,]slave ' || true)
        ((replicas == NODES / 2)) || return 1
    done
}

stop_cluster() {
    local dir=$1 pidfile pid stopped=0
    shopt -s nullglob
    for pidfile in "$dir"/redis-*.pid; do
        pid=$(cat "$pidfile" 2>/dev/null || true)
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            local end=$((SECONDS + 10))
            while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do
                sleep 0.05
            done
            if kill -0 "$pid" 2>/dev/null; then
                kill -9 "$pid" 2>/dev/null || true
            fi
            stopped=$((stopped + 1))
        fi
        rm -f "$pidfile"
    done
    echo "redis-cluster: stopped $stopped node(s) in $dir" >&2
}

start_cluster() {
    local dir=$1 base=$2
    if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1024 || base + NODES - 1 + 10000 > 65535)); then
        die "BASEPORT must be a number from 1024 to $((65535 - 10000 - NODES + 1))"
    fi
    need_redis
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)

    PORTS=()
    local i port
    for ((i = 0; i < NODES; i++)); do
        PORTS+=($((base + i)))
    done
    for port in "${PORTS[@]}"; do
        if node_answers "$port"; then
            die "something already answers on 127.0.0.1:$port; pick another BASEPORT"
        fi
    done

    # A failed start leaves nothing running.
    trap 'stop_cluster "$dir"' EXIT
    for port in "${PORTS[@]}"; do
        rm -f "$dir/nodes-$port.conf"
        redis-server \
            --bind 127.0.0.1 \
            --port "$port" \
            --dir "$dir" \
            --daemonize yes \
            --pidfile "$dir/redis-$port.pid" \
            --logfile "$dir/redis-$port.log" \
            --cluster-enabled yes \
            --cluster-config-file "nodes-$port.conf" \
            --cluster-node-timeout 2000 \
            --repl-diskless-sync-delay 0 \
            --save '' \
            --appendonly no ||
            die "redis-server failed on port $port (see $dir/redis-$port.log)"
    done
    poll "$NODES nodes answer on 127.0.0.1:${PORTS[0]}..${PORTS[-1]}" all_answer ||
        die "nodes did not answer within ${DEADLINE_SECONDS}s (logs in $dir)"

    local addrs=()
    for port in "${PORTS[@]}"; do
        addrs+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
        die "redis-cli --cluster create failed: $(tail -5 "$dir/create.log")"
    poll "cluster_state:ok on all nodes, replicas linked" cluster_ready ||
        die "cluster not ready within ${DEADLINE_SECONDS}s (logs in $dir)"
    trap - EXIT
    echo "redis-cluster: running on 127.0.0.1:${PORTS[0]}..${PORTS[-1]} (stop: $0 stop $dir)"
}

case ${1:-} in
start)
    (($# == 3)) || usage
    start_cluster "$2" "$3"
    ;;
stop)
    (($# == 2)) || usage
    [[ -d $2 ]] || die "no such directory: $2"
    stop_cluster "$2"
    ;;
*)
    usage
    ;;
esac
