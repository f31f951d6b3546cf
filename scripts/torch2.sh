#!/usr/bin/env bash
# Makes build/venv-torch2: a virtual environment of the build's interpreter (the compiled
# module's ABI) with PyPI's current PyTorch 2.x and the test suite's packages, pinned in
# python/torch2-constraints.txt (CPU is enough: PyPI's CUDA wheels import and train without
# a GPU). Reused when it already has the pinned torch. Prints its interpreter's path last.
# Exits 3, printing no path, when the disk is too full for the wheels (about 6 GiB installed):
# scripts/test.sh then reports the torch 2.x stage as skipped for want of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv-torch2
want=$(sed -n 's/^torch==//p' python/torch2-constraints.txt)
if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$want" ]; then
  echo "torch2: $venv has torch $want" >&2
else
  need_gib=7  # 5.7 GiB installed (torch 2.15 and its CUDA wheels), and the wheel being unpacked
  mkdir -p build
  free_gib=$(( $(df -Pk build | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
  if [ "$free_gib" -lt "$need_gib" ]; then
    echo "torch2: not installing torch $want: $free_gib GiB free on build/'s disk, and its CUDA" \
      "wheels need about $need_gib GiB. Free disk space and rerun, or set QS_TEST_TORCH2=0." >&2
    exit 3
  fi
  base=$(bash scripts/python.sh --no-torch)
  start=$SECONDS
  echo "torch2: installing torch $want from PyPI into $venv (a few GB of wheels; about 2 minutes)" >&2
  rm -rf "$venv"
  "$base" -m venv "$venv"
  # No wheel cache: it would hold another 3 GiB of wheels that are never used again.
  if ! "$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
    -c python/torch2-constraints.txt torch torchvision numpy scikit-learn pytest > build/torch2-pip.log 2>&1; then
    tail -20 build/torch2-pip.log >&2
    rm -rf "$venv"
    if grep -q 'No space left on device' build/torch2-pip.log; then
      echo "torch2: the disk filled while installing torch $want ($(df -Ph build | awk 'NR == 2 { print $4 }')" \
        "free after removing the partial venv). Free disk space and rerun, or set QS_TEST_TORCH2=0." >&2
      exit 3
    fi
    exit 1
  fi
  echo "torch2: installed in $((SECONDS - start))s" >&2
fi
echo "$PWD/$venv/bin/python"
