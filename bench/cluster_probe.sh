#!/usr/bin/env bash
# Why Mercury loses ResNet-50 at 8+8 hosts on the emulated cluster (issue 29, item 5e):
# on an H200 machine's 16 cores (CPU 85-93 % idle) it ran 146 ms against wfbp's 138 and
# ByteScheduler's 141, predicted 117 (-19.9 %), with 23 drops in the hosts' own queues,
# where 4+4 hosts ran as predicted (-2.7 %). Each round, interleaved: the hosts' count
# (4, 6, 8) under wfbp, bytescheduler, mercury-nopreempt and mercury; the hosts at higher
# rates; then at 8+8, Mercury's packet size (8 and 128 KiB against 32), its servers'
# completion order (--mercury-server-fifo), and a host queue of 40 ms against 20. Needs
# root, ip, tc, iperf3 and ss on PATH (bench/gpu_check.sh's stage e puts them there);
# prints one bench/cluster_table.py table per run, and keeps every run's JSON in DIR.
#
# PARTS (default hosts,knobs,rate): hosts = the hosts' count at scale 0.025; knobs = the
# 8+8 variations above; rate = 4+4 and 8+8 with the hosts at 500 Mbit/s and 1 Gbit/s
# (scale 0.05 and 0.1: what a machine with cores to spare can emulate).
#
#   bash bench/cluster_probe.sh build/quicksilver DIR [ROUNDS] [PARTS]
set -uo pipefail
qs=${1:-build/quicksilver}
dir=${2:-build/cluster-probe}
rounds=${3:-2}
parts=,${4:-hosts,knobs,rate},
here=$(dirname "$0")
mkdir -p "$dir"
common=(--netns --json --model resnet50 --bandwidth 10Gbps --iterations 8 --timeout 120s --keep-going)
rc=0
one() {  # one NAME ARGS...
  local name=$1
  shift
  echo "-- $name: run ${*}"
  "$qs" run "${common[@]}" "$@" > "$dir/$name.json" 2> "$dir/$name.err" || { rc=1; tail -3 "$dir/$name.err"; }
  python3 "$here/cluster_table.py" "$dir/$name.json" || rc=1
}
# The automatic scale on this machine (every link loaded at once with iperf3), once.
one calibrated-8 --workers 8 --servers 8 --policy wfbp,mercury
for r in $(seq "$rounds"); do
  if [[ $parts == *,hosts,* ]]; then
    for n in 4 6 8; do
      one "r$r-hosts-$n" --workers "$n" --servers "$n" --scale 0.025 --policy wfbp,bytescheduler,mercury-nopreempt,mercury
    done
  fi
  if [[ $parts == *,rate,* ]]; then
    for scale in 0.05 0.1; do
      for n in 4 8; do
        one "r$r-rate-$n-$scale" --workers "$n" --servers "$n" --scale "$scale" --policy wfbp,bytescheduler,mercury
      done
    done
  fi
  [[ $parts == *,knobs,* ]] || continue
  one "r$r-8-packet-8KiB" --workers 8 --servers 8 --scale 0.025 --policy mercury --packet-size 8KiB
  one "r$r-8-packet-128KiB" --workers 8 --servers 8 --scale 0.025 --policy mercury --packet-size 128KiB
  one "r$r-8-server-fifo" --workers 8 --servers 8 --scale 0.025 --policy mercury --mercury-server-fifo
  one "r$r-8-host-queue-40ms" --workers 8 --servers 8 --scale 0.025 --policy wfbp,mercury --host-queue 40ms
done
exit $rc
