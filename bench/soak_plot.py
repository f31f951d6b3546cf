#!/usr/bin/env python3
"""Figures and plot of a soak run (bench/soak.sh): for each policy, every process's
resident memory and descriptors over time, and every iteration's time over time (with a
running median); printed: start and end RSS and descriptors per process, the iteration
time in the first and the last fifth of the run, and whether every sum was checked exact.

    /usr/bin/python3 bench/soak_plot.py OUT_DIR PERIOD POLICY...

Writes docs/img/soak.png (beside this script's ../docs/img)."""
import csv
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rate_mbps(text):
    m = re.match(r"([\d.]+)(G|M)bps", text)
    return float(m.group(1)) * (1000 if m.group(2) == "G" else 1)


def load_trace(path):
    segs = []
    for line in open(path):
        t, r = line.split()
        segs.append((float(t.rstrip("s")), rate_mbps(r)))
    return segs


def main():
    out, period, policies = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    segs = load_trace(os.path.join(out, "trace.txt"))
    fig, axes = plt.subplots(3, len(policies), figsize=(7 * len(policies), 10), squeeze=False)
    for col, policy in enumerate(policies):
        try:
            doc = json.load(open(os.path.join(out, policy + ".json")))
        except (OSError, ValueError):
            print("%s: no result (%s)" % (policy, open(os.path.join(out, policy + ".err")).read().strip()[-300:]))
            continue
        r = doc["results"][0]
        its = r["iterations_ms"]
        exact = [n for n in r.get("notes", []) if "iterations verified exact" in n]
        counts = [int(n.split(": ")[1].split()[0]) for n in exact]
        # Iteration k's end, in seconds from the first backward pass (the trace's time 0,
        # give or take the rendezvous: the launcher starts the trace with the workers).
        ends, t = [], 0.0
        for ms in its:
            t += ms / 1000
            ends.append(t)
        # Samples: per process.
        procs = {}
        for row in csv.DictReader(open(os.path.join(out, policy + ".samples.csv"))):
            procs.setdefault(row["process"], []).append((float(row["t_s"]), int(row["rss_kb"]) / 1024, int(row["fds"])))
        print("== %s: %d iterations in %.0f s; sums checked exact: %s (of %d each)"
              % (policy, len(its), ends[-1] if ends else 0, ", ".join(map(str, counts)) or "none", len(its)))
        print("   %-12s %10s %10s %10s %8s %8s %8s" % ("process", "RSS@10s", "RSS end", "RSS max", "fds@10s", "fds end", "fds max"))
        for name in sorted(procs):
            s = procs[name]
            settled = [x for x in s if x[0] >= 10] or s  # after the rendezvous and calibration
            print("   %-12s %8.1f MB %7.1f MB %7.1f MB %8d %8d %8d" % (
                name, settled[0][1], s[-1][1], max(x[1] for x in s), settled[0][2], s[-1][2], max(x[2] for x in s)))
        # Iteration time early and late: the first and the last fifth of the run each span
        # many cycles of the rates, so their medians and 90th percentiles compare like with
        # like (the iterations' times are not aligned to the trace's: an all-reduce job
        # calibrates for seconds after the rates start changing).
        n = len(its)
        if n >= 50:
            first, last = sorted(its[: n // 5]), sorted(its[n - n // 5:])
            p90 = lambda v: v[int(0.9 * (len(v) - 1))]
            e50, l50, e90, l90 = statistics.median(first), statistics.median(last), p90(first), p90(last)
            print("   iteration time, first / last fifth: median %.1f / %.1f ms (%+.1f%%), p90 %.1f / %.1f ms (%+.1f%%), "
                  "max %.0f ms" % (e50, l50, 100 * (l50 - e50) / e50, e90, l90, 100 * (l90 - e90) / e90, max(its)))
        ax_rss, ax_fd, ax_it = axes[0][col], axes[1][col], axes[2][col]
        for name in sorted(procs):
            s = procs[name]
            ax_rss.plot([x[0] for x in s], [x[1] for x in s], label=name)
            ax_fd.plot([x[0] for x in s], [x[2] for x in s], label=name)
        ax_rss.set_title("%s: resident memory per process" % policy)
        ax_rss.set_ylabel("RSS (MB)")
        ax_rss.set_ylim(bottom=0)
        ax_rss.legend(fontsize=7, ncol=3)
        ax_fd.set_title("%s: open descriptors per process" % policy)
        ax_fd.set_ylabel("descriptors")
        ax_fd.set_ylim(bottom=0)
        ax_fd.legend(fontsize=7, ncol=3)
        ax_it.plot(ends, its, ".", markersize=1.5, color="tab:blue", label="iteration")
        w = 101
        if n > w:
            roll = [statistics.median(its[k - w // 2:k + w // 2 + 1]) for k in range(w // 2, n - w // 2)]
            ax_it.plot(ends[w // 2:n - w // 2], roll, color="black", linewidth=1, label="median of %d" % w)
        ax_it.set_yscale("log")
        ax_it.set_title("%s: iteration time (the slowest worker's), %d iterations" % (policy, n))
        ax_it.set_xlabel("time since the first backward pass (s); the rate changes every %g s" % period)
        ax_it.set_ylabel("iteration (ms)")
        ax_it.legend(fontsize=7)
        for ax in (ax_rss, ax_fd):
            ax.set_xlabel("time since the launcher started (s)")
    fig.tight_layout()
    dest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "img", "soak.png")
    fig.savefig(dest, dpi=90)
    print("plot: docs/img/soak.png")


if __name__ == "__main__":
    main()
