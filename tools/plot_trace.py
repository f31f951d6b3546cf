#!/usr/bin/env python3
"""Draws a Chrome trace written by `quicksilver simulate --trace` as a timeline (PNG/SVG).

One row per (policy, worker, track): compute, uplink, downlink; one colour per layer, so
that a reader sees which layer's gradient occupies the link while which layer computes.

Usage: "$(bash scripts/python.sh --no-torch)" tools/plot_trace.py TRACE.json -o timeline.png [--workers 1] [--until-ms 50]
"""
import argparse
import json
import re


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--out", default="timeline.png")
    ap.add_argument("--workers", type=int, default=1, help="workers per policy to draw")
    ap.add_argument("--until-ms", type=float, default=None, help="cut the x axis here")
    a = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = json.load(open(a.trace))["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
    rows, labels = {}, []
    tracks = ["compute", "uplink", "downlink"]
    for pid in sorted(names):
        m = re.match(r"(.*) worker (\d+)$", names[pid])
        if not m or int(m.group(2)) >= a.workers:
            continue
        for tid, t in enumerate(tracks):
            rows[(pid, tid)] = len(labels)
            labels.append(f"{m.group(1)} w{m.group(2)} {t}")
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(labels) + 1.2))
    for e in events:
        if e.get("ph") != "X" or (e["pid"], e["tid"]) not in rows:
            continue
        m = re.search(r"(\d+)$", e["name"])
        colour = cmap(int(m.group(1)) % 20) if m else "grey"
        if e["tid"] == 0:  # compute spans are named "bp LAYER" / "fp LAYER": colour by kind
            colour = "#4c72b0" if e["name"].startswith("bp") else "#55a868"
        y = rows[(e["pid"], e["tid"])]
        ax.barh(y, e["dur"] / 1000, left=e["ts"] / 1000, height=0.8, color=colour, edgecolor="none")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    if a.until_ms:
        ax.set_xlim(0, a.until_ms)
    ax.set_title("compute: blue = backward, green = forward; links: one colour per tensor")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
