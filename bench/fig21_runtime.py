#!/usr/bin/env python3
"""Mercury Fig. 21 on the emulated cluster (docs/reproductions.md): every PS policy with
workers that are not alike and with a slow server link, measured beside the simulator's
prediction of the same run. As root (network namespaces).

Usage: python3 bench/fig21_runtime.py [build/quicksilver] [--models vgg16,resnet50]
           [--iterations 8] [--repeats 1]

Setting as the simulator's reproduction (tools/repro_mercury.py --only fig21): 4 workers
and 4 servers at 10 Gbit/s, GTX 1080 Ti; (a) two workers twice as fast
(--compute-factor 1,1,0.5,0.5); (b) server 0's NIC at half the rate
(--server-bandwidths 0=5Gbps). The run scales every rate and tensor size alike
(docs/runtime.md). Prints samples/s per policy, measured (predicted), the median over
the repeats.
"""
import argparse
import json
import statistics
import subprocess
import sys

SCENARIOS = [
    ("balanced", []),
    ("(a) heterogeneous workers", ["--compute-factor", "1,1,0.5,0.5"]),
    ("(b) slow server link", ["--server-bandwidths", "0=5Gbps"]),
]
POLICIES = ["wfbp", "p3", "tictac", "bytescheduler", "prophet", "mercury-nopreempt", "mercury"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qs", nargs="?", default="build/quicksilver")
    ap.add_argument("--models", default="vgg16,resnet50")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    header = "| scenario | model | " + " | ".join(POLICIES) + " | mercury / best other | CPU idle |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for model in a.models.split(","):
        for name, extra in SCENARIOS:
            meas = {p: [] for p in POLICIES}
            pred = {p: [] for p in POLICIES}
            idle = []
            for _ in range(a.repeats):
                cmd = [a.qs, "run", "--netns", "--json", "--model", model, "--device", "gtx1080ti", "--policy",
                       ",".join(POLICIES), "--workers", "4", "--servers", "4", "--bandwidth", "10Gbps",
                       "--iterations", str(a.iterations)] + extra
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
                d = json.loads(out.stdout)
                for r in d["results"]:
                    meas[r["policy"]].append(r["samples_per_second"])
                    it = r["predicted_iteration_ms"]
                    pred[r["policy"]].append(r["samples_per_second"] * r["iteration_ms"] / it if it else 0)
                    idle.append(r.get("cpu_idle", -1))
            med = {p: statistics.median(v) for p, v in meas.items()}
            cells = [f"{med[p]:.0f} ({statistics.median(pred[p]):.0f})" for p in POLICIES]
            best_other = max(med[p] for p in POLICIES if not p.startswith("mercury"))
            print(f"| {name} | {model} | " + " | ".join(cells) +
                  f" | {100 * (med['mercury'] / best_other - 1):+.0f} % | {100 * min(idle):.0f}-{100 * max(idle):.0f} % |",
                  flush=True)


if __name__ == "__main__":
    main()
