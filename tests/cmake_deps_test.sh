#!/usr/bin/env bash
# A machine without some C++ dependency is told each missing one and the Debian/Ubuntu
# package that provides it, at once (what `pip install .` meets first): configure with
# two of them hidden from CMake and check the message. Usage: cmake_deps_test.sh SOURCE_DIR
set -u
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$(cmake -S "$src" -B "$dir" -DQS_WITH_GLOO=ON -DQS_BUILD_BENCH=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON 2>&1)
rc=$?
pass=0; fail=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1; shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $what"; fi
}
check "configure fails" test $rc -ne 0
check "names CLI11 and its package" grep -q "CLI11 (libcli11-dev)" <<< "$out"
check "names gloo and its package" grep -q "gloo (the all-reduce runtime) (libgloo-dev)" <<< "$out"
check "gives the install command" grep -q "apt-get install -y libcli11-dev libgloo-dev" <<< "$out"
[ $fail -eq 0 ] || echo "$out" | tail -20
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
