#!/usr/bin/env python3
"""Mercury Fig. 13 / Prophet Fig. 12 on the emulated cluster (docs/reproductions.md):
training speed against the number of workers, as many servers as workers, measured
beside the simulator's prediction. As root (network namespaces).

Usage: python3 bench/scaling_runtime.py [build/quicksilver] [--models vgg16,resnet50]
           [--workers 2,4,6,8] [--policies wfbp,bytescheduler,prophet,mercury] [--iterations 8]

GTX 1080 Ti, 10 Gbit/s per host, scaled (docs/runtime.md): the start-up calibration
picks a lower rate per host as the hosts grow (two cores emulate all of them), so each
row names its scale and the machine's idle share. Prints samples/s per worker, measured
(predicted).
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qs", nargs="?", default="build/quicksilver")
    ap.add_argument("--models", default="vgg16,resnet50")
    ap.add_argument("--workers", default="2,4,6,8")
    ap.add_argument("--policies", default="wfbp,bytescheduler,prophet,mercury")
    ap.add_argument("--iterations", type=int, default=8)
    a = ap.parse_args()
    policies = a.policies.split(",")
    print("| model | workers = servers | " + " | ".join(policies) + " | scale | CPU idle |")
    print("|---|---|" + "---|" * len(policies) + "---|---|")
    for model in a.models.split(","):
        for n in [int(x) for x in a.workers.split(",")]:
            cmd = [a.qs, "run", "--netns", "--json", "--model", model, "--device", "gtx1080ti", "--policy",
                   ",".join(policies), "--workers", str(n), "--servers", str(n), "--bandwidth", "10Gbps",
                   "--iterations", str(a.iterations)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
            d = json.loads(out.stdout)
            cells, idle = [], []
            by = {r["policy"]: r for r in d["results"]}
            for p in policies:
                r = by[p]
                pred = r["samples_per_second"] * r["iteration_ms"] / r["predicted_iteration_ms"]
                cells.append(f"{r['samples_per_second'] / n:.1f} ({pred / n:.1f})")
                idle.append(r.get("cpu_idle", -1))
            print(f"| {model} | {n} | " + " | ".join(cells) +
                  f" | {d['config']['bandwidth_bps'] / 10e9:.3f} | {100 * min(idle):.0f}-{100 * max(idle):.0f} % |", flush=True)


if __name__ == "__main__":
    main()
