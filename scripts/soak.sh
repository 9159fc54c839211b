#!/usr/bin/env bash
# Soak test: the real toolgate under a steady mixed load for N minutes per store, with its RSS,
# every answer's code and every record checked; on Redis a primary is killed at mid-soak. The
# program is scripts/soak.py (its --help lists the checks and the tuning options).
#
#   scripts/soak.sh --minutes N [--store memory|redis|both]     (default both: memory, then redis)
#
# TOOLGATE_BIN (default target/debug/toolgate) must exist; the examples fake_tool and
# redis_cluster are built with cargo unless FAKE_TOOL_BIN / REDIS_CLUSTER_BIN name them. Installs
# redis-server when the Redis store is wanted and it is missing (scripts/install-deps.sh test).
# Every process it started is stopped however it ends; a failed run keeps its logs and configs
# (KEEP_WORK=1 keeps them always). Exit status: 0 all checks held, 1 a check failed, 2 setup.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { echo "soak: $*" >&2; }
die() {
    log "$*"
    exit 2
}
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
TOOLGATE_BIN=${TOOLGATE_BIN:-target/debug/toolgate}
[[ -x $TOOLGATE_BIN ]] || die "no toolgate binary at $TOOLGATE_BIN: run 'cargo build --bin toolgate' or set TOOLGATE_BIN"
command -v python3 >/dev/null || die "python3 is required"
if [[ " $* " != *" --store memory "* && " $* " != *" --store=memory "* ]]; then
    "$ROOT/scripts/install-deps.sh" test || die "redis-server is missing (scripts/install-deps.sh test failed)"
fi
TOOL=$(example_bin fake_tool)
CLUSTER=$(example_bin redis_cluster)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-soak.XXXXXX")
run_driver soak "${KEEP_WORK:-0}" python3 scripts/soak.py --toolgate "$TOOLGATE_BIN" \
    --tool "$TOOL" --redis-cluster "$CLUSTER" --workdir "$WORK" "$@"
