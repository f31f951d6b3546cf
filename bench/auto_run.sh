#!/usr/bin/env bash
# `quicksilver run --policy auto` (no script: the synthetic runtime in phases) against the
# fixed policies of its architecture on the emulated cluster (issue 30): per job, ROUNDS
# interleaved rounds of one run of every fixed policy and one auto run, the same
# iterations; then per job the median iteration of each over the rounds, auto's ratio to
# the best fixed one, and auto's decisions of the last round.
#
#   bash bench/auto_run.sh [BIN]        # as root (--netns); BIN: build/quicksilver
#   JOBS="resnet18:ps:2 small:allreduce:2" RATE=1Gbps ITERATIONS=60 REPLAN=20 ROUNDS=2 bash bench/auto_run.sh
#
# auto's row counts every iteration of every phase (its start-policy phase, its trials);
# what the phases' process restarts take is in its log, not in its iterations.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/quicksilver}
JOBS=${JOBS:-"resnet18:ps:2 vgg16:ps:2 resnet18:allreduce:2"}
RATE=${RATE:-1Gbps}
ITERATIONS=${ITERATIONS:-60}
REPLAN=${REPLAN:-20}
ROUNDS=${ROUNDS:-2}
PS=${PS:-mercury,mercury-nopreempt,bytescheduler,prophet,p3,tictac,wfbp}
AR=${AR:-wfbp,mgwfbp,mgwfbp-opt,ddp,bytescheduler}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "auto_run: $JOBS at $RATE, $ITERATIONS iterations, --replan-every $REPLAN, $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  for job in $JOBS; do
    IFS=: read -r model arch n <<< "$job"
    fixed=$PS; servers=(--servers "$n")
    if [ "$arch" = allreduce ]; then fixed=$AR; servers=(); fi
    common=(--netns --model "$model" --architecture "$arch" --workers "$n" "${servers[@]}"
            --bandwidth "$RATE" --iterations "$ITERATIONS" --json)
    echo "round $round: $job fixed ($fixed)" >&2
    "$BIN" run "${common[@]}" --policy "$fixed" > "$out/$job.fixed.$round.json" 2> "$out/$job.fixed.$round.err" ||
      echo "  failed: $(tail -1 "$out/$job.fixed.$round.err")" >&2
    echo "round $round: $job auto" >&2
    "$BIN" run "${common[@]}" --policy auto --replan-every "$REPLAN" > "$out/$job.auto.$round.json" 2> "$out/$job.auto.$round.err" ||
      echo "  failed: $(tail -1 "$out/$job.auto.$round.err")" >&2
  done
done
python3 - "$out" "$ROUNDS" $JOBS <<'PY'
import glob, json, os, statistics, sys
out, rounds, jobs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("\n| job | best fixed | ms | auto ms | auto / best | spread (auto) | fixed ms, every policy |")
print("|---|---|---:|---:|---:|---:|---|")
for job in jobs:
    times = {}
    for r in range(1, rounds + 1):
        for kind in ("fixed", "auto"):
            path = "{}/{}.{}.{}.json".format(out, job, kind, r)
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                continue
            for row in json.load(open(path))["results"]:
                times.setdefault(row["policy"], []).append(row["iteration_ms"])
    med = {p: statistics.median(v) for p, v in times.items()}
    if "auto" not in med or len(med) < 2:
        print("| {} | (runs failed) |".format(job))
        continue
    fixed = {p: t for p, t in med.items() if p != "auto"}
    best = min(fixed, key=fixed.get)
    a = times["auto"]
    spread = (max(a) - min(a)) / statistics.median(a) if len(a) > 1 else 0
    every = ", ".join("{} {:.1f}".format(p, t) for p, t in sorted(fixed.items(), key=lambda kv: kv[1]))
    print("| {} | {} | {:.2f} | {:.2f} | {:.3f} | {:.0%} | {} |".format(
        job, best, fixed[best], med["auto"], med["auto"] / fixed[best], spread, every))
print()
for job in jobs:
    err = "{}/{}.auto.{}.err".format(out, job, rounds)
    if os.path.exists(err):
        print(job + ", last round's decisions:")
        for line in open(err):
            if "auto, after" in line:
                print("  " + line.split("auto, after ", 1)[1].rstrip())
PY
