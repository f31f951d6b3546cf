#!/usr/bin/env bash
# policy="auto" under a link rate that moves (issue 30, item 3b): the emulated cluster (as
# root) with a bandwidth trace alternating SLOW and FAST every PERIOD seconds; one `quicksilver
# run --netns --bandwidth-trace` per mode (each sees the trace from its processes' start),
# ROUNDS rounds with the modes interleaved, bench/auto_trace.py measuring samples/s over the
# same stretch of the trace for every mode; then the median per mode and auto's ratio to the
# best fixed policy.
#
#   bash bench/auto_trace.sh [BIN]
#   MODEL=resnet18 HOSTS=2 SLOW=200Mbps FAST=10Gbps PERIOD=15 SECONDS_=75 FROM=15 ROUNDS=2 \
#     MODES="ddp mgwfbp:allreduce ... auto:allreduce" REPLAN=10 bash bench/auto_trace.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/quicksilver}
MODEL=${MODEL:-resnet18}
HOSTS=${HOSTS:-2}
SLOW=${SLOW:-200Mbps}
FAST=${FAST:-10Gbps}
PERIOD=${PERIOD:-15}
SECONDS_=${SECONDS_:-75}
FROM=${FROM:-15}
ROUNDS=${ROUNDS:-2}
REPLAN=${REPLAN:-10}
ARCH=${ARCH:-allreduce}
if [ "$ARCH" = ps ]; then
  MODES=${MODES:-"mercury bytescheduler prophet wfbp auto"}
else
  MODES=${MODES:-"ddp:allreduce mgwfbp:allreduce bytescheduler:allreduce usbyte:allreduce wfbp:allreduce auto:allreduce"}
fi
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
trace=$(mktemp); out=$(mktemp); trap 'rm -f "$trace" "$out"' EXIT
python3 -c "
t, lines = 0, []
while t < $SECONDS_ + 60:
    lines.append('{}s {}'.format(t, '$SLOW' if (t // $PERIOD) % 2 == 0 else '$FAST'))
    t += $PERIOD
print('\n'.join(lines))" > "$trace"
echo "auto_trace: $MODEL, $HOSTS hosts, $SLOW and $FAST alternating every ${PERIOD}s; samples/s from ${FROM}s to ${SECONDS_}s; $ROUNDS rounds" >&2
for round in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    echo "auto_trace: round $round: $mode ($(date -u +%H:%M:%S))" >&2
    "$BIN" run --netns --workers "$HOSTS" --bandwidth-trace "$trace" --script bench/auto_trace.py \
      --model "$MODEL" --mode "$mode" --seconds "$SECONDS_" --from "$FROM" --replan-every "$REPLAN" 2>&1 \
      | grep -v '^quicksilver run: started' | tee -a "$out" | grep -E "^(quicksilver auto|$mode )" >&2 || true
  done
done
python3 - "$out" "$MODES" <<'PY'
import statistics, sys
lines = open(sys.argv[1]).read().split("\n")
modes = sys.argv[2].split()
got = {m: [] for m in modes}
for line in lines:
    parts = line.split()
    if len(parts) == 3 and parts[0] in got:
        got[parts[0]].append(float(parts[1]))
print("{:<24} {:>10} {:>8} {:>8}".format("mode", "samples/s", "spread", "rounds"))
for m in modes:
    v = got[m]
    if v:
        med = statistics.median(v)
        print("{:<24} {:>10.1f} {:>7.0%} {:>8}".format(m, med, (max(v) - min(v)) / med, len(v)))
auto = [m for m in modes if m.startswith("auto")]
fixed = [m for m in modes if not m.startswith("auto") and m != "ddp" and got[m]]
if auto and fixed and got[auto[0]]:
    a = statistics.median(got[auto[0]])
    best = max(fixed, key=lambda m: statistics.median(got[m]))
    print("auto / best fixed ({}): {:.3f}".format(best, a / statistics.median(got[best])))
PY
