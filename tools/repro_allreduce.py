#!/usr/bin/env python3
"""Plots the all-reduce reproductions (docs/reproductions.md, section "All-reduce").

Usage: "$(bash scripts/python.sh --no-torch)" tools/repro_allreduce.py BUILD_DIR
Runs BUILD_DIR/bench/allreduce_bench --repro=fig9|table1|fig14, prints the tables and
writes docs/img/mgwfbp_fig9.png and docs/img/deft_fig14.png.
"""
import csv
import io
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(build, what):
    out = subprocess.run([os.path.join(build, "bench", "allreduce_bench"), "--repro=" + what],
                         check=True, capture_output=True, text=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def fig9(rows):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, model in zip(axes, ["googlenet", "resnet50"]):
        for pol, style in [("oracle", "k--"), ("wfbp", "o-"), ("synceasgd", "s-"), ("mgwfbp", "^-"),
                           ("mgwfbp-opt", "x:")]:
            pts = [(int(r["workers"]), float(r["speedup"])) for r in rows if r["model"] == model and r["policy"] == pol]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label="linear" if pol == "oracle" else pol)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model}, K80, 10GbE (simulated)")
        ax.set_xlabel("nodes")
        ax.set_ylabel("speedup over one K80")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "img", "mgwfbp_fig9.png"), dpi=100)


def fig14(rows):
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for i, variant in enumerate(["40gbps", "cr-matched"]):
        for ax, model in zip(axes[i], ["resnet101", "vgg19", "gpt2"]):
            for pol, style in [("oracle", "k--"), ("ddp", "o-"), ("bytescheduler", "s-"), ("usbyte", "^-"),
                               ("deft", "D-"), ("deft-exact", "x--"), ("deft-1link", "d:")]:
                pts = [(int(r["workers"]), float(r["speedup"])) for r in rows
                       if r["variant"] == variant and r["model"] == model and r["policy"] == pol]
                label = {"oracle": "linear", "ddp": "PyTorch DDP"}.get(pol, pol)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
            ax.set_title(f"{model} ({variant})")
            ax.set_xlabel("GPUs")
            ax.set_ylabel("speedup")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "img", "deft_fig14.png"), dpi=100)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    r9 = run(build, "fig9")
    for r in r9:
        if r["workers"] in ("4", "64"):
            print("fig9", r["model"], r["workers"], r["policy"], r["speedup"])
    fig9(r9)
    for r in run(build, "table1"):
        print("table1", r)
    r14 = run(build, "fig14")
    for r in r14:
        if r["workers"] == "16":
            print("fig14", r["variant"], r["model"], r["policy"], r["speedup"], r["update_frequency"])
    fig14(r14)


if __name__ == "__main__":
    main()
