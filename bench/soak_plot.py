#!/usr/bin/env python3
"""Figures and plot of a soak run (bench/soak.sh): for each policy, every process's
resident memory and descriptors over time, and every iteration's time over time (with a
running median); printed: start and end RSS and descriptors per process, the iteration
time in the first and the last fifth of the run, and whether every sum was checked exact.

    "$(bash scripts/python.sh --no-torch)" bench/soak_plot.py OUT_DIR PERIOD POLICY...

Writes docs/img/soak.png (beside this script's ../docs/img), or the file $SOAK_PLOT names."""
import bisect
import csv
import json
import math
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


def cyclic_rate(cycle_rates, period, t):
    """The rate at trace time t of a trace that repeats cycle_rates, one every period
    (before time 0 too)."""
    return cycle_rates[int(math.floor(t / period)) % len(cycle_rates)]


def align(cycle_rates, period, ends, its):
    """The offset (s) of the iterations' clock against the trace's: iteration k ended at
    trace time ends[k] + offset. The workers' first backward pass and the first rate do not
    start together (the rendezvous; the tc changes' own delay), by an amount the launcher's
    report does not give: taken as the offset at which the iterations' (log) times follow
    the rate best (their covariance with -log(rate) is largest: slower links, longer
    iterations), searched in steps of 20 ms over one cycle of the rates, centred on 0."""
    cycle = period * len(cycle_rates)
    logs = [math.log(x) for x in its]
    mean = sum(logs) / len(logs)
    best, best_off = None, 0.0
    for step in range(int(cycle / 0.02)):
        off = step * 0.02 - cycle / 2
        xs = [-math.log(cyclic_rate(cycle_rates, period, e + off)) for e in ends]
        mx = sum(xs) / len(xs)
        cov = sum((x - mx) * (lg - mean) for x, lg in zip(xs, logs))
        if best is None or cov > best:
            best, best_off = cov, off
    return best_off


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
        # "Early": the first sample 10 s in (after the rendezvous and calibration); "late":
        # the sample at 95 % of the process's life (the last ones catch it exiting).
        print("   %-12s %10s %10s %10s %8s %8s %8s" % ("process", "RSS early", "RSS late", "RSS max", "fds early",
                                                      "fds late", "fds max"))
        for name in sorted(procs):
            s = procs[name]
            settled = [x for x in s if x[0] >= 10] or s
            late = min(s, key=lambda x: abs(x[0] - (s[0][0] + 0.95 * (s[-1][0] - s[0][0]))))
            print("   %-12s %8.1f MB %7.1f MB %7.1f MB %8d %8d %8d" % (
                name, settled[0][1], late[1], max(x[1] for x in s), settled[0][2], late[2], max(x[2] for x in s)))
        # Iteration time early and late. Where the iterations' times add up to the run's
        # wall time (iterations one after another: the PS runtime), each iteration is
        # placed on the trace and compared at its rate: the median of the iterations that
        # ended while the link had that rate, in the first and in the last fifth of the run.
        # Where they do not (DeFT's delayed updates overlap iterations: their times add up
        # to more than the run), the first and last fifth are compared whole (each spans
        # many cycles of the rates).
        n = len(its)
        off = None
        worker_samples = [x for name in procs if name.startswith("worker") for x in procs[name]]
        wall = (max(x[0] for x in worker_samples) - min(x[0] for x in worker_samples)) if worker_samples else 0
        cycle_rates = [x[1] for x in segs[:len({r for _, r in segs})]]
        if n >= 50:
            print("   iteration times add up to %.0f s; the workers ran %.0f s" % (ends[-1], wall))
            if wall > 0 and 0.9 < ends[-1] / wall < 1.1:
                # Each fifth aligned on its own: the iterations' clock drifts from the wall
                # clock (an iteration's time is its slowest worker's, so their sum runs a
                # little ahead).
                head, tail = range(n // 5), range(n - n // 5, n)
                off_head = align(cycle_rates, period, [ends[k] for k in head], [its[k] for k in head])
                off_tail = align(cycle_rates, period, [ends[k] for k in tail], [its[k] for k in tail])
                off = off_head
                print("   the iterations' clock is %+.2f s (first fifth) and %+.2f s (last) from the trace's"
                      % (off_head, off_tail))
                print("   %-10s %18s %18s %8s" % ("rate", "first fifth (ms)", "last fifth (ms)", "drift"))
                for rate in sorted(set(cycle_rates), reverse=True):
                    at = lambda k, o: cyclic_rate(cycle_rates, period, ends[k] + o)
                    early = [its[k] for k in head if at(k, off_head) == rate]
                    late = [its[k] for k in tail if at(k, off_tail) == rate]
                    if len(early) >= 5 and len(late) >= 5:
                        e, l = statistics.median(early), statistics.median(late)
                        print("   %-10s %12.1f (%4d) %12.1f (%4d) %+7.1f%%" %
                              ("%g Mbps" % rate, e, len(early), l, len(late), 100 * (l - e) / e))
            else:
                first, last = sorted(its[: n // 5]), sorted(its[n - n // 5:])
                p90 = lambda v: v[int(0.9 * (len(v) - 1))]
                e50, l50, e90, l90 = statistics.median(first), statistics.median(last), p90(first), p90(last)
                print("   first / last fifth: median %.1f / %.1f ms (%+.1f%%), p90 %.1f / %.1f ms (%+.1f%%)"
                      % (e50, l50, 100 * (l50 - e50) / e50, e90, l90, 100 * (l90 - e90) / e90))
            print("   all iterations: median %.1f ms, max %.0f ms" % (statistics.median(its), max(its)))
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
        ax_it.set_xlabel("time since the first backward pass (s)")
        ax_it.set_ylabel("iteration (ms)")
        ax_it.legend(fontsize=7, loc="upper left")
        if off is not None:
            ax_rate = ax_it.twinx()
            xs, ys = [], []
            t = -off
            k = 0
            while ends and t < ends[-1]:
                r = cyclic_rate(cycle_rates, period, k * period)
                xs += [t, t + period]
                ys += [r, r]
                t += period
                k += 1
            ax_rate.plot(xs, ys, color="tab:orange", linewidth=0.5, alpha=0.5)
            ax_rate.set_ylabel("link rate (Mbit/s), aligned", color="tab:orange")
            ax_rate.set_ylim(bottom=0)
        for ax in (ax_rss, ax_fd):
            ax.set_xlabel("time since the launcher started (s)")
    fig.tight_layout()
    dest = os.environ.get("SOAK_PLOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                                         "img", "soak.png")
    fig.savefig(dest, dpi=90)
    print("plot:", os.path.relpath(dest))


if __name__ == "__main__":
    main()
