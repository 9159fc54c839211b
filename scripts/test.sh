#!/usr/bin/env bash
# The Rust test suite on a fresh machine: installs what `cargo test` needs (Redis, for the store
# tests), then runs `cargo test --locked` with this script's arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
cargo test --locked "$@"
