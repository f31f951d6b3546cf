#!/usr/bin/env bash
# Runs the whole test suite, stage by stage, each printing its runner's summary and a line
# with its elapsed time ("test: STAGE took Ns"), then a table of the stages' times:
#   style            scripts/style.sh: clang-format, clang-tidy's chosen checks, type and
#                    function sizes (tools/spans.py)
#   ctest            CTest (GoogleTest, the command-line and multi-process tests)
#   pytest-system    the PyTorch tests (pytest) on the build's interpreter (Debian's torch)
#   torch2-install   a venv with PyPI's current torch 2.x (scripts/torch2.sh; reused), started
#                    beside style: its time here is the wait for it after style
#   pytest-torch2    the same PyTorch tests on it; reported as skipped, never silently, when
#                    the disk is too full for torch 2.x's wheels (scripts/torch2.sh exits 3)
#   contract         ../shared/tools/contract-check, when ../shared is beside the checkout
#   sanitizers       the C++ suite under ASan+UBSan and the threaded tests under TSan
#   fuzz             every libFuzzer target for QS_FUZZ_SECONDS (default 20) each
# QS_TEST_QUICK=1 skips the sanitizers and fuzzing; QS_TEST_TORCH2=0 skips torch 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."
names=(); times=(); skipped=()
stage() {  # stage NAME COMMAND...: runs it, prints and records its time
  local name=$1 start=$SECONDS
  shift
  echo "test: $name ..."
  "$@"
  names+=("$name"); times+=($((SECONDS - start)))
  echo "test: $name took $((SECONDS - start))s"
}
pytest_on() {  # pytest_on PYTHON [PYTEST ARGS]: the PyTorch tests, the summary naming torch's version
  local python=$1 version
  shift
  version=$("$python" -c 'import torch; print(torch.__version__)')
  echo "test: pytest on torch $version ($python)"
  # torch.compile's cache under build/, removed after: in /tmp it was 1.5 GiB left behind.
  rm -rf build/torchinductor
  TORCHINDUCTOR_CACHE_DIR="$PWD/build/torchinductor" QS_BUILD_DIR="$PWD/build" OMP_NUM_THREADS=1 \
    "$python" -m pytest -q -rs --durations=5 tests/python "$@"
  rm -rf build/torchinductor
  echo "test: pytest on torch $version passed"
}
total=$SECONDS
torch2=  # torch 2.x's venv install (pip on one core): beside the style stage, which has no
         # timing-sensitive test, and waited for before CTest's (13 s less on the slow
         # machine kind, where pip is mostly CPU; more where the download is slow)
if [ -d build/python/quicksilver ] && [ "${QS_TEST_TORCH2:-1}" != 0 ]; then
  echo "test: torch2-install started beside style (its log: build/torch2-install.log)"
  bash scripts/torch2.sh > build/torch2-python 2> build/torch2-install.log &
  torch2=$!
  # A stage that fails ends the run: the install (pip, its child) goes with it.
  trap '[ -z "$torch2" ] || { pkill -P "$torch2"; kill "$torch2"; } 2> /dev/null || true' EXIT
fi
torch2_wait() {  # the install's log and status; exit 3 (too little disk): skipped below
  local rc=0
  wait "$torch2" || rc=$?
  torch2=
  cat build/torch2-install.log
  if [ $rc = 3 ]; then : > build/torch2-python; else return $rc; fi
}
stage style bash scripts/style.sh
[ -n "$torch2" ] && stage torch2-install torch2_wait
stage ctest bash -c 'cd build && ctest --output-on-failure --timeout 600 -j 2 -E "^pytorch_test$"'
if [ -d build/python/quicksilver ]; then
  # The build's interpreter unless QS_PYTHON names another (scripts/python.sh).
  stage pytest-system pytest_on "$(bash scripts/python.sh)"
  if [ "${QS_TEST_TORCH2:-1}" != 0 ]; then
    if [ -s build/torch2-python ]; then
      # policy="auto"'s multi-process switch tests run on the build's torch only: the switch
      # is Python and the runtime's, the same on both (its planner tests run on both); and
      # one case of each runtime matrix (tests/python/conftest.py). CI's 30 minutes
      # (docs/ci.md).
      stage pytest-torch2 pytest_on "$(cat build/torch2-python)" \
        -k "not auto_switches and not rank_0s_threaded_decisions" --runtime-matrix-once
    else
      skipped+=("pytest-torch2: too little disk for torch 2.x's wheels (torch2-install above says how much)")
      echo "test: pytest-torch2 SKIPPED: ${skipped[-1]#*: }"
    fi
  fi
fi
if [ -x ../shared/tools/contract-check ]; then
  stage contract ../shared/tools/contract-check build/quicksilver
fi
if [ "${QS_TEST_QUICK:-0}" != 1 ]; then
  stage sanitizers bash scripts/sanitize.sh all
  stage fuzz bash scripts/fuzz.sh "${QS_FUZZ_SECONDS:-20}"
fi
echo "test: stage times"
for i in "${!names[@]}"; do
  printf 'test:   %-16s %5ds\n' "${names[$i]}" "${times[$i]}"
done
printf 'test:   %-16s %5ds\n' total $((SECONDS - total))
for s in "${skipped[@]}"; do
  echo "test:   skipped: $s"
done
echo "stages: ${#names[@]} passed, 0 failed, ${#skipped[@]} skipped"
