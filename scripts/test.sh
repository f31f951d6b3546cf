#!/usr/bin/env bash
# Runs the whole test suite: CTest (GoogleTest + CLI tests), the PyTorch tests (pytest, when
# the build has the integration: its summary printed), then the shared contract
# check when ../shared is beside the checkout (CI has it; a user's clone may not), then
# (unless QS_TEST_QUICK=1) the sanitizer builds (scripts/sanitize.sh) and every fuzz
# target for QS_FUZZ_SECONDS (default 30) each (scripts/fuzz.sh). Each step prints its
# runner's summary and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
(cd build && ctest --output-on-failure --timeout 600 -j 2 -E '^pytorch_test$')
if [ -d build/python/quicksilver ]; then
  start=$SECONDS
  # The build's interpreter unless QS_PYTHON names another (scripts/python.sh).
  python=$(bash scripts/python.sh)
  QS_BUILD_DIR="$PWD/build" OMP_NUM_THREADS=1 "$python" -m pytest -q -rs tests/python
  echo "test: pytest took $((SECONDS - start))s"
fi
if [ -x ../shared/tools/contract-check ]; then
  ../shared/tools/contract-check build/quicksilver
fi
if [ "${QS_TEST_QUICK:-0}" != 1 ]; then
  start=$SECONDS
  bash scripts/sanitize.sh all
  echo "test: sanitizers took $((SECONDS - start))s"
  start=$SECONDS
  bash scripts/fuzz.sh "${QS_FUZZ_SECONDS:-30}"
  echo "test: fuzzing took $((SECONDS - start))s"
fi
