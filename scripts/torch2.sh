#!/usr/bin/env bash
# Makes build/venv-torch2: a virtual environment of the build's interpreter (the compiled
# module's ABI) with PyPI's current PyTorch 2.x and the test suite's packages, pinned in
# python/torch2-constraints.txt (CPU is enough: PyPI's CUDA wheels import and train without
# a GPU). Reused when it already has the pinned torch. Prints its interpreter's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv-torch2
want=$(sed -n 's/^torch==//p' python/torch2-constraints.txt)
if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$want" ]; then
  echo "torch2: $venv has torch $want" >&2
else
  base=$(bash scripts/python.sh --no-torch)
  start=$SECONDS
  echo "torch2: installing torch $want from PyPI into $venv (a few GB of wheels; about 2 minutes)" >&2
  rm -rf "$venv"
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -c python/torch2-constraints.txt \
    torch torchvision numpy scikit-learn pytest >&2
  echo "torch2: installed in $((SECONDS - start))s" >&2
fi
echo "$PWD/$venv/bin/python"
