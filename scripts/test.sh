#!/usr/bin/env bash
# Runs the whole test suite: CTest (GoogleTest + CLI tests), then the shared contract
# check when ../shared is beside the checkout (CI has it; a user's clone may not).
set -euo pipefail
cd "$(dirname "$0")/.."
(cd build && ctest --output-on-failure --timeout 600 -j 2)
if [ -x ../shared/tools/contract-check ]; then
  ../shared/tools/contract-check build/quicksilver
fi
