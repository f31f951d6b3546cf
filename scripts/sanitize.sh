#!/usr/bin/env bash
# The test suite under sanitizers (issue 15, point 5):
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover=all: any
#         finding fails), every test of CTest (the random-case properties with a quarter
#         of their cases), built into ./build-asan (tests only);
#   tsan: ThreadSanitizer, the threaded transport and runtime tests (transport_test,
#         runtime_test, collective_test: event loops, posts across threads, clusters of
#         nodes on threads, gloo's link and control threads),
#         built into ./build-tsan.
# Usage: scripts/sanitize.sh [asan|tsan|all] [build|test [CTEST ARGS...]]   (default: all,
# both phases). "build" only builds the trees (CPU only: scripts/test.sh runs it in its
# background lane, beside the timing-sensitive stages); "test" only runs the tests, in trees
# already built, with CTEST ARGS given to the ASan run's ctest (scripts/test.sh: -LE quiet,
# then -L quiet with its background builds paused). Prints each runner's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
phase=${2:-both}
shift 2 2> /dev/null || shift $#
ctest_args=("$@")
[ ${#ctest_args[@]} = 0 ] || [ "$phase" = test ] || { echo "sanitize: ctest's arguments go with the test phase only" >&2; exit 2; }
case "$what" in asan | tsan | all) ;; *) echo "sanitize: no sanitizer '$what' (asan, tsan or all)" >&2; exit 2 ;; esac
case "$phase" in build | test | both) ;; *) echo "sanitize: no phase '$phase' (build, test, or none for both)" >&2; exit 2 ;; esac
building() { [ "$phase" != test ]; }
built() {  # built DIR: the test phase needs the tree its build phase made
  [ -f "$1/build.ninja" ] || { echo "sanitize: $1 is not built: scripts/sanitize.sh ${1#build-} build" >&2; exit 2; }
}
testing() { [ "$phase" != build ]; }
jobs=$(nproc)

features=()  # as scripts/build.sh: the all-reduce runtime when gloo is installed
[ -f /usr/share/cmake/Gloo/GlooConfig.cmake ] && features+=(-DQS_WITH_GLOO=ON)

# clang (scripts/setup.sh installs it for fuzzing): GCC 12's UBSan instrumentation of the
# template-heavy files is slow to compile (src/cli/output.cc: 99 s under ASan+UBSan against
# 27 s with clang 14; the whole ASan tree 1,200 CPU s against about 1,950). -O2 -g1 (line
# tables: file:line in every report) instead of RelWithDebInfo's -O2 -g, and no header
# checks (compile-only: the main build has them). -O1 builds faster still, but (with GCC)
# its slower binaries made link_fault_test's one-second outage of an all-reduce link fail
# once in six runs. A unity build (CMAKE_UNITY_BUILD: a target's sources compiled in
# batches of 8, each header parsed and its templates instantiated once a batch) halves the
# ASan tree: 574 CPU s against 1,150 (docs/ci.md has the measurements).
configure() {  # configure DIR FLAGS...
  local dir=$1 flags=$2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_COMPILER=clang++ -DQS_BUILD_BENCH=OFF -DQS_HEADER_CHECK=OFF \
    -DCMAKE_UNITY_BUILD=ON "${features[@]}" \
    -DCMAKE_CXX_FLAGS="-O2 -g1 $flags -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
}

if { [ "$what" = asan ] || [ "$what" = all ]; } && building; then
  configure build-asan "-fsanitize=address,undefined -fno-sanitize-recover=all"
  echo "sanitize: building the AddressSanitizer tree (build-asan; about 5 minutes on 2 slow cores)"
  cmake --build build-asan -j "$jobs" > build-asan/build.log 2>&1 || { tail -50 build-asan/build.log; exit 1; }
fi
if { [ "$what" = asan ] || [ "$what" = all ]; } && testing; then
  built build-asan
  echo "sanitize: AddressSanitizer + UndefinedBehaviorSanitizer, the whole suite"
  # A line per test as it ends (the run takes minutes: it shows progress), the failures'
  # output and the summary.
  # The random-case properties run a quarter of their cases (tests/ps_property_test.cc).
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     QS_PROPERTY_CASES_DIVISOR=4 ctest --output-on-failure --timeout 900 -j 2 "${ctest_args[@]}")
fi

tsan_tests=(transport_test runtime_test collective_test)
if { [ "$what" = tsan ] || [ "$what" = all ]; } && building; then
  configure build-tsan "-fsanitize=thread"
  echo "sanitize: building the ThreadSanitizer tests (build-tsan)"
  cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}" > build-tsan/build.log 2>&1 \
    || { tail -50 build-tsan/build.log; exit 1; }
fi
if { [ "$what" = tsan ] || [ "$what" = all ]; } && testing; then
  built build-tsan
  echo "sanitize: ThreadSanitizer, ${tsan_tests[*]} ($jobs at a time)"
  tsan_one() {  # tsan_one TEST: runs it, its exit status into build-tsan/TEST.rc
    local rc=0
    # halt_on_error: a race fails the run; setarch -R: TSan's shadow memory needs the
    # classic address layout on kernels with high mmap randomisation.
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 setarch "$(uname -m)" -R "build-tsan/tests/$1" --gtest_brief=1 \
      > "build-tsan/$1.log" 2>&1 || rc=$?
    echo $rc > "build-tsan/$1.rc"
  }
  for t in "${tsan_tests[@]}"; do rm -f "build-tsan/$t.rc"; done
  source scripts/parallel.sh
  run_at_most "$jobs" tsan_one "${tsan_tests[@]}"
  failed=0
  for t in "${tsan_tests[@]}"; do
    if [ "$(cat "build-tsan/$t.rc" 2> /dev/null || echo '?')" = 0 ]; then
      echo "sanitize: tsan: $t: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "build-tsan/$t.log" | tr '\n' ' ')"
    else
      tail -60 "build-tsan/$t.log"
      echo "sanitize: tsan: $t FAILED"
      failed=1
    fi
  done
  [ $failed = 0 ]
fi
