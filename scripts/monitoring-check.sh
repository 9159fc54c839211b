#!/usr/bin/env bash
# Checks toolgate's monitoring assets, charts/toolgate/files/ (the only copy of each): the alert
# rules (promtool check + unit tests), the Grafana dashboard (structure and every PromQL
# expression), and, end to end, that every dashboard and alert expression returns data from a
# real Prometheus scraping a real toolgate that ran the local scenario, and that every selector
# names a series the running toolgate exposes.
#
#   scripts/monitoring-check.sh            everything (needs the toolgate binary)
#   scripts/monitoring-check.sh --static   rules, unit tests, dashboard and expression parsing only
#
# Environment:
#   TOOLGATE_BIN             toolgate binary (default target/debug/toolgate)
#   FAKE_TOOL_BIN            the fake tool (default: built from examples/fake_tool.rs)
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

FILES=charts/toolgate/files
RULES=$FILES/toolgate-rules.yaml
RULE_TESTS=$FILES/toolgate-rules.test.yaml
DASHBOARD=$FILES/toolgate-dashboard.json
RUNBOOK=docs/runbook.md
SCENARIO_DIR=deploy/scenario
TOOLGATE_BIN="${TOOLGATE_BIN:-target/debug/toolgate}"

step() { printf '\n== %s\n' "$*"; }
die() { echo "monitoring-check: $*" >&2; exit 1; }
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

TMP="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-monitoring.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid" "pid $pid"; done
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
scripts/install-deps.sh monitoring python
promtool --version 2>&1 | head -n 1
use_venv
CHECK=("$PY" scripts/monitoring/check.py)

# --- (b) rules --------------------------------------------------------------------------------
step "promtool check rules"
promtool check rules "$RULES"
step "promtool test rules"
promtool test rules "$RULE_TESTS"

# --- (c) dashboard and expressions ----------------------------------------------------------
step "dashboard, rule metadata, runbook anchors; parse every expression"
"${CHECK[@]}" static --dashboard "$DASHBOARD" --rules "$RULES" --rule-tests "$RULE_TESTS" \
  --runbook "$RUNBOOK" --out "$TMP/exprs.json" --promtool-rules "$TMP/extracted-rules.json"
step "promtool parses every expression, as written and as the parser renders it"
promtool check rules "$TMP/extracted-rules.json"

if [[ "$STATIC_ONLY" == 1 ]]; then
  echo
  echo "monitoring-check: static checks passed (end-to-end skipped: --static)"
  exit 0
fi

# --- (d) end to end ---------------------------------------------------------------------------
step "end to end: toolgate + fake tool + scenario + prometheus"
[[ -x "$TOOLGATE_BIN" ]] || die "toolgate binary $TOOLGATE_BIN not found: build it (cargo build --bin toolgate), set TOOLGATE_BIN, or run with --static"
for f in toolgate-local.yaml scenario.py; do
  [[ -f "$SCENARIO_DIR/$f" ]] || die "$SCENARIO_DIR/$f is missing"
done
export TOOLGATE_ADMIN_TOKEN="${TOOLGATE_ADMIN_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}"

read -r AGENT_PORT ADMIN_PORT TELEMETRY_PORT TOOLS_PORT PROM_PORT < <(free_ports 5)
AGENT="http://127.0.0.1:$AGENT_PORT"
ADMIN="http://127.0.0.1:$ADMIN_PORT"
TELEMETRY="http://127.0.0.1:$TELEMETRY_PORT"
PROM="http://127.0.0.1:$PROM_PORT"

"${CHECK[@]}" render --toolgate-config "$SCENARIO_DIR/toolgate-local.yaml" \
  --toolgate-out "$TMP/toolgate.yaml" --prometheus-out "$TMP/prometheus.yml" \
  --rules "$ROOT/$RULES" --agent-port "$AGENT_PORT" --admin-port "$ADMIN_PORT" \
  --telemetry-port "$TELEMETRY_PORT" \
  --upstream "http://127.0.0.1:18080/=http://127.0.0.1:$TOOLS_PORT/"

echo "fake tool on :$TOOLS_PORT"
start_fake_tool "$TOOLS_PORT" "$TMP/fake-tool.log"
PIDS+=("$FAKE_TOOL_PID")

echo "toolgate: agent :$AGENT_PORT admin :$ADMIN_PORT telemetry :$TELEMETRY_PORT"
"$TOOLGATE_BIN" serve --config "$TMP/toolgate.yaml" >"$TMP/toolgate.log" 2>&1 &
PIDS+=($!)
python3 scripts/wait.py http "$TELEMETRY/readyz" --pid "$!" --timeout 30 \
  || { show_log "$TMP/toolgate.log"; die "toolgate not ready"; }

echo "prometheus on :$PROM_PORT"
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
python3 scripts/wait.py http "$PROM/-/ready" --pid "$!" --timeout 30 \
  || { show_log "$TMP/prometheus.log"; die "prometheus not ready"; }
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

step "selectors against toolgate's metric families; every expression against prometheus"
"${CHECK[@]}" query --prometheus "$PROM" --metrics "$TELEMETRY/metrics" --exprs "$TMP/exprs.json" \
  --timeout 90 "${RELOAD_FLAG[@]}" \
  || { show_log "$TMP/toolgate.log"; die "expressions failed against the scenario"; }

echo
echo "monitoring-check: all checks passed"
