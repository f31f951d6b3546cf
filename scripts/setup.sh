#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12's packages (run as root).
# Skips apt-get entirely when everything is already installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libsodium-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pytest python3-numpy python3-matplotlib
  iproute2 iperf3
  clang libclang-rt-14-dev
  # The style gates (scripts/style.sh).
  clang-format clang-tidy universal-ctags
  libgloo-dev
  # The PyTorch integration (quicksilver.torch; docs/pytorch.md) and its tests.
  python3-torch libtorch-dev pybind11-dev python3-dev python3-sklearn python3-torchvision
  # CI's second PyTorch: PyPI's current torch in a venv (scripts/torch2.sh).
  python3-venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
  apt-get clean  # the downloaded .debs: a GiB or more that CI's disk needs for torch 2.x
fi
echo "setup: dependencies present"
