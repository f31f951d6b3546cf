#!/bin/bash
# p3 at 25 Gbit/s on the emulated cluster, with and without route quickack, interleaved
# (docs/simulator.md, "Prediction errors of the runtime"): does TCP's delayed
# acknowledgement explain p3's prediction error? As root.
# Usage: bash bench/p3_quickack.sh [build/quicksilver] [runs]
# Prints per run: model, setting, run, measured ms, predicted ms, error %, CPU idle, scale.
set -euo pipefail
qs=${1:-build/quicksilver}
runs=${2:-3}
for m in vgg16 resnet50 alexnet; do
  it=6; [ "$m" = alexnet ] && it=4
  for r in $(seq "$runs"); do
    for q in "" "--quickack"; do
      "$qs" run --netns --model "$m" --policy p3 --workers 4 --servers 4 --bandwidth 25Gbps \
          --iterations "$it" $q --json 2> /dev/null |
        python3 -c '
import json, sys
d = json.load(sys.stdin); r = d["results"][0]
print(sys.argv[1], sys.argv[2], sys.argv[3], round(r["iteration_ms"], 1), round(r["predicted_iteration_ms"], 1),
      round(100 * r["relative_error"], 1), round(r.get("cpu_idle", -1), 2), d["config"]["scale"])' "$m" "${q:-default}" "$r"
    done
  done
done
