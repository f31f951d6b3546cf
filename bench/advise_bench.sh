#!/usr/bin/env bash
# `quicksilver advise` measured (issue 30 item 1):
#   1. its time: VGG-16 and ResNet-50 zoo profiles, default packet sizes, 16 and 256 workers
#      (as many servers), PS, 10 Gbit/s, with and without the sensitivity sweep; the median
#      of RUNS runs each;
#   2. its search against the full tuner's: on a set of jobs (models x rates x workers),
#      bytescheduler's tuned prediction in advise against `quicksilver tune`'s best (the
#      11x6 grid plus refinement), and advise's pick against the best of tune's result and
#      every policy at its default knobs (`simulate --policy all`). Passes when the pick is
#      within 2 % of that best everywhere.
#
# Usage: bash bench/advise_bench.sh [BUILD=build] [RUNS=3] [PARTS="time compare"]
set -euo pipefail
build=${1:-build}
runs=${2:-3}
parts=${3:-time compare}
qs="$build/quicksilver"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "advise_bench: $parts; $runs runs each; load at start $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ " $parts " == *" time "* ]]; then
echo
echo "| model | workers | sweep | seconds (median of $runs) | min | max | simulations |"
echo "|---|---:|---|---:|---:|---:|---:|"
for model in vgg16 resnet50; do
  for n in 16 256; do
    for sweep in on off; do
      flags=()
      [ "$sweep" = off ] && flags+=(--no-sensitivity)
      times=()
      for _ in $(seq "$runs"); do
        "$qs" advise --model "$model" --workers "$n" --servers "$n" "${flags[@]}" --json > "$out/a.json"
        times+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$out/a.json")")
      done
      sims=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["simulations"])' "$out/a.json")
      printf '%s\n' "${times[@]}" | sort -g > "$out/t"
      echo "| $model | $n | $sweep | $(sed -n "$(( (runs + 1) / 2 ))p" "$out/t") | $(head -1 "$out/t") | $(tail -1 "$out/t") | $sims |"
    done
  done
done
fi
[[ " $parts " == *" compare "* ]] || exit 0

echo
echo "| model | rate | workers | advise pick | pick ms | best ms (tune, defaults) | pick/best | advise bytescheduler ms | tune bytescheduler ms | ratio |"
echo "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"
worst=0
for model in vgg16 resnet50 resnet18; do
  for rate in 1Gbps 10Gbps; do
    for n in 4 16; do
      job=(--model "$model" --workers "$n" --servers "$n" --bandwidth "$rate")
      "$qs" advise "${job[@]}" --no-sensitivity --json > "$out/a.json"
      "$qs" tune "${job[@]}" --json > "$out/t.json"
      "$qs" simulate "${job[@]}" --policy all --json > "$out/s.json"
      python3 - "$out/a.json" "$out/t.json" "$out/s.json" "$model" "$rate" "$n" >> "$out/rows" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
tune = json.load(open(sys.argv[2]))
sim = json.load(open(sys.argv[3]))
tuned = [r["iteration_ms"] for r in tune["results"] if r["policy"].endswith("-tuned")][0]
defaults = [r["iteration_ms"] for r in sim["results"] if r["policy"] != "oracle"]
best = min([tuned] + defaults)
pick = a["ranking"][0]
bs = [e["iteration_ms"] for e in a["ranking"] if e["policy"] == "bytescheduler"][0]
print("| {} | {} | {} | {} | {:.3f} | {:.3f} | {:.4f} | {:.3f} | {:.3f} | {:.4f} |".format(
    sys.argv[4], sys.argv[5], sys.argv[6], pick["policy"], pick["iteration_ms"], best,
    pick["iteration_ms"] / best, bs, tuned, bs / tuned))
PY
      tail -1 "$out/rows"
    done
  done
done
python3 - "$out/rows" <<'PY'
import sys
worst = max(float(l.split("|")[7]) for l in open(sys.argv[1]))
print("\nworst pick/best: {:.4f} ({})".format(worst, "within 2 %" if worst <= 1.02 else "OVER 2 %"))
PY
