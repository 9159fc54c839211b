#!/usr/bin/env bash
# The whole Rust test suite on a fresh machine: installs what the tests need, then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo test --locked "$@"
