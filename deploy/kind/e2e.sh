#!/usr/bin/env bash
# End-to-end test of toolgate on a kind cluster: build the image (its e2e target also holds the
# fake tool, which serves as the sample tools), create the cluster, run a Redis Cluster and the
# sample tools, install the chart, run the sample agent Job (the webhook injects the sidecar) and
# check the outcome. Exit 0 only when every check holds.
#
# Needs Docker, kind, kubectl, helm and python3 on PATH, plus network access to pull redis:7,
# python:3.12-slim (the agent), the kind node image and the Rust/distroless base images. It is not
# run by CI (CI machines have no Docker engine); scripts/e2e-local.sh runs the same scenario without
# Kubernetes, and scripts/k8s-check.sh validates every manifest used here.
#
#   deploy/kind/e2e.sh                  # KEEP_CLUSTER=1 keeps the cluster after a pass
#
# A failed run always keeps the cluster for inspection (kind delete cluster --name toolgate-e2e).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
CLUSTER=${KIND_CLUSTER:-toolgate-e2e}
IMAGE=toolgate:e2e
NS=toolgate-e2e
SYSTEM_NS=toolgate-system
RELEASE=toolgate
CONTEXT=kind-$CLUSTER
KUBECTL=(kubectl --context "$CONTEXT")

log() { echo "e2e: $*" >&2; }
die() {
    log "$*"
    exit 1
}

for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || die "$tool is required on PATH"
done

passed=0
failed=0
check() {
    local what=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
        log "ok   $what"
    else
        failed=$((failed + 1))
        log "FAIL $what"
    fi
}

on_exit() {
    local rc=$?
    if ((rc == 0)) && [[ ${KEEP_CLUSTER:-} != 1 ]]; then
        kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    elif kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
        log "cluster $CLUSTER kept (kubectl --context $CONTEXT ...; kind delete cluster --name $CLUSTER)"
    fi
}
trap on_exit EXIT

log "building $IMAGE"
DOCKER_BUILDKIT=1 docker build --target e2e -t "$IMAGE" "$ROOT"

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER"
else
    kind create cluster --name "$CLUSTER" --config deploy/kind/kind-config.yaml --wait 120s
fi
kind load docker-image "$IMAGE" --name "$CLUSTER"

"${KUBECTL[@]}" apply -f deploy/kind/namespaces.yaml
"${KUBECTL[@]}" -n "$NS" create configmap scenario --from-file=deploy/scenario/scenario.py \
    --dry-run=client -o yaml | "${KUBECTL[@]}" apply -f -

log "Redis Cluster"
"${KUBECTL[@]}" apply -f deploy/kind/redis-cluster.yaml
"${KUBECTL[@]}" -n "$NS" rollout status statefulset/redis --timeout=300s
"${KUBECTL[@]}" -n "$NS" wait --for=condition=complete job/redis-cluster-create --timeout=300s

log "sample tools"
"${KUBECTL[@]}" apply -f deploy/kind/sample-tools.yaml
"${KUBECTL[@]}" -n "$NS" rollout status deployment/tools --timeout=300s

log "chart"
helm upgrade --install "$RELEASE" charts/toolgate --kube-context "$CONTEXT" \
    --namespace "$SYSTEM_NS" --create-namespace -f deploy/kind/values-e2e.yaml \
    --wait --timeout 5m
"${KUBECTL[@]}" -n "$SYSTEM_NS" rollout status "deployment/$RELEASE-injector" --timeout=300s

log "agent"
"${KUBECTL[@]}" -n "$NS" delete job agent --ignore-not-found --wait=true
"${KUBECTL[@]}" apply -f deploy/kind/agent-job.yaml

# Wait for the Job to succeed or fail (poll with a deadline).
end=$((SECONDS + 600))
outcome=""
while ((SECONDS < end)); do
    outcome=$("${KUBECTL[@]}" -n "$NS" get job agent \
        -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}')
    [[ $outcome == *Complete* || $outcome == *Failed* ]] && break
    sleep 2
done
log "agent Job conditions: ${outcome:-none}"

pod=$("${KUBECTL[@]}" -n "$NS" get pods -l job-name=agent -o jsonpath='{.items[0].metadata.name}')
pod_json=$("${KUBECTL[@]}" -n "$NS" get pod "$pod" -o json)
agent_log=$("${KUBECTL[@]}" -n "$NS" logs "$pod" -c agent || true)
while IFS= read -r line; do echo "  agent | $line" >&2; done <<<"$agent_log"

injected() { python3 deploy/kind/injected.py <<<"$pod_json"; }
job_succeeded() { [[ $outcome == *Complete* ]]; }
log_has() {
    local line
    for line in "$@"; do
        grep -qF -- "$line" <<<"$agent_log" || return 1
    done
}
scenario_passed() { grep -qE '^scenario: [0-9]+ passed, 0 failed$' <<<"$agent_log"; }

run_id=$(grep -oE 'run_id=[A-Za-z0-9._-]+' <<<"$agent_log" | head -n 1 | cut -d= -f2 || true)
progress_in_redis() {
    # Four READY and four ERROR calls were finalized; the progress list lives in Redis Cluster.
    [[ -n $run_id ]] || return 1
    local n
    n=$("${KUBECTL[@]}" -n "$NS" exec redis-0 -- redis-cli -c LLEN "toolgate:{$run_id}:progress")
    log "progress list of $run_id in Redis Cluster holds $n ids"
    ((n == 8))
}
dashboard_present() {
    "${KUBECTL[@]}" -n "$SYSTEM_NS" get configmap -l grafana_dashboard=1 -o name | grep -q dashboard
}

check "sidecar injected as the first, restartable init container" injected
check "agent Job succeeded" job_succeeded
check "scenario reported no failure" scenario_passed
check "READY results (envelope and intercept forms)" log_has "ok   search found: READY" "ok   intercept:"
check "NO_EVIDENCE kept as a fact" log_has "ok   search nothing: READY NO_EVIDENCE"
check "RESULT_TOO_LARGE at the raw and agent stages" log_has "ok   big (raw): 502 RESULT_TOO_LARGE" \
    "ok   wide (agent): 502 RESULT_TOO_LARGE"
check "facts are the READY calls in order" log_has "ok   facts:"
check "metrics with the expected names and labels" log_has "ok   metrics:"
check "records durable in Redis Cluster" progress_in_redis
check "Grafana dashboard ConfigMap installed" dashboard_present

log "$passed passed, $failed failed"
((failed == 0))
