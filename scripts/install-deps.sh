#!/usr/bin/env bash
# Installs what the tests, checks and benchmark need, when it is missing, by group:
#
#   scripts/install-deps.sh test         what `cargo test` needs: redis-server, redis-cli, and
#                                        for the MCP interop tests python3-venv, nodejs and npm,
#                                        tests/mcp/.venv (tests/mcp/requirements.txt) and
#                                        tests/mcp/node_modules (npm ci of tests/mcp)
#   scripts/install-deps.sh monitoring   prometheus, promtool
#   scripts/install-deps.sh bench        nginx, wrk, and the test group (Redis)
#   scripts/install-deps.sh python       python3-venv, and .venv with scripts/requirements.txt
#   scripts/install-deps.sh lint         shellcheck, and the python group (ruff)
#   scripts/install-deps.sh [all]        every group
#
# Debian packages come from apt-get (as root, or through sudo); their services are kept from
# starting on install, since every check starts its own instances. TOOLGATE_VENV moves the
# virtualenv (default .venv at the repository root), TOOLGATE_MCP_VENV the MCP tests' one
# (default tests/mcp/.venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TOOLGATE_VENV:-$ROOT/.venv}
REQUIREMENTS=$ROOT/scripts/requirements.txt
MCP_DIR=$ROOT/tests/mcp
MCP_VENV=${TOOLGATE_MCP_VENV:-$MCP_DIR/.venv}

log() { echo "install-deps: $*" >&2; }

groups=("$@")
((${#groups[@]})) || groups=(all)
need=()
want_venv=""
want_mcp=""
for group in "${groups[@]}"; do
    case $group in
    all) set -- test monitoring bench python lint ;;
    lint) set -- lint python ;;
    test | monitoring | bench | python) set -- "$group" ;;
    *)
        echo "usage: $0 [test|monitoring|bench|python|lint|all]..." >&2
        exit 64
        ;;
    esac
    for g in "$@"; do
        case $g in
        test | bench)
            command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
            command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
            ;;&
        test)
            python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
            command -v node >/dev/null 2>&1 || need+=(nodejs)
            command -v npm >/dev/null 2>&1 || need+=(npm)
            want_mcp=1
            ;;
        bench)
            command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || need+=(nginx-light)
            command -v wrk >/dev/null 2>&1 || need+=(wrk)
            ;;
        monitoring)
            command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 ||
                need+=(prometheus)
            ;;
        lint)
            command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
            ;;
        python)
            python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
            want_venv=1
            ;;
        esac
    done
done

if ((${#need[@]})); then
    command -v apt-get >/dev/null 2>&1 || { log "missing ${need[*]} and no apt-get to install them"; exit 1; }
    sudo=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null 2>&1 || { log "missing ${need[*]}: run this as root"; exit 1; }
        sudo=(sudo)
    fi
    # Each package once (python3-venv can come from two groups).
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    log "installing ${need[*]}"
    # policy-rc.d exit 101: the packages' services (redis :6379, nginx :80, prometheus :9090)
    # are not started on install.
    policy=/usr/sbin/policy-rc.d
    added_policy=""
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod +x "$policy"
        added_policy=1
    fi
    rc=0
    "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" \
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || rc=$?
    [[ -z $added_policy ]] || "${sudo[@]}" rm -f "$policy"
    ((rc == 0)) || { log "apt-get install ${need[*]} failed"; exit "$rc"; }
fi

if [[ -n $want_venv ]]; then
    if [[ ! -x $VENV/bin/python ]]; then
        log "creating the virtualenv $VENV"
        python3 -m venv "$VENV"
    fi
    # Reinstalled only when scripts/requirements.txt changed.
    stamp=$VENV/.requirements.sha256
    sum=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
    if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
        log "pip install -r scripts/requirements.txt into $VENV"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
        echo "$sum" >"$stamp"
    fi
fi

if [[ -n $want_mcp ]]; then
    # The official MCP SDKs the interop tests drive (tests/integration/mcp/), each reinstalled
    # only when its pinned list changed.
    if [[ ! -x $MCP_VENV/bin/python ]]; then
        log "creating the virtualenv $MCP_VENV"
        python3 -m venv "$MCP_VENV"
    fi
    stamp=$MCP_VENV/.requirements.sha256
    sum=$(sha256sum "$MCP_DIR/requirements.txt" | cut -d' ' -f1)
    if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
        log "pip install -r tests/mcp/requirements.txt into $MCP_VENV"
        "$MCP_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            -r "$MCP_DIR/requirements.txt"
        echo "$sum" >"$stamp"
    fi
    stamp=$MCP_DIR/node_modules/.package-lock.sha256
    sum=$(sha256sum "$MCP_DIR/package-lock.json" | cut -d' ' -f1)
    if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
        log "npm ci in tests/mcp"
        (cd "$MCP_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        echo "$sum" >"$stamp"
    fi
fi
