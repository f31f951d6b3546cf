#!/usr/bin/env bash
# End-to-end benchmark of the PS runtime on the emulated cluster (issue 5, point 7):
# 4 workers and 4 servers, each in its own network namespace with tc-shaped links; every
# PS policy on VGG-16, ResNet-50 and AlexNet at two bandwidths and in one dynamic
# scenario; each measurement beside the simulator's prediction and the relative error.
# Bandwidths and tensor sizes are scaled down together (printed in each table's title).
# Needs root. Usage: bash bench/e2e.sh [build/quicksilver] > out.txt   (~10-15 minutes)
set -euo pipefail
qs=${1:-build/quicksilver}
policies=wfbp,p3,tictac,bytescheduler,prophet,mercury-nopreempt,mercury
for model in vgg16 resnet50 alexnet; do
  iters=6; [ "$model" = alexnet ] && iters=4
  for bw in 10Gbps 25Gbps; do
    echo "### $model, $bw"
    echo '```'
    "$qs" run --netns --model "$model" --policy "$policies" --workers 4 --servers 4 --bandwidth "$bw" \
      --iterations $iters --timeout 300s --keep-going 2>&1 | grep -v "^  "
    echo '```'
  done
done
# Under a changing rate the iterations fall into different rate segments, so their
# median is whichever segment holds the middle one; the mean is the run's throughput.
echo "### resnet50, dynamic: random 1-10 Gbps every 500 ms (mean iteration)"
echo '```'
"$qs" run --netns --model resnet50 --policy "$policies" --workers 4 --servers 4 --bandwidth 10Gbps \
  --bandwidth-trace random:1Gbps:10Gbps:500ms:7 --iterations 16 --statistic mean --timeout 300s --keep-going 2>&1 | grep -v "^  "
echo '```'
