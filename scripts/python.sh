#!/usr/bin/env bash
# Prints the Python interpreter that quicksilver's scripts start, by the rule the
# quicksilver binary follows too (include/launch/quicksilver/launch/python.h, docs/cli.md):
#   1. $QS_PYTHON, when set (used as given; the scripts' --python);
#   2. the interpreter the build was made for: the path CMake writes (with QS_WITH_TORCH)
#      into $QS_BUILD_DIR/python-interpreter (default build/), when it is an executable file;
#   3. python3 on PATH, when it imports torch;
#   4. /usr/bin/python3, when it imports torch.
# When none fits, one line on stderr names each interpreter tried and why it was rejected,
# and the remedy; exit status 1.
#
#   py=$(bash scripts/python.sh)              # code that needs torch
#   py=$(bash scripts/python.sh --no-torch)   # standard-library code: the same order, the
#                                             # first that is an executable file
#   source scripts/python.sh                  # defines the functions only (scripts/build.sh)
#
# QS_SYSTEM_PYTHON replaces /usr/bin/python3 in step 4 (a test aid: tests/python_sh_test.sh).

qs_python_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

qs_python_executable() {  # PATH: an executable regular file?
  [ -n "$1" ] && [ -f "$1" ] && [ -x "$1" ]
}

# qs_python_torch PY: status 0 when PY imports torch; else qs_python_why says why not (the
# last line of its error, as Python prints it).
qs_python_torch() {
  local err last
  if ! qs_python_executable "$1"; then
    qs_python_why="no such executable file"
    return 1
  fi
  if err=$("$1" -c 'import torch' 2>&1 > /dev/null < /dev/null); then
    return 0
  else
    local rc=$?
    last=$(printf '%s\n' "$err" | sed '/^[[:space:]]*$/d' | tail -n 1 | cut -c1-200)
    qs_python_why="cannot import torch: ${last:-exit status $rc}"
    return 1
  fi
}

# qs_python_choose [--no-torch]: prints the chosen interpreter, or the error on stderr and
# status 1.
qs_python_choose() {
  local torch=1
  [ "${1:-}" = --no-torch ] && torch=0
  if [ -n "${QS_PYTHON:-}" ]; then
    printf '%s\n' "$QS_PYTHON"
    return 0
  fi
  local tried=("QS_PYTHON: not set")
  local record="${QS_BUILD_DIR:-$qs_python_root/build}/python-interpreter" built=""
  [ -f "$record" ] && built=$(head -n 1 "$record")
  if [ -z "$built" ]; then
    tried+=("the build's: none recorded ($record; built without QS_WITH_TORCH)")
  elif qs_python_executable "$built"; then
    printf '%s\n' "$built"
    return 0
  else
    tried+=("the build's ($built, from $record): no such executable file")
  fi
  local on_path system=${QS_SYSTEM_PYTHON:-/usr/bin/python3} rejected=""
  on_path=$(type -P python3 || true)
  if [ -z "$on_path" ]; then
    tried+=("python3 on PATH: none")
  elif [ $torch = 0 ]; then
    printf '%s\n' "$on_path"
    return 0
  elif qs_python_torch "$on_path"; then
    printf '%s\n' "$on_path"
    return 0
  else
    tried+=("python3 on PATH ($on_path): $qs_python_why")
    rejected=$on_path
  fi
  if [ -n "$rejected" ] && [ "$rejected" -ef "$system" ]; then
    tried+=("$system: the same as python3 on PATH")
  elif [ $torch = 0 ] && qs_python_executable "$system"; then
    printf '%s\n' "$system"
    return 0
  elif [ $torch = 0 ]; then
    tried+=("$system: no such executable file")
  elif qs_python_torch "$system"; then
    printf '%s\n' "$system"
    return 0
  else
    tried+=("$system: $qs_python_why")
  fi
  local list
  list=$(printf '; %s' "${tried[@]}")
  if [ $torch = 1 ]; then
    echo "scripts/python.sh: no Python interpreter that imports torch (tried ${list:2}): set QS_PYTHON to" \
      "an interpreter that imports torch, or install torch (Debian 12: scripts/setup.sh, as root, installs" \
      "python3-torch for /usr/bin/python3)" >&2
  else
    echo "scripts/python.sh: no Python interpreter (tried ${list:2}): set QS_PYTHON to one, or install" \
      "python3 (Debian 12: scripts/setup.sh, as root)" >&2
  fi
  return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  case "${1:-}" in
    "" | --no-torch) qs_python_choose "$@" ;;
    *) echo "usage: bash scripts/python.sh [--no-torch]" >&2; exit 2 ;;
  esac
fi
