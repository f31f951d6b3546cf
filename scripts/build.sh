#!/usr/bin/env bash
# Configures and builds everything (library layers, the quicksilver CLI, tests, benchmarks)
# into ./build, as a unity build. Extra arguments go to the CMake configure step (they come
# last, so -DCMAKE_UNITY_BUILD=OFF builds file by file).
# The PyTorch integration (QS_WITH_TORCH: the Python package in build/python) is turned on
# when an interpreter imports torch and pybind11's CMake files are there for it, unless an
# argument sets QS_WITH_TORCH itself. The interpreter, recorded in build/python-interpreter
# for everything that starts Python later (scripts/python.sh): QS_PYTHON when set, else
# python3 on PATH, else /usr/bin/python3 (Debian's python3-torch is seen by it only).
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache > /dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The all-reduce runtime needs gloo (libgloo-dev, installed by scripts/setup.sh).
features=()
[ -f /usr/share/cmake/Gloo/GlooConfig.cmake ] && features+=(-DQS_WITH_GLOO=ON)
# The PyTorch integration's interpreter: scripts/python.sh's rule without the build's step
# (this is where the build gets one), each candidate also needing pybind11's CMake files:
# its own pybind11 package's, else Debian's (pybind11-dev).
source scripts/python.sh
pybind11_dir() {  # PY: prints the pybind11 CMake directory for PY
  local d
  if d=$("$1" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2> /dev/null) \
      && [ -e "$d/pybind11Config.cmake" ]; then
    echo "$d"
  elif [ -e /usr/lib/cmake/pybind11/pybind11Config.cmake ]; then
    echo /usr/lib/cmake/pybind11
  else
    return 1
  fi
}
torch_python() {  # sets python and pybind11, or says on stderr why there is none
  local candidates=() tried=() c
  if [ -n "${QS_PYTHON:-}" ]; then
    candidates=("$QS_PYTHON")
  else
    c=$(type -P python3 || true)
    [ -n "$c" ] && candidates+=("$c")
    [ -n "$c" ] && [ "$c" -ef /usr/bin/python3 ] || candidates+=(/usr/bin/python3)
  fi
  for c in "${candidates[@]}"; do
    if ! qs_python_torch "$c"; then
      tried+=("$c: $qs_python_why")
    elif ! pybind11="$(pybind11_dir "$c")"; then
      tried+=("$c: no pybind11 CMake files (pip install pybind11, or Debian's pybind11-dev)")
    else
      python=$c
      return 0
    fi
  done
  echo "build: without the PyTorch integration (tried $(printf '%s; ' "${tried[@]}" | sed 's/; $//')): set" \
    "QS_PYTHON to an interpreter that imports torch, or install torch (scripts/setup.sh, as root)" >&2
  return 1
}
if [[ " $* " != *QS_WITH_TORCH* ]] && torch_python; then
  features+=(-DQS_WITH_TORCH=ON "-DPython3_EXECUTABLE=$python" "-Dpybind11_DIR=$pybind11")
fi
# A unity build (a target's sources compiled in batches of 8): 477 CPU s against 859 for a
# fresh build (docs/ci.md). An edit then rebuilds its whole batch: give
# -DCMAKE_UNITY_BUILD=OFF to build file by file. scripts/style.sh still parses each file alone.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON "${launcher[@]}" "${features[@]}" "$@" > build.log 2>&1 \
  || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)"
