#!/usr/bin/env bash
# The Python SDK's checks (clients/python), as CI runs them:
#
#   1. a virtualenv with the package, every extra and the framework releases pinned in
#      clients/python/requirements-test.txt; ruff, mypy --strict on the package, and pytest
#      against the real sidecar (the debug build; the Redis module spawns its own cluster);
#   2. a second virtualenv with mcp 2.x (clients/python/requirements-mcp2.txt), where
#      tests/test_mcp.py runs again: langchain-mcp-adapters holds the first one at mcp 1.x, and
#      toolgate.mcp must work with both.
#
#   TOOLGATE_BIN=target/debug/toolgate scripts/sdk-python.sh [pytest args]
#
# The binaries (toolgate, examples fake_tool and redis_cluster) must be built (`make build`).
# SDK_VENV and SDK_MCP2_VENV move the virtualenvs (default clients/python/.venv and .venv-mcp2);
# each is reinstalled only when its requirements file changed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/install-deps.sh test
PKG=clients/python
VENV=${SDK_VENV:-$ROOT/$PKG/.venv}
MCP2_VENV=${SDK_MCP2_VENV:-$ROOT/$PKG/.venv-mcp2}
export TOOLGATE_BIN=${TOOLGATE_BIN:-$ROOT/target/debug/toolgate}

log() { echo "sdk-python: $*" >&2; }

# venv DIR REQUIREMENTS EXTRAS: DIR holds the pinned requirements (reinstalled when the file
# changed) and the package as a user installs it, `pip install ./clients/python[EXTRAS]` (every
# run, so the tests see the current source).
venv() {
    local dir=$1 requirements=$2 extras=$3
    [[ -x $dir/bin/python ]] || { log "creating $dir"; python3 -m venv "$dir"; }
    local stamp=$dir/.requirements.sha256 sum
    sum=$(sha256sum "$requirements" | cut -d' ' -f1)
    if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
        log "pip install -r $requirements into $dir"
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
        echo "$sum" >"$stamp"
    fi
    # --no-deps: every dependency is pinned in the requirements file, and pip check proves it.
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --no-build-isolation --force-reinstall "./${PKG}[${extras}]"
    "$dir/bin/python" -m pip check
}

venv "$VENV" "$PKG/requirements-test.txt" "langchain,openai-agents,pydantic-ai,mcp,evidence"
venv "$MCP2_VENV" "$PKG/requirements-mcp2.txt" "mcp"

cd "$PKG"
log "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
log "mypy --strict"
"$VENV/bin/mypy" src tests
log "pytest (every extra, mcp $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
log "pytest tests/test_mcp.py (mcp $("$MCP2_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
"$MCP2_VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_mcp.py
log "passed"
