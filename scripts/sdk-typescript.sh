#!/usr/bin/env bash
# The TypeScript SDK's checks (clients/typescript), as CI runs them: `npm ci` from the committed
# lockfile, the type check (strict, sources and tests), biome, and the tests (node --test)
# against the real sidecar (the debug build; TOOLGATE_BIN and FAKE_TOOL_BIN name others).
#
#   scripts/sdk-typescript.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/install-deps.sh test
export TOOLGATE_BIN=${TOOLGATE_BIN:-$ROOT/target/debug/toolgate}
export FAKE_TOOL_BIN=${FAKE_TOOL_BIN:-$ROOT/target/debug/examples/fake_tool}
cd clients/typescript
npm ci --no-audit --no-fund
npm run typecheck
npm run lint
npm run build
npm test
echo "sdk-typescript: passed" >&2
