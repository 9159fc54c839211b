#!/usr/bin/env bash
# Offline checks of the Helm chart and the Kubernetes manifests (no cluster, no helm binary):
# scripts/k8s_check.py says what it checks. It runs in the virtualenv .venv (created when
# missing, from scripts/requirements.txt). TOOLGATE_BIN (default target/debug/toolgate) adds the
# `toolgate check` and injector checks; KUBE_VERSION (default 1.33.0) the Kubernetes version.
# Exit 0 only when all pass.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
die() {
    echo "k8s-check: $*" >&2
    exit 1
}
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

command -v openssl >/dev/null || die "openssl is required (apt-get install openssl)"
use_venv
exec "$PY" scripts/k8s_check.py
