#!/usr/bin/env bash
# End-to-end benchmark of the all-reduce runtime on gloo (issue 13, point 5): 4 workers,
# each in its own network namespace with tc-shaped links; every all-reduce policy on
# ResNet-101, VGG-19 and GPT-2 at two bandwidths, with one link and with DeFT's second
# link (MU = 2); each measurement beside the simulator's prediction (charged with the
# a + bM the runtime fitted at start-up) and the relative error, then DeFT's update
# frequency and its speedup over wfbp, measured and predicted.
# Needs root. Usage: bash bench/allreduce_e2e.sh [build/quicksilver] [ITERATIONS=5] > out.txt
#   MODELS="resnet101 vgg19 gpt2" BANDWIDTHS="10Gbps 25Gbps" narrow it down (~5 minutes per
#   model and bandwidth on this project's machine).
set -euo pipefail
qs=${1:-build/quicksilver}
iters=${2:-5}
python=$(QS_BUILD_DIR=${QS_BUILD_DIR:-$(dirname "$qs")} bash "$(dirname "$0")/../scripts/python.sh" --no-torch)
models=${MODELS:-resnet101 vgg19 gpt2}
bandwidths=${BANDWIDTHS:-10Gbps 25Gbps}
policies=wfbp,synceasgd,mgwfbp,mgwfbp-opt,ddp,bytescheduler,usbyte,deft
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for model in $models; do
  for bw in $bandwidths; do
    for link in one two; do
      extra=(); [ $link = two ] && extra=(--second-link 2)
      echo "### $model, $bw, $link link(s)"
      echo '```'
      "$qs" run --netns --architecture allreduce --model "$model" --policy "$policies" --workers 4 \
        --bandwidth "$bw" --iterations "$iters" --timeout 600s --keep-going "${extra[@]}" > "$tmp/out" 2>&1 || true
      grep -v "^  " "$tmp/out"
      grep -E "^  deft: (update frequency|link [01] all-reduce fit)" "$tmp/out" || true
      # DeFT against wfbp, measured and predicted (columns: iteration, predicted).
      "$python" - "$tmp/out" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"^(\S+)\s+([\d.]+)(ms|s)\s", line)
    if not m: continue
    cells = re.findall(r"([\d.]+)(ms|s)\b", line)
    def ms(v, u): return float(v) * (1000 if u == "s" else 1)
    if len(cells) >= 3: rows[m.group(1)] = (ms(*cells[0]), ms(*cells[2]))
if "deft" in rows and "wfbp" in rows:
    (dm, dp), (wm, wp) = rows["deft"], rows["wfbp"]
    print(f"deft speedup over wfbp: measured {wm/dm:.2f}x, predicted {wp/dp:.2f}x")
PY
      echo '```'
    done
  done
done
