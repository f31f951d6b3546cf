#!/usr/bin/env bash
# Configures and builds everything (library layers, the quicksilver CLI, tests, benchmarks)
# into ./build. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache > /dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The all-reduce runtime needs gloo (libgloo-dev, installed by scripts/setup.sh).
features=()
[ -f /usr/share/cmake/Gloo/GlooConfig.cmake ] && features+=(-DQS_WITH_GLOO=ON)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${features[@]}" "$@" > build.log 2>&1 \
  || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)"
