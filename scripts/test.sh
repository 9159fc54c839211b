#!/usr/bin/env bash
# The Rust test suite on a fresh machine: installs what `cargo test` needs (Redis for the store
# tests; the official MCP SDKs, Python and Node, for the MCP interop tests), then runs
# `cargo test --locked` with this script's arguments, for toolgate and its allocator crate
# (`alloc/`). The MCP tests find the SDKs through
# TOOLGATE_MCP_PYTHON (the python of tests/mcp/.venv, or of TOOLGATE_MCP_VENV) and
# TOOLGATE_MCP_NODE_DIR (tests/mcp, holding node_modules), exported here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
export TOOLGATE_MCP_PYTHON=${TOOLGATE_MCP_PYTHON:-${TOOLGATE_MCP_VENV:-$PWD/tests/mcp/.venv}/bin/python}
export TOOLGATE_MCP_NODE_DIR=${TOOLGATE_MCP_NODE_DIR:-$PWD/tests/mcp}
cargo test --locked -p toolgate -p toolgate-alloc "$@"
