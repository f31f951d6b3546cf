"""policy="auto"'s decision cost (issue 30, item 3c): the time rank 0's thread takes for one
decision (the network's effective rate by bisection, then every policy ranked with its knobs
tuned), on measured profiles, per architecture and worker count. The training thread does
not wait for it unless it takes longer than decision_lag passes (8 at the default
replan_every=200).

    PYTHONPATH=build/python python3 bench/auto_bench.py [--repeats 3] [--workers 4,16,64]

Prints one row per (profile, architecture, workers): the median and spread of the decision
time over the repeats, the simulations' split (inversion, ranking), the inferred rate and the
pick. The measured iteration fed to each decision is the simulator's own for the start
policy at 10 Gbit/s (so the inferred rate should read 10)."""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
from quicksilver import _quicksilver as q  # noqa: E402
from quicksilver import auto  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--workers", default="4,16,64")
ap.add_argument("--profiles", default="data/measured/h200-resnet50-b32.json,data/measured/h200-bert-base-b32.json")
args = ap.parse_args()

print("{:<22} {:<9} {:>7} {:>10} {:>8} {:>10} {:>10} {:>8}  {}".format(
    "profile", "arch", "workers", "decide ms", "spread", "invert ms", "rank ms", "Gbit/s", "pick"))
for path in args.profiles.split(","):
    profile = json.load(open(os.path.join(ROOT, path)))
    text = json.dumps(profile)
    compute = sum(l["forward_ms"] + l["backward_ms"] for l in profile["layers"])
    for arch in ("ps", "allreduce"):
        start_policy = auto.START_POLICY[arch]
        for w in map(int, args.workers.split(",")):
            iteration = q.predict(text, arch, w, w, 10.0, auto.LATENCY_US, "none", start_policy, {})
            times, inverts, ranks = [], [], []
            for _ in range(args.repeats):
                p = auto.Planner(q, arch, w, w, "none", False, 200)
                for n in range(3, 11):
                    p.record(n, iteration, iteration - compute)
                t0 = time.perf_counter()
                gbps = auto.effective_gbps(
                    lambda g: q.predict(text, arch, w, w, g, auto.LATENCY_US, "none", start_policy, {}), iteration)
                t1 = time.perf_counter()
                q.rank_policies(text, arch, w, w, gbps, auto.LATENCY_US, "none", False)
                t2 = time.perf_counter()
                d = p.decide(10, profile, start_policy, {}, p.measurement(), 0.0)
                times.append(d["decide_ms"])
                inverts.append((t1 - t0) * 1e3)
                ranks.append((t2 - t1) * 1e3)
            print("{:<22} {:<9} {:>7} {:>10.1f} {:>8.1f} {:>10.1f} {:>10.1f} {:>8.3g}  {}".format(
                os.path.basename(path)[:22], arch, w, statistics.median(times), max(times) - min(times),
                statistics.median(inverts), statistics.median(ranks), d.get("network_gbps", 0), d["policy"]),
                flush=True)
