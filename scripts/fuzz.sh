#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan) into ./build-fuzz and runs each
# for SECONDS (default 30) from its committed seed corpus (fuzz/corpus/<target>/; new
# inputs go to build-fuzz/corpus/<target>/, the repository stays clean). Prints the
# executions of each target and "N passed, N failed"; fails when any target crashed,
# leaked, timed out or ran out of memory (the input is kept in build-fuzz/artifacts/).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#        scripts/fuzz.sh build   (builds only: scripts/test.sh's background lane)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build_only=0
if [ "$seconds" = build ]; then build_only=1; fi
if ! [[ $seconds =~ ^([1-9][0-9]*|build)$ ]]; then
  echo "fuzz: SECONDS must be a positive whole number or 'build', not '$seconds'" >&2
  exit 2
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire_fuzz connection_fuzz rendezvous_fuzz profile_fuzz bandwidth_trace_fuzz)
mkdir -p build-fuzz
# RelWithDebInfo's -O2 -DNDEBUG with line tables only (-g1: file:line in every report, 12 %
# less compile time than -g), as a unity build (scripts/sanitize.sh says why).
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_UNITY_BUILD=ON -DQS_FUZZ=ON -DQS_BUILD_TESTS=OFF -DQS_BUILD_BENCH=OFF > build-fuzz/configure.log 2>&1 \
  || { cat build-fuzz/configure.log; exit 1; }
cmake --build build-fuzz -j "$(nproc)" --target qs_fuzzers > build-fuzz/build.log 2>&1 \
  || { tail -50 build-fuzz/build.log; exit 1; }
if [ $build_only = 1 ]; then exit 0; fi
mkdir -p build-fuzz/artifacts
# Each target is one process on one core: as many at once as there are cores (the report
# below keeps the targets' order).
fuzz_one() {  # fuzz_one TARGET: runs it, its exit status into build-fuzz/TARGET.rc
  local t=$1 rc=0
  mkdir -p "build-fuzz/corpus/$t"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/fuzz/$t" "build-fuzz/corpus/$t" "fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" > "build-fuzz/$t.log" 2>&1 \
    || rc=$?
  echo $rc > "build-fuzz/$t.rc"
}
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, $(nproc) at a time"
for t in "${targets[@]}"; do rm -f "build-fuzz/$t.rc"; done
source scripts/parallel.sh
run_at_most "$(nproc)" fuzz_one "${targets[@]}"
pass=0; fail=0
for t in "${targets[@]}"; do
  log=build-fuzz/$t.log
  rc=$(cat "build-fuzz/$t.rc" 2> /dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    echo "fuzz: $t: ${execs:-?} executions in ${seconds}s, ${cov:-cov: ?}, no crash"
  else
    fail=$((fail + 1))
    echo "fuzz: $t: FAILED (exit $rc) after ${execs:-?} executions; artifacts in build-fuzz/artifacts/"
    grep -E "ERROR|SUMMARY|runtime error|check failed|Test unit written" "$log" | head -8 | sed 's/^/  /'
  fi
done
echo "fuzz: $pass passed, $fail failed"
[ $fail -eq 0 ]
