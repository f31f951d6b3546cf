#!/usr/bin/env bash
# Real CPU training on the emulated cluster (one network namespace per host, tc-shaped
# links, as root): bench/pytorch_ddp.py for every model x hosts x link rate, each run
# printing the limit, DDP first and last, and every policy's samples/s and ratios.
#
#   bash bench/pytorch_netns.sh [BIN]           # as root; BIN: build/quicksilver by default
#   MODELS="resnet18" HOSTS="2" RATES="1Gbps" POLICIES="mercury,deft" bash bench/pytorch_netns.sh
#
# Iterations per model (measured after warm-up) are chosen so that a run takes minutes:
# VGG-11 moves 515 MB of gradients per iteration, 31 s per iteration for 4 hosts at
# 200 Mbit/s. The whole matrix takes about an hour. Each run's output goes to stdout, prefixed
# by the configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/quicksilver}
MODELS=${MODELS:-"digits resnet18 vgg11"}
HOSTS=${HOSTS:-"2 4"}
RATES=${RATES:-"1Gbps 200Mbps"}
POLICIES=${POLICIES:-"mercury,bytescheduler,wfbp,mgwfbp,deft"}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
for model in $MODELS; do
  for n in $HOSTS; do
    for rate in $RATES; do
      # Enough measured iterations to span several of DeFT's merge cycles; fewer where an
      # iteration is long (VGG-11 at 200 Mbit/s: over 20 s for the synchronous modes).
      case $model:$rate in
        digits:*) its=40 warm=10 tail=2 ;;
        resnet18:*) its=8 warm=3 tail=2 ;;
        vgg11:200Mbps) its=3 warm=1 tail=1 ;;
        vgg11:*) its=6 warm=2 tail=2 ;;
        *) echo "unknown model $model" >&2; exit 2 ;;
      esac
      echo "=== $model, $n hosts at $rate ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
      "$BIN" run --netns --bandwidth "$rate" --workers "$n" --script bench/pytorch_ddp.py \
        --model "$model" --iterations "$its" --warmup "$warm" --tail "$tail" --policies "$POLICIES" 2>&1 \
        | grep -v '^quicksilver run: started' || echo "=== failed: $model $n $rate"
    done
  done
done
