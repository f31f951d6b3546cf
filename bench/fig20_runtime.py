#!/usr/bin/env python3
"""Mercury Fig. 20 on the emulated cluster (docs/reproductions.md): several jobs at once on
the same 4 workers and 4 servers, every job of a run with the same policy, measured beside
the simulator's prediction of the same shared run. As root (network namespaces).

Usage: python3 bench/fig20_runtime.py [build/quicksilver] [--policies wfbp,bytescheduler,mercury]
           [--scenarios a,b,c,d] [--iterations 8]

The scenarios are the simulator reproduction's (tools/repro_mercury.py --only fig20),
GTX 1080 Ti, 10 Gbit/s (scaled, docs/runtime.md). `run --job` gives each job its own
emulated GPUs, so the prediction is the simulator's with --separate-gpus. Prints samples/s
per job, measured (predicted), and each job's speed normalised by wfbp's in the same
scenario when wfbp is among the policies.
"""
import argparse
import json
import subprocess
import sys

SCENARIOS = {
    "a": ["vgg16:{p}:16", "resnet50:{p}"],
    "b": ["vgg19:{p}:16", "vgg16:{p}:16"],
    "c": ["bert_base:{p}:16", "resnet50:{p}"],
    "d": ["vgg16_cifar10:{p}", "alexnet:{p}", "resnet50:{p}"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qs", nargs="?", default="build/quicksilver")
    ap.add_argument("--policies", default="wfbp,bytescheduler,mercury")
    ap.add_argument("--scenarios", default="a,b,c,d")
    ap.add_argument("--iterations", type=int, default=8)
    a = ap.parse_args()
    policies = a.policies.split(",")
    print("| scenario | job | " + " | ".join(policies) + " | CPU idle |")
    print("|---|---|" + "---|" * len(policies) + "---|")
    for sc in a.scenarios.split(","):
        specs = SCENARIOS[sc]
        measured, predicted, idle = {}, {}, []
        for p in policies:
            cmd = [a.qs, "run", "--netns", "--json", "--device", "gtx1080ti", "--workers", "4", "--servers", "4",
                   "--bandwidth", "10Gbps", "--iterations", str(a.iterations)]
            for s in specs:
                cmd += ["--job", s.format(p=p)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
            rows = json.loads(out.stdout)["results"]
            for j, r in enumerate(rows):
                measured[(j, p)] = r["samples_per_second"]
                predicted[(j, p)] = r["samples_per_second"] * r["iteration_ms"] / r["predicted_iteration_ms"]
                idle.append(r.get("cpu_idle", -1))
        for j, s in enumerate(specs):
            cells = []
            for p in policies:
                m, q = measured[(j, p)], predicted[(j, p)]
                if "wfbp" in policies and p != "wfbp":
                    cells.append(f"{m / measured[(j, 'wfbp')]:.2f} ({q / predicted[(j, 'wfbp')]:.2f})")
                else:
                    cells.append(f"{m:.0f} ({q:.0f})")
            print(f"| ({sc}) | {s.format(p='').rstrip(':').replace('::', ', batch ')} | " + " | ".join(cells) +
                  f" | {100 * min(idle):.0f}-{100 * max(idle):.0f} % |", flush=True)


if __name__ == "__main__":
    main()
