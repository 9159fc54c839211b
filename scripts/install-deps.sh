#!/usr/bin/env bash
# Installs the system packages the tests, checks and benchmark need, when they are missing:
# redis-server/redis-cli (store tests, e2e), prometheus/promtool (monitoring checks),
# nginx and wrk (benchmark), python3-venv (chart and manifest validation).
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)

if [ ${#need[@]} -eq 0 ]; then
  echo "install-deps: everything is present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts packaged services on install; the tests start their own instances.
for svc in redis-server prometheus nginx; do
  $sudo systemctl stop "$svc" >/dev/null 2>&1 || $sudo service "$svc" stop >/dev/null 2>&1 || true
done
echo "install-deps: done"
