#!/usr/bin/env bash
# The runtime's own benchmarks, before and after a change, interleaved (issue 28's "done
# when"): ROUNDS rounds, each running every benchmark once with the BEFORE build and once
# with the AFTER build (which goes first alternates by round, so a drift of the machine's
# speed falls on both). Prints every round's figures and, per figure, both medians, their
# difference and the spread (max - min over the rounds, relative to the median) of each
# side: a change passes when the medians differ by at most max(spread, 3 %).
#
#   transport    bench/transport_bench throughput: one connection's Gbit/s / iperf3's, and
#                its CPU ns per KiB, at 64 KiB and 1 MiB frames (loopback)
#   aggregation  bench/aggregation_bench: add_floats GB/s / memcpy's, lockstep arrival
#   run          the README's main command, one policy at a time (quicksilver run --model
#                vgg16 --policy P): the measured iteration time, mercury and bytescheduler
#   gloo         bench/gloo_vs_torch.sh (root: two namespaces at 1 Gbit/s): torch / quicksilver
#   ddp          quicksilver run --workers 2 --script bench/pytorch_ddp.py (resnet18): the
#                mgwfbp / DDP and mercury / DDP samples/s ratios
#
# Usage (as root; BEFORE and AFTER are build directories, each with its quicksilver,
# bench/ and python/):
#   bash bench/before_after.sh BEFORE_BUILD AFTER_BUILD [ROUNDS=5] [BENCHES="transport aggregation run gloo ddp"]
set -euo pipefail
before=$(realpath "$1")
after=$(realpath "$2")
rounds=${3:-5}
benches=${4:-transport aggregation run gloo ddp}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python=$(QS_BUILD_DIR=$after bash "$here/scripts/python.sh")

record() {  # record SIDE NAME VALUE
  [ -n "$3" ] && echo "$1 $2 $3" >> "$out/figures"
  printf '  %-6s %-28s %s\n' "$1" "$2" "${3:-(none)}"
}

one() {  # one SIDE BUILD BENCH
  local side=$1 b=$2 bench=$3 log="$out/$1-$3.log"
  case $bench in
    transport)
      "$b/bench/transport_bench" throughput --reps=1 --seconds=1 > "$log" 2>&1
      for size in "64 KiB" "1 MiB"; do
        row=$(grep -F "| $size |" "$log" | head -1)
        record "$side" "transport ${size// /} /iperf3" "$(echo "$row" | awk -F'|' '{gsub(/ /,"",$5); print $5}')"
        record "$side" "transport ${size// /} CPU ns/KiB" "$(echo "$row" | awk -F'|' '{gsub(/ /,"",$7); print $7}')"
      done ;;
    aggregation)
      "$b/bench/aggregation_bench" --reps=3 > "$log" 2>&1
      record "$side" "aggregation add/memcpy" \
        "$(grep -F '| lockstep' "$log" | head -1 | awk -F'|' '{gsub(/ /,"",$7); print $7}')" ;;
    run)
      for p in mercury bytescheduler; do
        (cd "$b/.." && "$b/quicksilver" run --model vgg16 --policy "$p") > "$log" 2>&1
        record "$side" "run vgg16 $p ms" \
          "$(awk -v p="$p" '$1 == p { v = $2; sub(/ms$/, "", v); print v; exit }' "$log")"
      done ;;
    gloo)
      QS_BUILD_DIR=$b bash "$here/bench/gloo_vs_torch.sh" "$b/quicksilver" 16 1gbit 1 > "$log" 2>&1
      record "$side" "gloo torch/quicksilver" \
        "$(grep -oE 'median ratio torch/quicksilver [0-9.]+' "$log" | grep -oE '[0-9.]+$')" ;;
    ddp)
      (cd "$b/.." && "$b/quicksilver" run --workers 2 --script "$here/bench/pytorch_ddp.py" \
         --model resnet18 --policies mercury,mgwfbp --iterations 8) > "$log" 2>&1
      for p in mercury mgwfbp; do
        record "$side" "ddp resnet18 $p/DDP" \
          "$(awk -v p="$p" '$1 == p { for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9.]+x$/) { v = $i; sub(/x$/, "", v); print v; exit } }' "$log")"
      done ;;
  esac
}

echo "before_after: $rounds rounds of: $benches"
echo "before: $before"
echo "after:  $after"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  for bench in $benches; do
    if [ $((r % 2)) = 1 ]; then
      one before "$before" "$bench"; one after "$after" "$bench"
    else
      one after "$after" "$bench"; one before "$before" "$bench"
    fi
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$out/figures" <<'EOF'
import statistics
import sys
from collections import defaultdict

values = defaultdict(lambda: defaultdict(list))
order = []
for line in open(sys.argv[1]):
    side, rest = line.split(" ", 1)
    name, value = rest.rsplit(" ", 1)
    if name not in order:
        order.append(name)
    values[name][side].append(float(value))
print()
print("| figure | before median | after median | after/before | spread before | spread after | verdict |")
print("|---|---:|---:|---:|---:|---:|---|")
for name in order:
    b, a = values[name]["before"], values[name]["after"]
    if not b or not a:
        print(f"| {name} | {b} | {a} | | | | missing |")
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    sb = (max(b) - min(b)) / mb if mb else 0
    sa = (max(a) - min(a)) / ma if ma else 0
    diff = ma / mb - 1 if mb else 0
    ok = abs(diff) <= max(sb, sa, 0.03)
    print(f"| {name} | {mb:.3f} | {ma:.3f} | {ma / mb:.3f} | {100 * sb:.1f} % | {100 * sa:.1f} % | "
          f"{'within noise' if ok else 'MOVED'} |")
EOF
