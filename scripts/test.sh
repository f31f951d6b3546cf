#!/usr/bin/env bash
# Runs the whole test suite, stage by stage, each printing its runner's summary and a line
# with its elapsed time ("test: STAGE took Ns"), then a table of the stages' times:
#   ctest            CTest (GoogleTest, the command-line and multi-process tests), but for
#                    the emulated clusters' tests (label "quiet")
#   pytest-system    the PyTorch tests (pytest) on the build's interpreter (Debian's torch)
#   torch2-install   a venv with PyPI's current torch 2.x (scripts/torch2.sh; reused), started
#                    in the background at the start: its time here is the wait for it
#   ctest-quiet      the emulated clusters' tests, with the background lane below paused
#   pytest-torch2    the same PyTorch tests on it; reported as skipped, never silently, when
#                    the disk is too full for torch 2.x's wheels (scripts/torch2.sh exits 3)
#   contract         ../shared/tools/contract-check, when ../shared is beside the checkout
#   sanitizers       the C++ suite under ASan+UBSan and the threaded tests under TSan
#   fuzz             every libFuzzer target for QS_FUZZ_SECONDS (default 20) each
#   style            scripts/style.sh: clang-format, clang-tidy's chosen checks, type and
#                    function sizes (tools/spans.py)
# The work that only needs the CPU and is not sensitive to timing (building the ASan, TSan
# and fuzz trees, and the style checks) runs in a background lane from the start, at the
# idle scheduling class (chrt --idle: it gets only the CPU time the tests leave unused, and a
# test that wakes takes its core back at once), one step after another, each step's output
# in build/lane/. The stages that need a step wait for it (printing its progress) and print
# its output; the table gives each step's time as "(background)" rows.
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
# Background jobs: each in a process group of its own, so that a stage that fails ends the
# run and takes each job's whole tree (pip; cmake, ninja and the compilers) with it. Not in a
# session of its own (setsid): where the kernel groups processes by session (autogroup,
# /proc/sys/kernel/sched_autogroup_enabled), a new session gets a share of the CPU equal to
# the tests', whatever its class. That way the ctest and pytest stages ran 40 % slower.
idle=(chrt --idle 0)
"${idle[@]}" true 2> /dev/null || idle=(nice -n 19)
background=()
spawn() {  # spawn OUT ERR COMMAND...: in the background, idle class, its own process group; pid in $!
  local out=$1 err=$2
  shift 2
  set -m  # job control: the job gets its own process group
  "${idle[@]}" "$@" > "$out" 2> "$err" < /dev/null &
  set +m
  background+=("$!")
}
# (CONT: a paused group, below, takes its TERM only once it runs again.)
# (|| true: set -e holds in the trap too, and a group that has ended is not an error.)
trap 'for p in "${background[@]}"; do { kill -- "-$p"; kill -CONT -- "-$p"; } 2> /dev/null || true; done' EXIT
torch2= with_torch2=0
if [ -d build/python/quicksilver ] && [ "${QS_TEST_TORCH2:-1}" != 0 ]; then
  echo "test: torch2-install started in the background (its log: build/torch2-install.log)"
  spawn build/torch2-python build/torch2-install.log bash scripts/torch2.sh
  torch2=$! with_torch2=1
fi
torch2_wait() {  # the install's log and status; exit 3 (too little disk): skipped below
  local rc=0
  wait "$torch2" || rc=$?
  torch2=
  cat build/torch2-install.log
  if [ $rc = 3 ]; then : > build/torch2-python; else return $rc; fi
}

# The background lane: NAME=COMMAND steps, in turn.
lane_steps=()
if [ "${QS_TEST_QUICK:-0}" != 1 ]; then
  lane_steps+=("asan-build=bash scripts/sanitize.sh asan build" "tsan-build=bash scripts/sanitize.sh tsan build"
               "fuzz-build=bash scripts/fuzz.sh build")
fi
lane_steps+=("style=bash scripts/style.sh")
lane_run() {  # lane_run STEP...: each step's output, time and status into build/lane/NAME.{log,s,rc}
  local step name start rc
  for step in "$@"; do
    name=${step%%=*} start=$SECONDS rc=0
    bash -c "${step#*=}" > "build/lane/$name.log" 2>&1 || rc=$?
    echo $((SECONDS - start)) > "build/lane/$name.s"
    echo $rc > "build/lane/$name.rc.new" && mv "build/lane/$name.rc.new" "build/lane/$name.rc"
  done
}
export -f lane_run
rm -rf build/lane && mkdir -p build/lane
echo "test: background lane started: ${lane_steps[*]%%=*} (logs: build/lane/)"
spawn build/lane/lane.out build/lane/lane.err bash -c 'lane_run "$@"' lane "${lane_steps[@]}"
lane=$!
lane_progress() {  # lane_progress NAME: the last line of the step's build log (ninja's [N/M])
  local log=build/lane/$1.log
  case $1 in asan-build) log=build-asan/build.log ;; tsan-build) log=build-tsan/build.log ;;
    fuzz-build) log=build-fuzz/build.log ;; esac
  tail -n 1 "$log" 2> /dev/null | cut -c 1-110 || true
}
lane_wait() {  # lane_wait NAME: waits for the step, printing its progress every 30 s, then its output; its status
  local name=$1 waited=0
  while [ ! -f "build/lane/$name.rc" ]; do
    if ! kill -0 "$lane" 2> /dev/null; then
      echo "test: the background lane ended without running $name"
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 30)) = 0 ]; then echo "test: waiting ${waited}s for $name: $(lane_progress "$name")"; fi
  done
  cat "build/lane/$name.log"
  echo "test: $name (background) took $(cat "build/lane/$name.s")s, ${waited}s of them waited for here"
  return "$(cat "build/lane/$name.rc")"
}

# The emulated clusters' tests (CTest label "quiet") time their runs against the simulator
# and check that the machine has idle CPU: the lane is paused (SIGSTOP to its process group)
# while they run, and they run after torch 2.x's install (which is not paused: a download
# stopped for minutes could fail).
lane_pause() { kill -STOP -- "-$lane" 2> /dev/null || true; }
lane_resume() { kill -CONT -- "-$lane" 2> /dev/null || true; }
quiet() {  # quiet COMMAND...: runs it with the background lane paused
  local rc=0
  lane_pause
  echo "test: background lane paused"
  "$@" || rc=$?
  lane_resume
  echo "test: background lane resumed"
  return $rc
}
ctest_run() { (cd build && ctest --output-on-failure --timeout 600 -j 2 -E "^pytorch_test$" "$@"); }
stage ctest ctest_run -LE quiet
if [ -d build/python/quicksilver ]; then
  # The build's interpreter unless QS_PYTHON names another (scripts/python.sh).
  stage pytest-system pytest_on "$(bash scripts/python.sh)"
fi
if [ $with_torch2 = 1 ]; then stage torch2-install torch2_wait; fi
stage ctest-quiet quiet ctest_run -L quiet
if [ $with_torch2 = 1 ]; then
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
if [ -x ../shared/tools/contract-check ]; then
  stage contract ../shared/tools/contract-check build/quicksilver
fi
sanitizers() {  # the ASan tests while the lane builds the TSan tree, then the TSan tests
  lane_wait asan-build
  bash scripts/sanitize.sh asan test -LE quiet
  quiet bash scripts/sanitize.sh asan test -L quiet
  lane_wait tsan-build
  bash scripts/sanitize.sh tsan test
}
fuzz() {
  lane_wait fuzz-build
  bash scripts/fuzz.sh "${QS_FUZZ_SECONDS:-20}"
}
if [ "${QS_TEST_QUICK:-0}" != 1 ]; then
  stage sanitizers sanitizers
  stage fuzz fuzz
fi
stage style lane_wait style
echo "test: stage times"
for i in "${!names[@]}"; do
  printf 'test:   %-16s %5ds\n' "${names[$i]}" "${times[$i]}"
done
for step in "${lane_steps[@]}"; do
  printf 'test:   %-16s %5ds (background)\n' "${step%%=*}" "$(cat "build/lane/${step%%=*}.s")"
done
printf 'test:   %-16s %5ds\n' total $((SECONDS - total))
for s in "${skipped[@]}"; do
  echo "test:   skipped: $s"
done
echo "stages: ${#names[@]} passed, 0 failed, ${#skipped[@]} skipped"
