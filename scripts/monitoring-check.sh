#!/usr/bin/env bash
# Checks toolgate's monitoring assets: the alert rules (promtool check + unit tests), the Grafana
# dashboard (structure and every PromQL expression), and, end to end, that every dashboard and
# alert expression returns data from a real Prometheus scraping a real toolgate that ran the
# local scenario.
#
#   scripts/monitoring-check.sh            everything (needs the toolgate binary)
#   scripts/monitoring-check.sh --static   rules, unit tests and dashboard only
#
# Environment:
#   TOOLGATE_BIN             toolgate binary (default target/debug/toolgate)
#   TOOLGATE_ADMIN_TOKEN     admin token for the local sidecar (default: a random one)
#   MONITORING_SKIP_RELOAD=1 skip the config reload step (reload series then may be empty)
#   MONITORING_KEEP_TMP=1    keep the temporary directory (configs, logs, TSDB) for inspection
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STATIC_ONLY=0
case "${1:-}" in
  --static) STATIC_ONLY=1 ;;
  "") ;;
  *) echo "usage: $0 [--static]" >&2; exit 64 ;;
esac

RULES=deploy/prometheus/toolgate-rules.yaml
RULE_TESTS=deploy/prometheus/toolgate-rules.test.yaml
DASHBOARD=deploy/grafana/toolgate-dashboard.json
RUNBOOK=docs/runbook.md
SCENARIO_DIR=deploy/scenario
TOOLGATE_BIN="${TOOLGATE_BIN:-target/debug/toolgate}"

step() { printf '\n== %s\n' "$*"; }
die() { echo "monitoring-check: $*" >&2; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-monitoring.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    # Bounded wait for each process to exit, then SIGKILL.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "${MONITORING_KEEP_TMP:-}" ]]; then
    echo "monitoring-check: kept $TMP" >&2
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Prints the tail of a log when a step fails, so CI output shows why.
show_log() { echo "--- last lines of $1" >&2; tail -n 40 "$1" >&2 || true; }

# --- (a) tools --------------------------------------------------------------------------------
step "tools"
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  [[ "$(id -u)" == 0 ]] || die "promtool/prometheus missing; install Debian's prometheus package (needs root)"
  echo "installing Debian's prometheus package (promtool, prometheus)"
  # policy-rc.d 101: do not start the packaged service; this check runs its own instance.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    POLICY_RC_ADDED=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  [[ -n "${POLICY_RC_ADDED:-}" ]] && rm -f /usr/sbin/policy-rc.d
fi
promtool --version 2>&1 | head -n 1

# PyYAML for reading the rules and the scenario config: the system Python's, else a .venv.
PY=""
for candidate in "$ROOT/.venv/bin/python" python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import yaml' 2>/dev/null; then
    PY="$candidate"
    break
  fi
done
if [[ -z "$PY" ]]; then
  echo "creating .venv with PyYAML"
  python3 -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/pip" install -q 'PyYAML>=6,<7'
  PY="$ROOT/.venv/bin/python"
fi
CHECK=("$PY" scripts/monitoring/check.py)

# --- (b) rules --------------------------------------------------------------------------------
step "promtool check rules"
promtool check rules "$RULES"
step "promtool test rules"
promtool test rules "$RULE_TESTS"

# --- (c) dashboard and expressions ----------------------------------------------------------
step "dashboard, rule metadata, runbook anchors; extract expressions"
"${CHECK[@]}" static --dashboard "$DASHBOARD" --rules "$RULES" --rule-tests "$RULE_TESTS" \
  --runbook "$RUNBOOK" --out "$TMP/exprs.json" --promtool-rules "$TMP/extracted-rules.json"
step "promtool parses every extracted expression"
promtool check rules "$TMP/extracted-rules.json"

if [[ "$STATIC_ONLY" == 1 ]]; then
  echo
  echo "monitoring-check: static checks passed (end-to-end skipped: --static)"
  exit 0
fi

# --- (d) end to end ---------------------------------------------------------------------------
step "end to end: toolgate + sample tools + scenario + prometheus"
[[ -x "$TOOLGATE_BIN" ]] || die "toolgate binary $TOOLGATE_BIN not found: build it (cargo build --bin toolgate), set TOOLGATE_BIN, or run with --static"
for f in toolgate-local.yaml sample_tools.py scenario.py; do
  [[ -f "$SCENARIO_DIR/$f" ]] || die "$SCENARIO_DIR/$f is missing"
done
export TOOLGATE_ADMIN_TOKEN="${TOOLGATE_ADMIN_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}"

read -r AGENT_PORT ADMIN_PORT TELEMETRY_PORT TOOLS_PORT PROM_PORT < <("${CHECK[@]}" free-ports 5)
AGENT="http://127.0.0.1:$AGENT_PORT"
ADMIN="http://127.0.0.1:$ADMIN_PORT"
TELEMETRY="http://127.0.0.1:$TELEMETRY_PORT"
PROM="http://127.0.0.1:$PROM_PORT"

"${CHECK[@]}" render --toolgate-config "$SCENARIO_DIR/toolgate-local.yaml" \
  --toolgate-out "$TMP/toolgate.yaml" --prometheus-out "$TMP/prometheus.yml" \
  --rules "$ROOT/$RULES" --agent-port "$AGENT_PORT" --admin-port "$ADMIN_PORT" \
  --telemetry-port "$TELEMETRY_PORT" \
  --upstream "http://127.0.0.1:18080/=http://127.0.0.1:$TOOLS_PORT/"

echo "sample tools on :$TOOLS_PORT"
"$PY" "$SCENARIO_DIR/sample_tools.py" --port "$TOOLS_PORT" >"$TMP/sample-tools.log" 2>&1 &
PIDS+=($!)

echo "toolgate: agent :$AGENT_PORT admin :$ADMIN_PORT telemetry :$TELEMETRY_PORT"
"$TOOLGATE_BIN" serve --config "$TMP/toolgate.yaml" >"$TMP/toolgate.log" 2>&1 &
PIDS+=($!)
"${CHECK[@]}" wait-http "http://127.0.0.1:$TOOLS_PORT/healthz" --timeout 30 \
  || { show_log "$TMP/sample-tools.log"; die "sample tools not ready"; }
"${CHECK[@]}" wait-http "$TELEMETRY/readyz" --timeout 30 || { show_log "$TMP/toolgate.log"; die "toolgate not ready"; }

echo "prometheus on :$PROM_PORT"
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
"${CHECK[@]}" wait-http "$PROM/-/ready" --timeout 30 || { show_log "$TMP/prometheus.log"; die "prometheus not ready"; }
"${CHECK[@]}" wait-query --prometheus "$PROM" 'up{job="toolgate"} == 1' --timeout 30 \
  || { show_log "$TMP/prometheus.log"; die "prometheus does not scrape toolgate"; }

step "scenario"
# The scenario is the traffic here; its own assertions are the end-to-end test's business. A
# mismatch is reported, and the expression checks below decide whether monitoring still works.
if ! "$PY" "$SCENARIO_DIR/scenario.py" --agent "$AGENT" --admin "$ADMIN" --telemetry "$TELEMETRY"; then
  echo "monitoring-check: WARNING: the scenario reported a mismatch (above); continuing with its traffic" >&2
fi

RELOAD_FLAG=()
if [[ -z "${MONITORING_SKIP_RELOAD:-}" ]]; then
  step "config reload: one refused, one applied"
  cp "$TMP/toolgate.yaml" "$TMP/toolgate.yaml.good"
  { cat "$TMP/toolgate.yaml.good"; echo "not_a_toolgate_key: true"; } >"$TMP/toolgate.yaml.next"
  mv "$TMP/toolgate.yaml.next" "$TMP/toolgate.yaml"
  "${CHECK[@]}" wait-query --prometheus "$PROM" 'toolgate_config_reloads_total{result="error"} >= 1' --timeout 30 \
    || { show_log "$TMP/toolgate.log"; die "a refused reload did not show in toolgate_config_reloads_total"; }
  cp "$TMP/toolgate.yaml.good" "$TMP/toolgate.yaml.next"
  mv "$TMP/toolgate.yaml.next" "$TMP/toolgate.yaml"
  "${CHECK[@]}" wait-query --prometheus "$PROM" 'toolgate_config_reloads_total{result="ok"} >= 1' --timeout 30 \
    || { show_log "$TMP/toolgate.log"; die "an applied reload did not show in toolgate_config_reloads_total"; }
  RELOAD_FLAG=(--reload-done)
fi

step "every expression against prometheus"
"${CHECK[@]}" query --prometheus "$PROM" --exprs "$TMP/exprs.json" --timeout 90 "${RELOAD_FLAG[@]}" \
  || { show_log "$TMP/toolgate.log"; die "expressions failed against the scenario"; }

echo
echo "monitoring-check: all checks passed"
