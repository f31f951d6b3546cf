#!/usr/bin/env bash
# scripts/python.sh, the interpreter rule of the shell scripts: QS_PYTHON, else the build's
# (build/python-interpreter), else python3 on PATH or /usr/bin/python3, the first that
# imports torch; else one error naming each one tried. No real interpreter is looked at:
# PATH holds stub python3 scripts and the few tools the helper needs, QS_BUILD_DIR a
# temporary build tree, QS_SYSTEM_PYTHON stands for /usr/bin/python3.
set -u
helper="$(cd "$(dirname "$0")/.." && pwd)/scripts/python.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

bash_bin=$(type -P bash)
mkdir -p "$tmp/tools" "$tmp/torch" "$tmp/notorch" "$tmp/none" "$tmp/build" "$tmp/sys"
for t in dirname head sed tail cut; do ln -s "$(type -P $t)" "$tmp/tools/$t"; done
# stub FILE torch|notorch: an interpreter that imports torch or fails as Python does; each
# start is a line in $tmp/starts.
stub() {
  { echo "#!/bin/sh"
    echo "echo \"\$0\" >> '$tmp/starts'"
    if [ "$2" = torch ]; then echo "exit 0"; else
      echo "echo 'Traceback (most recent call last):' >&2"
      echo "echo \"ModuleNotFoundError: No module named 'torch'\" >&2"
      echo "exit 1"
    fi; } > "$1"
  chmod +x "$1"
}
stub "$tmp/torch/python3" torch
stub "$tmp/notorch/python3" notorch
stub "$tmp/sys/torch" torch
stub "$tmp/sys/notorch" notorch
stub "$tmp/build/python" torch

# choose PATH_DIR SYSTEM [--no-torch]: runs the helper in that world; stdout in $tmp/out,
# stderr in $tmp/err, status in rc; $tmp/starts emptied first.
choose() {
  : > "$tmp/starts"
  env -i PATH="$1:$tmp/tools" QS_BUILD_DIR="$tmp/build" QS_SYSTEM_PYTHON="$2" ${QS_PYTHON:+QS_PYTHON="$QS_PYTHON"} \
    "$bash_bin" "$helper" "${@:3}" > "$tmp/out" 2> "$tmp/err"
  rc=$?
}
expect() {  # WHAT CHOSEN STARTS
  if [ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$2" ] && [ "$(wc -l < "$tmp/starts")" -eq "$3" ]; then ok; else
    bad "$1: rc $rc, chose '$(cat "$tmp/out")' (want '$2') after $(wc -l < "$tmp/starts") starts (want $3): $(cat "$tmp/err")"
  fi
}

# QS_PYTHON is used as given, before anything else (nothing is started).
echo "$tmp/build/python" > "$tmp/build/python-interpreter"
QS_PYTHON="$tmp/mine" choose "$tmp/torch" "$tmp/sys/torch"
expect "QS_PYTHON" "$tmp/mine" 0
# The build's interpreter, without starting it.
choose "$tmp/torch" "$tmp/sys/torch"
expect "the build's" "$tmp/build/python" 0
# A recorded interpreter since removed: python3 on PATH, which imports torch.
echo "$tmp/gone/python3" > "$tmp/build/python-interpreter"
choose "$tmp/torch" "$tmp/sys/torch"
expect "python3 on PATH with torch" "$tmp/torch/python3" 1
# A python3 on PATH without torch is skipped for /usr/bin/python3.
choose "$tmp/notorch" "$tmp/sys/torch"
expect "python3 on PATH without torch" "$tmp/sys/torch" 2
# ... but not for standard-library code (--no-torch), which starts nothing.
choose "$tmp/notorch" "$tmp/sys/torch" --no-torch
expect "--no-torch" "$tmp/notorch/python3" 0
QS_PYTHON="$tmp/mine" choose "$tmp/notorch" "$tmp/sys/torch" --no-torch
expect "--no-torch, QS_PYTHON" "$tmp/mine" 0

# None imports torch: exit 1, one line naming each interpreter tried and why, and the remedy.
choose "$tmp/notorch" "$tmp/sys/notorch"
if [ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] \
   && grep -qF "no Python interpreter that imports torch (tried QS_PYTHON: not set; the build's ($tmp/gone/python3, from $tmp/build/python-interpreter): no such executable file; python3 on PATH ($tmp/notorch/python3): cannot import torch: ModuleNotFoundError: No module named 'torch'; $tmp/sys/notorch: cannot import torch: ModuleNotFoundError: No module named 'torch'): set QS_PYTHON" "$tmp/err" \
   && grep -qF "install torch" "$tmp/err"; then ok; else bad "none imports torch: rc $rc: $(cat "$tmp/err")"; fi
rm "$tmp/build/python-interpreter"
choose "$tmp/none" "$tmp/sys/absent"
if [ $rc -eq 1 ] && grep -qF "the build's: none recorded ($tmp/build/python-interpreter; built without QS_WITH_TORCH); python3 on PATH: none; $tmp/sys/absent: no such executable file)" "$tmp/err"
then ok; else bad "no interpreter at all: rc $rc: $(cat "$tmp/err")"; fi
choose "$tmp/none" "$tmp/sys/absent" --no-torch
if [ $rc -eq 1 ] && grep -qF "no Python interpreter (tried" "$tmp/err"; then ok; else bad "--no-torch, none: rc $rc: $(cat "$tmp/err")"; fi
# A fresh Debian: python3 on PATH is /usr/bin/python3, started once.
ln -s "$tmp/sys/notorch" "$tmp/none/python3"
choose "$tmp/none" "$tmp/sys/notorch"
if [ $rc -eq 1 ] && [ "$(wc -l < "$tmp/starts")" -eq 1 ] && grep -qF "$tmp/sys/notorch: the same as python3 on PATH" "$tmp/err"
then ok; else bad "the same file twice: rc $rc, $(wc -l < "$tmp/starts") starts: $(cat "$tmp/err")"; fi
# Anything but --no-torch is a usage error.
choose "$tmp/torch" "$tmp/sys/torch" --bogus
[ $rc -eq 2 ] && ok || bad "--bogus: rc $rc"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
