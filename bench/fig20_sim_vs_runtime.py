#!/usr/bin/env python3
"""The simulator's predictions for bench/fig20_runtime.py's scenarios beside the two runtime
runs of docs/reproductions.md (Mercury Fig. 20, "The runtime", 2026-11-24): samples/s per
job and policy, and how many of the 27 job-policy cells come within 15 % of both runs.

Usage: python3 bench/fig20_sim_vs_runtime.py [build/quicksilver] [--iterations 20] [--flags '...']
"""
import argparse
import json
import subprocess

SCENARIOS = {
    "a": ["vgg16:{p}:16", "resnet50:{p}"],
    "b": ["vgg19:{p}:16", "vgg16:{p}:16"],
    "c": ["bert_base:{p}:16", "resnet50:{p}"],
    "d": ["vgg16_cifar10:{p}", "alexnet:{p}", "resnet50:{p}"],
}
POLICIES = ["wfbp", "bytescheduler", "mercury"]
# Per scenario and job: wfbp samples/s in the two runs, then bytescheduler's and mercury's
# speed normalised by wfbp's of the same run (docs/reproductions.md's runtime table).
MEASURED = {
    ("a", 0): ((57, 52), (1.26, 1.42), (1.45, 1.50)),
    ("a", 1): ((415, 446), (1.29, 1.05), (1.63, 1.19)),
    ("b", 0): ((36, 38), (1.61, 1.49), (1.76, 1.36)),
    ("b", 1): ((36, 38), (1.72, 1.33), (1.81, 1.81)),
    ("c", 0): ((76, 75), (1.09, 1.06), (1.18, 1.21)),
    ("c", 1): ((679, 608), (0.82, 0.90), (0.77, 0.93)),
    ("d", 0): ((1147, 1196), (0.92, 0.96), (1.45, 1.35)),
    ("d", 1): ((2136, 2202), (1.34, 1.28), (1.10, 1.35)),
    ("d", 2): ((423, 376), (0.71, 0.80), (1.09, 0.84)),
}


def measured(sc, j, p):
    wfbp, *norm = MEASURED[(sc, j)]
    if p == "wfbp":
        return wfbp
    n = norm[POLICIES.index(p) - 1]
    return (wfbp[0] * n[0], wfbp[1] * n[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qs", nargs="?", default="build/quicksilver")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--flags", default="", help="extra simulator flags, e.g. '--link-sharing fair'")
    a = ap.parse_args()
    print("| scenario | job | " + " | ".join(POLICIES) + " |")
    print("|---|---|" + "---|" * len(POLICIES))
    within = 0
    errors = []
    for sc, specs in SCENARIOS.items():
        pred = {}
        for p in POLICIES:
            cmd = [a.qs, "simulate", "--json", "--separate-gpus", "--device", "gtx1080ti", "--workers", "4",
                   "--servers", "4", "--bandwidth", "10Gbps", "--iterations", str(a.iterations)] + a.flags.split()
            for s in specs:
                cmd += ["--job", s.format(p=p)]
            rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["results"]
            for j, r in enumerate(rows):
                pred[(j, p)] = r["samples_per_second"]
        for j, s in enumerate(specs):
            cells = []
            for p in POLICIES:
                m, q = measured(sc, j, p), pred[(j, p)]
                ok = all(abs(q - x) <= 0.15 * x for x in m)
                within += ok
                errors += [abs(q / x - 1) for x in m]
                cells.append(f"{m[0]:.0f} / {m[1]:.0f} ({q:.0f}){' *' if ok else ''}")
            print(f"| ({sc}) | {s.split(':')[0]} | " + " | ".join(cells) + " |")
    print(f"\nmeasured first / second (predicted); * within 15 % of both runs: {within} of 27; "
          f"mean |error| {100 * sum(errors) / len(errors):.0f} %")


if __name__ == "__main__":
    main()
