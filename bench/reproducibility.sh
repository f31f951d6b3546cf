#!/usr/bin/env bash
# Does the emulated cluster give the same answer run after run? (issue 16, point 5)
# Every PS policy on the e2e scenarios (bench/e2e.sh), RUNS independent runs each: every
# run builds its own cluster (4 workers, 4 servers, network namespaces, tc-shaped links),
# calibrates it with every link loaded at once (docs/runtime.md) and runs the policies.
# Per scenario and policy it prints the median (min to max) of the iteration time, its spread (max / min), the link
# utilisation, the prediction error, the retransmission timeouts over all hosts, the
# packets the hosts' own queues dropped, and the machine's CPU idle share. It then checks the issue's targets: Mercury's spread at
# most 1.10, its utilisation median at least 95 % and minimum at least 92 % (constant-rate
# scenarios), and every prediction within 10 %.
# Extra arguments go to every `quicksilver run` (e.g. --host-queue 2ms), so settings can be
# compared with one command each.
# Needs root. Usage: [SCENARIOS="..."] [POLICIES=...] [KEEP=DIR] \
#   bash bench/reproducibility.sh [build/quicksilver] [runs] [run flags...]
#   (about 4 minutes per run of all scenarios on this project's machine)
set -euo pipefail
qs=${1:-build/quicksilver}
runs=${2:-5}
shift $(( $# > 2 ? 2 : $# ))
extra=("$@")
policies=${POLICIES:-wfbp,p3,tictac,bytescheduler,prophet,mercury-nopreempt,mercury}
# SCENARIOS: a subset, e.g. "alexnet-10Gbps resnet50-dynamic" (default: all seven).
only=${SCENARIOS:-}
# KEEP=DIR keeps every run's --json there (per iteration: times, retransmissions,
# timeouts; the calibration) for a closer look at an outlier.
if [ -n "${KEEP:-}" ]; then tmp=$KEEP; mkdir -p "$tmp"; else tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT; fi
scenarios=(
  "vgg16 10Gbps 6"
  "vgg16 25Gbps 6"
  "resnet50 10Gbps 6"
  "resnet50 25Gbps 6"
  "alexnet 10Gbps 4"
  "alexnet 25Gbps 4"
)
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }
for r in $(seq "$runs"); do
  for s in "${scenarios[@]}"; do
    read -r model bw iters <<< "$s"
    wanted "$model-$bw" || continue
    "$qs" run --netns --model "$model" --policy "$policies" --workers 4 --servers 4 --bandwidth "$bw" \
      --iterations "$iters" --timeout 300s --keep-going --json "${extra[@]}" > "$tmp/$model-$bw-$r.json" || true
  done
  wanted resnet50-dynamic || continue
  "$qs" run --netns --model resnet50 --policy "$policies" --workers 4 --servers 4 --bandwidth 10Gbps \
    --bandwidth-trace random:1Gbps:10Gbps:500ms:7 --iterations 16 --statistic mean --timeout 300s --keep-going \
    --json "${extra[@]}" > "$tmp/resnet50-dynamic-$r.json" || true
done
python3 - "$tmp" "$runs" "${extra[*]:-}" "$only" <<'EOF'
import json, statistics, sys, glob, os
tmp, runs, extra, only = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
scen = ["vgg16-10Gbps", "vgg16-25Gbps", "resnet50-10Gbps", "resnet50-25Gbps", "alexnet-10Gbps",
        "alexnet-25Gbps", "resnet50-dynamic"]
scen = [s for s in scen if not only or s in only]
print(f"Every PS policy, 4 workers + 4 servers, {runs} independent runs each (median (min to max))"
      + (f"; run flags: {extra}" if extra else ""))
print()
print("| scenario | policy | iteration (ms) | spread | link utilisation | prediction error | RTOs | host-queue drops | CPU idle |")
print("|---|---|---|---|---|---|---|---|---|")
failures, missing = [], []
for sc in scen:
    rows = {}
    for r in range(1, runs + 1):
        path = f"{tmp}/{sc}-{r}.json"
        try:
            d = json.load(open(path))
        except Exception:
            missing.append(f"{sc} run {r}")
            continue
        for res in d["results"]:
            rows.setdefault(res["policy"], []).append(res)
    for pol, rs in rows.items():
        it = [x["iteration_ms"] for x in rs]
        ut = [x["link_utilisation"] for x in rs]
        er = [x["relative_error"] for x in rs]
        rto = [sum(x.get("timeouts_per_iteration", [])) for x in rs]
        idle = [x.get("cpu_idle", -1) for x in rs]
        # Packets the hosts' own queues dropped (a local drop can stall a connection for
        # 200 ms: docs/runtime.md); "?" where the run did not count them.
        hq = [x.get("host_queue_drops", -1) for x in rs]
        hq_cell = str(sum(hq)) if min(hq) >= 0 else "?"
        spread = max(it) / min(it)
        cell = lambda v, f: f"{f(statistics.median(v))} ({f(min(v))} to {f(max(v))})"
        print(f"| {sc} | {pol} | {cell(it, lambda x: f'{x:.1f}')} | {spread:.2f} "
              f"| {cell(ut, lambda x: f'{100 * x:.1f} %')} | {cell(er, lambda x: f'{100 * x:+.1f} %')} "
              f"| {sum(rto)} | {hq_cell} | {100 * statistics.median(idle):.0f} % |")
        if pol == "mercury":
            if spread > 1.10: failures.append(f"{sc}: mercury's spread {spread:.2f} > 1.10")
            # Utilisation is relative to the nominal rate's goodput: not a target under a
            # changing rate.
            if sc.endswith("dynamic"): continue
            if statistics.median(ut) < 0.95: failures.append(f"{sc}: mercury's utilisation median {100 * statistics.median(ut):.1f} % < 95 %")
            if min(ut) < 0.92: failures.append(f"{sc}: mercury's utilisation minimum {100 * min(ut):.1f} % < 92 %")
        if abs(statistics.median(er)) > 0.10:
            failures.append(f"{sc}: {pol}'s prediction error median {100 * statistics.median(er):+.1f} % is outside 10 %")
print()
# Mercury's runs one by one: an outlier with its CPU idle and its cluster's calibration.
print("Mercury per run: iteration (ms), CPU idle, the run's calibration")
for sc in scen:
    for r in range(1, runs + 1):
        try:
            d = json.load(open(f"{tmp}/{sc}-{r}.json"))
        except Exception:
            continue
        for x in d["results"]:
            if x["policy"] == "mercury":
                print(f"  {sc} run {r}: {x['iteration_ms']:.1f} ms, CPU idle {100 * x.get('cpu_idle', -1):.0f} %, "
                      f"retransmitted {sum(x.get('retransmits_per_iteration', []))}, "
                      f"switch-port drops {x.get('switch_drops', '?')}; "
                      f"{d['config'].get('calibration', 'no calibration')}")
print()
for m in missing: print(f"missing: {m} (the run failed)")
print(f"targets: {len(failures)} missed")
for f in failures: print(f"  {f}")
EOF
