#!/usr/bin/env bash
# What toolgate costs on the call path, next to a direct call and nginx: see bench/README.md.
#
#   bench/run.sh            full run (about 12 minutes after the build), writes bench/results/latest.json
#   bench/run.sh --quick    CI smoke run (well under 2 minutes after the build), writes
#                           bench/results/quick.json; fails only when a request failed
#   bench/run.sh --only size [--result-bytes 1k,64k,1m]
#                           only the answer-size leg: latency, CPU and RSS at each answer size,
#                           writes bench/results/size.json
#   bench/run.sh --callgrind toolgate-redis-primary [--calls N]
#                           instead: toolgate's instructions per call under valgrind's callgrind,
#                           with file:function names (a separate build with line tables)
#   bench/run.sh --callgrind toolgate-memory --result-bytes 1k,64k,1m
#                           the same at each answer size, with the instructions per byte of
#                           answer and what grows with it, into bench/results/size.json
#   bench/run.sh --callgrind redis-primary-node [--calls N]
#                           instead: the Redis primary's instructions per call for the call's two
#                           scripts, replayed from a recorded run under callgrind
#
# Any other option goes to bench/bench.py (--help lists them). Installs nginx, wrk and Redis from
# Debian's packages when they are missing (scripts/install-deps.sh bench), builds the release
# binaries with cargo (toolgate, and the examples fake_tool and redis_cluster; CARGO_TARGET_DIR is
# honoured), and stops every process it started however it ends.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)

die() {
    echo "bench: $*" >&2
    exit 2
}

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi

# --- tools -------------------------------------------------------------------------------------
"$ROOT/scripts/install-deps.sh" bench || die "missing tools (scripts/install-deps.sh bench failed)"
command -v python3 >/dev/null 2>&1 || die "python3 is required"
NGINX=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
export NGINX

# --- build -------------------------------------------------------------------------------------
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
TARGET_DIR=$(cargo_target_dir)
if [[ " $* " == *" --callgrind "* ]]; then
    command -v valgrind >/dev/null 2>&1 || die "--callgrind needs valgrind (apt-get install valgrind)"
    # Line tables give file:function names; a target dir of its own keeps the normal build as is.
    export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
    TARGET_DIR=$TARGET_DIR/profiling
    export CARGO_TARGET_DIR=$TARGET_DIR
fi
echo "bench: cargo build --release --locked --bin toolgate --example fake_tool --example redis_cluster" >&2
cargo build --release --locked --bin toolgate --example fake_tool --example redis_cluster
TOOLGATE=$TARGET_DIR/release/toolgate
TOOL=$TARGET_DIR/release/examples/fake_tool
CLUSTER_BIN=$TARGET_DIR/release/examples/redis_cluster
[[ -x $TOOLGATE && -x $TOOL && -x $CLUSTER_BIN ]] || die "built binaries not found under $TARGET_DIR/release"

# --- run ---------------------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-bench.XXXXXX")
run_driver bench "$([[ -n ${BENCH_KEEP_WORKDIR:-} ]] && echo 1 || echo 0)" \
    python3 "$BENCH_DIR/bench.py" --toolgate "$TOOLGATE" --tool "$TOOL" --workdir "$WORK" \
    --redis-cluster "$CLUSTER_BIN" "$@"
