#!/usr/bin/env python3
"""Prophet's Fig. 9-11 from a measured run's trace (`quicksilver run --trace`): per policy,
worker 0's compute utilisation over time (Fig. 9, "GPU utilization"), its network
throughput over time (Fig. 10), and each gradient's wait before its transfer starts and
the transfer itself (Fig. 11), averaged over the iterations after the first.

    ./build/quicksilver run --model resnet50 --policy wfbp,bytescheduler,prophet \\
        --workers 2 --servers 2 --iterations 6 --trace run.json
    "$(bash scripts/python.sh --no-torch)" tools/prophet_figs.py run.json -o docs/img/prophet_fig9_11.png

What the runtime's trace gives: the compute track (one span per layer's forward and
backward step), and the gradients track (one span per tensor and iteration, from the
first push the policy handed to the transport to the last pull of its sum; its name
carries the tensor's bytes and layer). A gradient's wait runs from its layer's backward
step's end (it is ready) to its first push; its transfer from there to its last pull.
Throughput spreads each tensor's bytes evenly over its transfer.
"""
import argparse
import json
import re
import statistics
import sys


def load(path):
    events = json.load(open(path))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    runs = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        m = re.match(r"(.*) measured worker 0$", names.get(e["pid"], ""))
        if not m:
            continue
        r = runs.setdefault(m.group(1), {"compute": [], "grads": []})
        span = (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["name"])  # ms
        if e["tid"] == 0:
            r["compute"].append(span)
        elif e["tid"] == 3:
            r["grads"].append(span)
    return runs


def analyse(run, window_ms):
    compute = sorted(run["compute"])
    grads = sorted(run["grads"])
    if not compute or not grads:
        return None
    # Iterations: a backward pass starts with the first "bp" after a forward ("fp") span.
    starts = [s for i, s in enumerate(compute) if s[2].startswith("bp") and (i == 0 or compute[i - 1][2].startswith("fp"))]
    t0 = starts[1][0] if len(starts) > 1 else compute[0][0]  # the first iteration is warm-up
    t1 = compute[-1][1]
    # Fig. 9: busy share of the compute track per window.
    bins = max(1, int(-(-(t1 - t0) // window_ms)))  # the last window may be partial
    busy = [0.0] * bins

    def spread(a, b, amount, into):
        """Adds `amount`, spread evenly over [a, b), to the windows it overlaps."""
        if b <= a:
            return
        k0 = min(max(int((a - t0) / window_ms), 0), bins - 1)
        k1 = min(max(int((b - t0) / window_ms), 0), bins - 1)
        for k in range(k0, k1 + 1):
            lo = a if k == k0 else t0 + k * window_ms
            hi = b if k == k1 else t0 + (k + 1) * window_ms
            if hi > lo:
                into[k] += amount * (hi - lo) / (b - a)

    for a, b, _ in compute:
        a, b = max(a, t0), min(b, t1)
        spread(a, b, b - a, busy)
    util = [x / window_ms for x in busy]
    # Fig. 10: bytes per window, each tensor's spread over its transfer.
    rate = [0.0] * bins
    total_bytes = 0
    waits, transfers = {}, {}
    bp_end = {}  # layer name -> ends of its backward steps
    for a, b, n in compute:
        if n.startswith("bp "):
            bp_end.setdefault(n[3:], []).append(b)
    for a, b, n in grads:
        m = re.match(r"grad (\d+) (\d+)B (.*)$", n)
        if not m or a < t0:
            continue
        t, size, layer = int(m.group(1)), int(m.group(2)), m.group(3)
        total_bytes += size
        spread(a, b, size, rate)
        ready = max((e for e in bp_end.get(layer, []) if e <= a + 1e-6), default=None)
        if ready is not None:
            waits.setdefault(t, []).append(a - ready)
        transfers.setdefault(t, []).append(b - a)
    mbps = [r / 1e6 / (window_ms / 1e3) for r in rate]
    tensors = sorted(transfers)
    half = tensors[: max(1, len(tensors) // 2)]  # the first half: the high-priority gradients
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    return {
        "util": util, "mbps": mbps, "t0": t0,
        "tensors": tensors,
        "wait": [mean(waits.get(t, [])) for t in tensors],
        "transfer": [mean(transfers[t]) for t in tensors],
        "mean_util": sum(busy) / (t1 - t0),
        "mean_mbps": total_bytes / 1e6 / ((t1 - t0) / 1e3),
        "mean_wait": mean([w for t in tensors for w in waits.get(t, [])]),
        "mean_transfer": mean([x for t in tensors for x in transfers[t]]),
        "mean_wait_high": mean([w for t in half for w in waits.get(t, [])]),
        "mean_transfer_high": mean([x for t in half for x in transfers[t]]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--out", default=None, help="PNG with the three figures")
    ap.add_argument("--window-ms", type=float, default=10.0)
    a = ap.parse_args()
    runs = load(a.trace)
    if not runs:
        sys.exit("{}: no measured worker 0 with a gradients track (a `quicksilver run --trace` of PS policies)"
                 .format(a.trace))
    results = {p: analyse(r, a.window_ms) for p, r in runs.items()}
    results = {p: r for p, r in results.items() if r}
    print("{:<18} {:>9} {:>12} {:>10} {:>12} {:>15} {:>17}".format(
        "policy", "compute", "throughput", "wait", "transfer", "wait (first", "transfer (first"))
    print("{:<18} {:>9} {:>12} {:>10} {:>12} {:>15} {:>17}".format(
        "", "util", "MB/s", "ms", "ms", "half) ms", "half) ms"))
    for p, r in results.items():
        print("{:<18} {:>8.1f}% {:>12.1f} {:>10.2f} {:>12.2f} {:>15.2f} {:>17.2f}".format(
            p, 100 * r["mean_util"], r["mean_mbps"], r["mean_wait"], r["mean_transfer"], r["mean_wait_high"],
            r["mean_transfer_high"]))
    if a.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 3, figsize=(16, 4.2))
        for p, r in results.items():
            xs = [i * a.window_ms for i in range(len(r["util"]))]
            ax[0].plot(xs, [100 * u for u in r["util"]], label=p, lw=1)
            ax[1].plot(xs, r["mbps"], label=p, lw=1)
            ax[2].plot(r["tensors"], r["wait"], ".", ms=3, label=p + " wait")
            ax[2].plot(r["tensors"], r["transfer"], "-", lw=1, label=p + " transfer")
        ax[0].set(title="Fig. 9: compute utilisation (worker 0)", xlabel="ms", ylabel="%")
        ax[1].set(title="Fig. 10: network throughput (worker 0)", xlabel="ms", ylabel="MB/s")
        ax[2].set(title="Fig. 11: per-gradient wait and transfer", xlabel="gradient (0 = first layer)",
                  ylabel="ms", yscale="log")
        for x in ax:
            x.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.out, dpi=110)
        print("wrote " + a.out)


main()
