#!/bin/bash
# Do incast losses cost the PS baselines time? (issue 16; docs/runtime.md "What TCP
# repaired"). Runs every PS policy on the emulated cluster (4 + 4 hosts at 10 Gbit/s)
# with the default 2 ms switch buffer and with one deep enough that nothing is lost,
# interleaved run by run, and prints one row per model, policy and buffer: iteration time
# (median and each run), prediction error, retransmitted segments per iteration (of them
# the workers': their pushes) and timeouts. As root; about 4 minutes per run.
# Usage: bash bench/switch_buffer.sh [build/quicksilver] [runs] [buffers...]
#   e.g. bash bench/switch_buffer.sh build/quicksilver 3 2ms 20ms
set -euo pipefail
qs=${1:-build/quicksilver}
runs=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
buffers=("$@"); [ ${#buffers[@]} -gt 0 ] || buffers=(2ms 20ms)
policies=wfbp,p3,tictac,bytescheduler,prophet,mercury
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$runs"); do
  for s in "vgg16 6" "alexnet 4"; do
    read -r model iters <<< "$s"
    for b in "${buffers[@]}"; do
      "$qs" run --netns --model "$model" --policy "$policies" --workers 4 --servers 4 --bandwidth 10Gbps \
        --iterations "$iters" --switch-buffer "$b" --timeout 300s --keep-going --json \
        > "$tmp/$model=$b=$r.json" 2> /dev/null || true
    done
  done
done
python3 - "$tmp" "$policies" "${buffers[@]}" <<'PY'
import collections, glob, json, statistics, sys
tmp, order, buffers = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
rows = collections.defaultdict(list)
for f in sorted(glob.glob(tmp + "/*.json")):
    model, buf, _ = f.rsplit("/", 1)[1][:-5].split("=")
    try:
        results = json.load(open(f))["results"]
    except (ValueError, KeyError):
        print(f"missing: {f.rsplit('/', 1)[1]} (the run failed)"); continue
    for r in results:
        n = max(1, len(r.get("retransmits_per_iteration", [])))
        rows[(model, r["policy"], buf)].append((r["iteration_ms"], 100 * r["relative_error"],
            sum(r.get("retransmits_per_iteration", [])) / n, sum(r.get("worker_retransmits_per_iteration", [])) / n,
            sum(r.get("timeouts_per_iteration", []))))
print("| model | policy | switch buffer | iteration ms: median (each run) | prediction error | retransmitted per iteration (pushes) | RTOs |")
print("|---|---|---|---|---|---|---|")
for k in sorted(rows, key=lambda k: (k[0], order.index(k[1]), buffers.index(k[2]))):
    v = rows[k]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(x[0] for x in v):.0f} ({', '.join(f'{x[0]:.0f}' for x in v)}) "
          f"| {statistics.median(x[1] for x in v):+.1f} % | {statistics.mean(x[2] for x in v):.0f} "
          f"({statistics.mean(x[3] for x in v):.0f}) | {sum(x[4] for x in v)} |")
PY
