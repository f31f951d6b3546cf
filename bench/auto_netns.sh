#!/usr/bin/env bash
# policy="auto" against every fixed policy of its architecture and DDP (issue 30, item 3a):
# real CPU training on the emulated cluster (as root), bench/pytorch_ddp.py per model x
# hosts x link rate, REPEATS rounds of the whole matrix (a cell's repeats are interleaved
# with the other cells'), then a table: per cell the median samples/s of the best fixed
# policy, of auto and of DDP over the rounds, auto's ratio to each, and the spread.
#
#   bash bench/auto_netns.sh [BIN]      # as root; BIN: build/quicksilver by default
#   MODELS=digits HOSTS=2 RATES=1Gbps REPEATS=2 bash bench/auto_netns.sh
#   ARCH=allreduce MODELS=digits bash bench/auto_netns.sh   # auto and the fixed policies on gloo
#
# The same measured window for every mode, in steady state: auto's warm-up is longer and
# covers its first decision and trial (it begins at pass 10; a trial of three candidates
# ends near pass 35, or near pass 150 on the digits CNN when every candidate's passes are
# too noisy to compare before TRIAL_MAX_PASSES), whose one-off cost bench/auto_bench.py and
# the decisions' log report.
# The raw runs go to bench-auto-netns.log (or $LOG).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/quicksilver}
MODELS=${MODELS:-"digits resnet18"}
HOSTS=${HOSTS:-"2 4"}
RATES=${RATES:-"1Gbps 200Mbps"}
REPEATS=${REPEATS:-3}
ARCH=${ARCH:-ps}
case $ARCH in
  ps) PS=${PS:-"mercury,mercury-nopreempt,bytescheduler,prophet,p3,tictac,wfbp"} ;;
  # The all-reduce policies, named POLICY:allreduce for bench/pytorch_ddp.py.
  allreduce) PS=${PS:-"wfbp,synceasgd,mgwfbp,ddp,bytescheduler"}
             PS=$(sed 's/\([^,]*\)/\1:allreduce/g' <<< "$PS") ;;
  *) echo "ARCH=$ARCH: give ps or allreduce" >&2; exit 2 ;;
esac
AUTO=auto$([ "$ARCH" = allreduce ] && echo :allreduce || true)
LOG=${LOG:-bench-auto-netns.log}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
: > "$LOG"
total=$(( REPEATS * $(wc -w <<< "$MODELS") * $(wc -w <<< "$HOSTS") * $(wc -w <<< "$RATES") ))
done_=0
for round in $(seq 1 "$REPEATS"); do
  for model in $MODELS; do
    for n in $HOSTS; do
      for rate in $RATES; do
        case $model in
          digits) its=200 warm=30 auto_warm=160 tail=2 ;;
          resnet18) its=8 warm=3 auto_warm=40 tail=2 ;;
          vgg11) its=4 warm=2 auto_warm=40 tail=1 ;;
          *) echo "unknown model $model" >&2; exit 2 ;;
        esac
        done_=$((done_ + 1))
        echo "auto_netns: [$done_/$total] round $round: $model, $n hosts at $rate ($(date -u +%H:%M:%S))" >&2
        { echo "=== round $round: $model, $n hosts at $rate"
          "$BIN" run --netns --bandwidth "$rate" --workers "$n" --script bench/pytorch_ddp.py \
            --model "$model" --iterations "$its" --warmup "$warm" --auto-warmup "$auto_warm" --tail "$tail" \
            --policies "$PS,$AUTO" 2>&1 \
            | grep -v '^quicksilver run: started' || echo "=== failed: $model $n $rate"
        } >> "$LOG"
      done
    done
  done
done
python3 - "$LOG" "$PS" "$AUTO" <<'PY'
import re, statistics, sys
log, fixed, auto_name = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
cells, cell = {}, None
for line in open(log):
    m = re.match(r"=== round (\d+): (\S+), (\d+) hosts at (\S+)", line)
    if m:
        cell = cells.setdefault(m.group(2, 3, 4), {})
        continue
    m = re.match(r"  (\S+(?: again)?)\s+([0-9.]+) samples/s", line)
    if m and cell is not None:
        cell.setdefault(m.group(1), []).append(float(m.group(2)))
    m = re.match(r".*quicksilver auto: pass (\d+): (.*)", line)
    if m and cell is not None and "switched to" in m.group(2):
        cell.setdefault("switches", []).append(m.group(2).rsplit("switched to ", 1)[1])
print("{:<9} {:>5} {:>7} | {:<18} {:>8} | {:>8} {:>6} | {:>8} | {:>9} {:>8} | auto switched to".format(
    "model", "hosts", "rate", "best fixed", "samp/s", "auto", "spread", "ddp", "auto/best", "auto/ddp"))
for (model, n, rate), c in cells.items():
    med = {k: statistics.median(v) for k, v in c.items() if k != "switches"}
    best = max((p for p in fixed if p in med), key=lambda p: med[p])
    ddp = statistics.median(c.get("ddp", []) + c.get("ddp again", [])) if "ddp" in c else float("nan")
    auto = med.get(auto_name, float("nan"))
    spread = (max(c[auto_name]) - min(c[auto_name])) / auto if auto_name in c else float("nan")
    print("{:<9} {:>5} {:>7} | {:<18} {:>8.2f} | {:>8.2f} {:>5.0%} | {:>8.2f} | {:>9.3f} {:>8.2f} | {}".format(
        model, n, rate, best, med[best], auto, spread, ddp, auto / med[best], auto / ddp,
        ", ".join(sorted(set(c.get("switches", [])))) or "none"))
PY
