#!/usr/bin/env bash
# Configures and builds everything (library layers, the quicksilver CLI, tests, benchmarks)
# into ./build. Extra arguments go to the CMake configure step.
# The PyTorch integration (QS_WITH_TORCH: the Python package in build/python) is turned on
# when Debian's python3 imports torch and pybind11's CMake files are installed, unless an
# argument sets QS_WITH_TORCH itself.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache > /dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The all-reduce runtime needs gloo (libgloo-dev, installed by scripts/setup.sh).
features=()
[ -f /usr/share/cmake/Gloo/GlooConfig.cmake ] && features+=(-DQS_WITH_GLOO=ON)
# The PyTorch integration needs Debian's torch, seen by /usr/bin/python3 only.
if [[ " $* " != *QS_WITH_TORCH* ]] && [ -x /usr/bin/python3 ] \
    && /usr/bin/python3 -c 'import torch' > /dev/null 2>&1 \
    && [ -e /usr/lib/cmake/pybind11/pybind11Config.cmake ]; then
  features+=(-DQS_WITH_TORCH=ON -DPython3_EXECUTABLE=/usr/bin/python3)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${features[@]}" "$@" > build.log 2>&1 \
  || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)"
