#!/usr/bin/env python3
"""Reproduces the Mercury paper's trace-driven analysis (section V-C) with the simulator.

Fig. 11: normalised speed (oracle / iteration) vs bandwidth, 1..40 Gbps, VGG-16 and
BERT-Base on an RTX 3090, one worker and one PS (the model of eq. 1-2).
Fig. 12: the minimum bandwidth at which a scheduler reaches 0.99 of the oracle (0.90 for
BERT-Base), per model and GPU, found by bisection; WFBP also with the paper's eq. 7
(overlapping pulls) and Mercury also with the paper's FIFO server Ready Queue.
Fig. 13: training speed (samples/s) against the number of workers at 10 Gbps, every model
of Table II on a GTX 1080 Ti, N workers and N PSes; the paper's 2..4 workers extended to 64.
Fig. 17: Mercury's normalised speed against its packet size (4 KiB to 4 MiB), VGG-16 and
AlexNet, 2 workers and 2 PSes, under three per-frame costs (docs/simulator.md).
Fig. 20: several jobs sharing 4 workers and 4 PSes (simulate --job), each with its own
scheduler, and priorities that hold across jobs (--job-sharing strict|deadline).
Fig. 21: (a) heterogeneous GPU workers (--compute-factor) and (b) hosts not in a perfect
load balance (--server-shares, --server-bandwidths), 4 workers and 4 PSes at 10 Gbps.

Usage: "$(bash scripts/python.sh --no-torch)" tools/repro_mercury.py [--bin build/quicksilver] [--out docs/img]
           [--only fig11|fig12|fig13|fig17|fig20|fig21]
Prints markdown tables; writes mercury_fig11.png, mercury_fig12.png, mercury_fig13.png,
mercury_fig17.png, mercury_fig20.png and mercury_fig21.png.
"""
import argparse
import json
import subprocess
import sys

POLICIES = ["wfbp", "p3", "tictac", "bytescheduler", "prophet", "mercury-nopreempt", "mercury"]


# Fig. 12's columns: (label, policy, extra simulate flags).
FIG12_VARIANTS = [
    ("wfbp", "wfbp", ()),
    ("wfbp eq. 7", "wfbp", ("--overlapping-pulls",)),
    ("bytescheduler", "bytescheduler", ()),
    ("mercury", "mercury", ()),
    ("mercury FIFO ready queue", "mercury", ("--mercury-server-fifo",)),
]
# The transport's per-frame cost, calibrated from bench/transport_bench (docs/simulator.md).
FRAME_COST = ("--frame-header", "24B", "--frame-cpu", "1us")


def simulate(qs, model, device, gbps, policies, extra=(), hosts=1):
    cmd = [qs, "simulate", "--model", model, "--device", device, "--policy", ",".join(policies),
           "--workers", str(hosts), "--servers", str(hosts), "--bandwidth", f"{gbps}Gbps",
           "--iterations", "2", "--json", *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["policy"]: r["scaling_efficiency"] for r in json.loads(out)["results"]}


def available(qs):
    """Policies this build supports (a missing one is reported, not fatal)."""
    ok = []
    for p in POLICIES:
        r = subprocess.run([qs, "simulate", "--model", "vgg16_cifar10", "--policy", p, "--iterations", "1"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            ok.append(p)
        else:
            print(f"note: skipping {p}: {r.stderr.strip()}", file=sys.stderr)
    return ok


def fig11(qs, policies, out_dir):
    bws = list(range(1, 41))
    data = {}
    for model in ["vgg16", "bert_base"]:
        data[model] = {p: [] for p in policies}
        for bw in bws:
            r = simulate(qs, model, "rtx3090", bw, policies)
            for p in policies:
                data[model][p].append(r[p])
    print("### Fig. 11: normalised speed (oracle / iteration), RTX 3090, 1 worker + 1 PS\n")
    for model in data:
        print(f"{model}:\n")
        print("| Gbps | " + " | ".join(policies) + " |")
        print("|---" * (len(policies) + 1) + "|")
        for i, bw in enumerate(bws):
            if bw in (1, 2, 5, 10, 15, 20, 25, 30, 40):
                print(f"| {bw} | " + " | ".join(f"{data[model][p][i]:.3f}" for p in policies) + " |")
        print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, model in zip(axes, data):
        for p in policies:
            ax.plot(bws, data[model][p], label=p, lw=2 if p == "mercury" else 1.2)
        ax.set_title({"vgg16": "VGG-16", "bert_base": "BERT-Base"}[model] + " (RTX 3090)")
        ax.set_xlabel("bandwidth (Gbps)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("normalised speed (oracle / iteration)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("Mercury Fig. 11, simulated by Quicksilver")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig11.png", dpi=110)


def min_bandwidth(qs, model, device, policy, target, extra=()):
    lo, hi = 0.05, 400.0
    if simulate(qs, model, device, hi, [policy], extra)[policy] < target:
        return float("inf")
    while hi - lo > 0.02 * hi:
        mid = (lo + hi) / 2
        if simulate(qs, model, device, round(mid, 3), [policy], extra)[policy] >= target:
            hi = mid
        else:
            lo = mid
    return hi


def fig12(qs, policies, out_dir):
    models = ["vgg16_cifar10", "vgg16", "vgg19", "alexnet", "resnet50", "bert_base"]
    devices = ["gtx1080ti", "rtx3090", "a100"]
    variants = [v for v in FIG12_VARIANTS if v[1] in policies]
    shown = [v[0] for v in variants]
    res = {}
    print("### Fig. 12: minimum bandwidth (Gbps) to reach 0.99 of the oracle (BERT-Base: 0.90)\n")
    print("| model | GPU | " + " | ".join(shown) + " | mercury / wfbp | mercury / wfbp eq. 7 |")
    print("|---|---|" + "---|" * (len(shown) + 2))
    for m in models:
        target = 0.90 if m == "bert_base" else 0.99
        for d in devices:
            vals = [min_bandwidth(qs, m, d, p, target, extra) for _, p, extra in variants]
            res[(m, d)] = dict(zip(shown, vals))
            r = res[(m, d)]
            ratio = r["mercury"] / r["wfbp"] if "wfbp" in r else float("nan")
            ratio7 = r["mercury"] / r["wfbp eq. 7"] if "wfbp eq. 7" in r else float("nan")
            print(f"| {m} | {d} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {ratio:.2f} | {ratio7:.2f} |")
    print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(devices), figsize=(13, 4), sharey=True)
    width = 0.8 / len(shown)
    for ax, d in zip(axes, devices):
        for k, p in enumerate(shown):
            ax.bar([i + k * width for i in range(len(models))], [res[(m, d)][p] for m in models],
                   width, label=p)
        ax.set_xticks([i + width * (len(shown) - 1) / 2 for i in range(len(models))])
        ax.set_xticklabels(models, rotation=30, fontsize=8)
        ax.set_title(d)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("minimum bandwidth (Gbps, log)")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Mercury Fig. 12, simulated: bandwidth needed for 0.99 of the oracle (BERT-Base 0.90)")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig12.png", dpi=110)


# Fig. 13 (section VI-B): the testbed's GTX 1080 Ti, 10 Gbps, as many PSes as workers.
FIG13_MODELS = ["vgg16_cifar10", "vgg16", "vgg19", "alexnet", "resnet50", "bert_base"]
FIG13_WORKERS = [2, 4, 8, 16, 32, 64]
FIG13_POLICIES = ["oracle", "wfbp", "p3", "tictac", "bytescheduler", "prophet", "mercury-nopreempt", "mercury"]
# What the paper states of Fig. 13 in its text (2..4 workers; the bars' values are not in
# the text): the largest gains of Mercury over each scheme.
FIG13_PAPER_MAX_GAIN = {"wfbp": 130, "bytescheduler": 40, "mercury-nopreempt": 15}


def samples_per_second(qs, model, device, gbps, policies, hosts, extra=()):
    cmd = [qs, "simulate", "--model", model, "--device", device, "--policy", ",".join(policies),
           "--workers", str(hosts), "--servers", str(hosts), "--bandwidth", f"{gbps}Gbps",
           "--iterations", "3", "--json", *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["policy"]: r["samples_per_second"] for r in json.loads(out)["results"]}


def fig13(qs, out_dir):
    """Training speed against the number of workers (the paper's 2..4, extended to 64)."""
    policies = FIG13_POLICIES
    data = {(m, n): samples_per_second(qs, m, "gtx1080ti", 10, policies, n)
            for m in FIG13_MODELS for n in FIG13_WORKERS}
    print("### Fig. 13: samples/s against workers, GTX 1080 Ti, 10 Gbps, N workers + N PSes\n")
    print("| model | N | linear (oracle) | " + " | ".join(policies[1:]) + " | "
          "mercury / wfbp | mercury / bytescheduler | mercury / nopreempt |")
    print("|---|---|" + "---|" * (len(policies) + 3))
    gains = {p: [] for p in FIG13_PAPER_MAX_GAIN}
    for m in FIG13_MODELS:
        for n in FIG13_WORKERS:
            r = data[(m, n)]
            cells = [f"{r[p]:.0f}" for p in policies]
            ratios = []
            for p in FIG13_PAPER_MAX_GAIN:
                g = 100 * (r["mercury"] / r[p] - 1)
                ratios.append(f"{g:+.0f} %")
                if n <= 4:
                    gains[p].append((g, m, n))
            print(f"| {m} | {n} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    print()
    for p, paper in FIG13_PAPER_MAX_GAIN.items():
        g, m, n = max(gains[p])
        print(f"largest gain of mercury over {p} at 2-4 workers: {g:+.0f} % ({m}, N={n}); paper: up to {paper} %")
    print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    styles = {"oracle": ("k", ":"), "wfbp": ("tab:gray", "-"), "p3": ("tab:green", ":"), "tictac": ("tab:brown", ":"),
              "bytescheduler": ("tab:blue", "-"), "prophet": ("tab:purple", "--"),
              "mercury-nopreempt": ("tab:orange", "--"), "mercury": ("tab:red", "-")}
    for ax, m in zip(axes.flat, FIG13_MODELS):
        for p in policies:
            colour, ls = styles[p]
            ax.plot(FIG13_WORKERS, [data[(m, n)][p] for n in FIG13_WORKERS], color=colour, ls=ls, marker="o", ms=3,
                    label="linear scaling" if p == "oracle" else p)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(FIG13_WORKERS)
        ax.set_xticklabels([str(n) for n in FIG13_WORKERS])
        ax.set_title(m)
        ax.set_xlabel("workers (= PSes)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("samples/s")
    axes[1][0].set_ylabel("samples/s")
    axes[0][2].legend(fontsize=7)
    fig.suptitle("Mercury Fig. 13 extended to 64 workers, simulated (GTX 1080 Ti, 10 Gbps)")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig13.png", dpi=110)


FIG17_PACKETS_KIB = [4, 8, 16, 32, 64, 128, 256, 1024, 4096]
FIG17_GBPS = [1, 3, 5, 10]
# Per-frame costs compared in Fig. 17: free frames, and Quicksilver's transport as
# bench/transport_bench measures it (docs/simulator.md).
FIG17_COSTS = [("free", ()), ("ours", FRAME_COST)]


def fig17(qs, out_dir):
    """Mercury's speed against its packet size under three per-frame costs."""
    data = {}
    for model in ["vgg16", "alexnet"]:
        for gbps in FIG17_GBPS:
            for label, cost in FIG17_COSTS:
                data[(model, gbps, label)] = [
                    simulate(qs, model, "gtx1080ti", gbps, ["mercury"], ("--packet-size", f"{kib}KiB") + cost,
                             hosts=2)["mercury"] for kib in FIG17_PACKETS_KIB]
    print("### Fig. 17: Mercury's normalised speed (oracle / iteration) vs packet size, GTX 1080 Ti, "
          "2 workers + 2 PSes; per-frame cost: free / ours (24 B + 1 us)\n")
    print("| model | Gbps | frame cost | " + " | ".join(f"{k} KiB" if k < 1024 else f"{k // 1024} MiB"
                                                         for k in FIG17_PACKETS_KIB) + " |")
    print("|---|---|---|" + "---|" * len(FIG17_PACKETS_KIB))
    for model in ["vgg16", "alexnet"]:
        for gbps in FIG17_GBPS:
            for label, _ in FIG17_COSTS:
                cells = [f"{v:.3f}" for v in data[(model, gbps, label)]]
                print(f"| {model} | {gbps} | {label} | " + " | ".join(cells) + " |")
    print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    styles = {"free": ":", "ours": "-"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, model in zip(axes, ["vgg16", "alexnet"]):
        for gbps, colour in zip(FIG17_GBPS, ["tab:blue", "tab:orange", "tab:green", "tab:red"]):
            for label, _ in FIG17_COSTS:
                ax.plot(FIG17_PACKETS_KIB, data[(model, gbps, label)], ls=styles[label], color=colour,
                        marker="o" if label == "ours" else None, ms=3, label=f"{gbps} Gbps, {label}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(FIG17_PACKETS_KIB)
        ax.set_xticklabels([f"{k}K" if k < 1024 else f"{k // 1024}M" for k in FIG17_PACKETS_KIB], fontsize=8)
        ax.set_xlabel("Mercury packet size")
        ax.set_title({"vgg16": "VGG-16", "alexnet": "AlexNet"}[model] + " (GTX 1080 Ti, 2 workers + 2 PSes)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("normalised speed (oracle / iteration)")
    axes[1].legend(fontsize=7)
    fig.suptitle("Mercury Fig. 17, simulated by Quicksilver")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig17.png", dpi=110)


# Fig. 20 (section VI-C, "Multiple Jobs Sharing the Cluster"): 4 workers and 4 PSes shared by
# every job, batch 16 for VGG-16, VGG-19 and BERT-Base as in the paper. The paper's text does
# not list the jobs of each scenario; these are ours, after its hints ((a) has VGG-16, the
# job with the higher bandwidth requirement; (d) three jobs, VGG-16/CIFAR-10 and AlexNet
# among them).
FIG20_SCENARIOS = [
    ("(a)", ["vgg16::16", "resnet50"]),
    ("(b)", ["vgg19::16", "vgg16::16"]),
    ("(c)", ["bert_base::16", "resnet50"]),
    ("(d)", ["vgg16_cifar10", "alexnet", "resnet50"]),
]
FIG20_POLICIES = ["wfbp", "p3", "tictac", "bytescheduler", "prophet", "mercury-nopreempt", "mercury"]
FIG20_SHARINGS = ["fair", "strict", "deadline"]
FIG20_PAPER = {"(b)": "Mercury over Native-PS, BytePS and ByteScheduler by up to ~100 %, ~38 % and ~48 % for "
                      "both jobs",
               "(d)": "Mercury improves only VGG-16/CIFAR-10 and does not harm the other two; ByteScheduler is "
                      "faster than Mercury on AlexNet but slows the other two significantly"}


def shared_speeds(qs, jobs, policy, sharing="fair"):
    """samples/s of each job when `jobs` (MODEL[::BATCH]) share the cluster, all under `policy`."""
    args = []
    for j in jobs:
        model, _, batch = j.partition("::")
        args += ["--job", f"{model}:{policy}" + (f":{batch}" if batch else "")]
    cmd = [qs, "simulate", "--device", "gtx1080ti", "--workers", "4", "--servers", "4", "--bandwidth", "10Gbps",
           "--iterations", "6", "--job-sharing", sharing, "--json", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [r["samples_per_second"] for r in json.loads(out)["results"]]


def fig20(qs, out_dir):
    data = {(label, p): shared_speeds(qs, jobs, p) for label, jobs in FIG20_SCENARIOS for p in FIG20_POLICIES}
    cross = {(label, s): shared_speeds(qs, jobs, "mercury", s) for label, jobs in FIG20_SCENARIOS
             for s in FIG20_SHARINGS}
    print("### Fig. 20: speed normalised by Native-PS (wfbp), jobs sharing 4 workers + 4 PSes "
          "(GTX 1080 Ti, 10 Gbps; links shared fairly, GPUs shared)\n")
    print("| scenario | job | wfbp samples/s | " + " | ".join(FIG20_POLICIES[1:]) + " |")
    print("|---|---|---|" + "---|" * (len(FIG20_POLICIES) - 1))
    for label, jobs in FIG20_SCENARIOS:
        for k, j in enumerate(jobs):
            base = data[(label, "wfbp")][k]
            print(f"| {label} | {j.replace('::', ', batch ')} | {base:.0f} | " +
                  " | ".join(f"{data[(label, p)][k] / base:.2f}" for p in FIG20_POLICIES[1:]) + " |")
    print()
    print("Mercury with priorities across jobs: samples/s per job, links shared fair / strict (job order) / deadline\n")
    print("| scenario | job | alone | " + " | ".join(FIG20_SHARINGS) + " |")
    print("|---|---|---|" + "---|" * len(FIG20_SHARINGS))
    for label, jobs in FIG20_SCENARIOS:
        for k, j in enumerate(jobs):
            alone = shared_speeds(qs, [j], "mercury")[0]
            print(f"| {label} | {j.replace('::', ', batch ')} | {alone:.0f} | " +
                  " | ".join(f"{cross[(label, s)][k]:.0f}" for s in FIG20_SHARINGS) + " |")
    print()
    for label, text in FIG20_PAPER.items():
        print(f"- paper, Fig. 20{label}: {text}")
    print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(FIG20_SCENARIOS), figsize=(16, 4.2), sharey=True)
    width = 0.8 / len(FIG20_POLICIES)
    for ax, (label, jobs) in zip(axes, FIG20_SCENARIOS):
        for i, p in enumerate(FIG20_POLICIES):
            ax.bar([k + i * width for k in range(len(jobs))],
                   [data[(label, p)][k] / data[(label, "wfbp")][k] for k in range(len(jobs))], width, label=p)
        ax.set_xticks([k + width * (len(FIG20_POLICIES) - 1) / 2 for k in range(len(jobs))])
        ax.set_xticklabels([j.replace("::", "\nbatch ") for j in jobs], fontsize=8)
        ax.set_title(f"Fig. 20{label}")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("speed normalised by Native-PS (wfbp)")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Mercury Fig. 20, simulated: jobs sharing 4 workers + 4 PSes (GTX 1080 Ti, 10 Gbps)")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig20.png", dpi=110)


# Fig. 21 (section VI-D): 4 workers and 4 PSes, 10 Gbps, GTX 1080 Ti. The paper's text
# names neither the GPU mix of (a) nor the imbalance of (b); these are ours.
FIG21_MODELS = ["vgg16", "vgg19", "alexnet", "resnet50", "bert_base"]
FIG21_POLICIES = ["wfbp", "p3", "tictac", "bytescheduler", "prophet", "mercury-nopreempt", "mercury"]
FIG21_SCENARIOS = [
    ("balanced", "4 alike workers, balanced placement", ()),
    # (a) two 1080 Tis and two GPUs twice as fast (an RTX 3090 in our device model: 10 vs 5
    # TFLOPS), as a cluster grown with newer cards.
    ("(a) heterogeneous workers", "workers 2, 3 compute 2x faster", ("--compute-factor", "1,1,0.5,0.5")),
    # (b) server 0 holds 40 % of the parameters (shares 2:1:1:1) ...
    ("(b) unequal placement", "server 0 holds 2/5 of the parameters", ("--server-shares", "2,1,1,1")),
    # ... or one PS's NIC is half as fast.
    ("(b) slow server link", "server 0's NIC at 5 Gbps", ("--server-bandwidths", "0=5Gbps")),
]
# What the paper states of Fig. 21 in its text: Mercury's largest gains.
FIG21_PAPER = {
    "(a) heterogeneous workers": "over Native-PS up to 93 % and BytePS 37 % (VGG-19); BERT-Base 26 % and 14 %; "
                                 "ResNet-50 none",
    "(b) unequal placement": "Mercury outperforms other methods for all DNN models",
    "(b) slow server link": "Mercury outperforms other methods for all DNN models",
}


def fig21(qs, out_dir):
    data = {(label, m): samples_per_second(qs, m, "gtx1080ti", 10, FIG21_POLICIES, 4, extra)
            for label, _, extra in FIG21_SCENARIOS for m in FIG21_MODELS}
    print("### Fig. 21: samples/s, GTX 1080 Ti, 10 Gbps, 4 workers + 4 PSes\n")
    print("| scenario | model | " + " | ".join(FIG21_POLICIES) + " | mercury / wfbp | mercury / bytescheduler | "
          "mercury / best other |")
    print("|---|---|" + "---|" * (len(FIG21_POLICIES) + 3))
    for label, _, _ in FIG21_SCENARIOS:
        for m in FIG21_MODELS:
            r = data[(label, m)]
            best_other = max(r[p] for p in FIG21_POLICIES if p != "mercury")
            gains = [100 * (r["mercury"] / r[p] - 1) for p in ("wfbp", "bytescheduler")]
            gains.append(100 * (r["mercury"] / best_other - 1))
            print(f"| {label} | {m} | " + " | ".join(f"{r[p]:.0f}" for p in FIG21_POLICIES) + " | " +
                  " | ".join(f"{g:+.0f} %" for g in gains) + " |")
    print()
    for label, what, extra in FIG21_SCENARIOS:
        print(f"- {label}: {what} (`{' '.join(extra)}`)" + (f"; paper: {FIG21_PAPER[label]}" if label in FIG21_PAPER
                                                              else ""))
    print()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(FIG21_SCENARIOS), figsize=(16, 4.2), sharey=True)
    width = 0.8 / len(FIG21_POLICIES)
    for ax, (label, what, _) in zip(axes, FIG21_SCENARIOS):
        for k, p in enumerate(FIG21_POLICIES):
            ax.bar([i + k * width for i in range(len(FIG21_MODELS))],
                   [data[(label, m)][p] / data[(label, m)]["wfbp"] for m in FIG21_MODELS], width, label=p)
        ax.set_xticks([i + width * (len(FIG21_POLICIES) - 1) / 2 for i in range(len(FIG21_MODELS))])
        ax.set_xticklabels(FIG21_MODELS, rotation=30, fontsize=8)
        ax.set_title(f"{label}\n{what}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("speed normalised by Native-PS (wfbp)")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Mercury Fig. 21, simulated: heterogeneous workers and unbalanced servers (GTX 1080 Ti, 10 Gbps)")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/mercury_fig21.png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/quicksilver")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--only", choices=["fig11", "fig12", "fig13", "fig17", "fig20", "fig21"])
    a = ap.parse_args()
    policies = available(a.bin)
    if a.only in (None, "fig11"):
        fig11(a.bin, policies, a.out)
    if a.only in (None, "fig12"):
        fig12(a.bin, policies, a.out)
    if a.only in (None, "fig13"):
        fig13(a.bin, a.out)
    if a.only in (None, "fig17"):
        fig17(a.bin, a.out)
    if a.only in (None, "fig20"):
        fig20(a.bin, a.out)
    if a.only in (None, "fig21"):
        fig21(a.bin, a.out)


if __name__ == "__main__":
    main()
