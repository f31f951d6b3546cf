#!/usr/bin/env python3
"""One table from `quicksilver run --netns --json`'s output (bench/gpu_check.sh, stage e):
per policy the measured and predicted iteration, the error, and the evidence for a
difference: the machine's CPU idle share, retransmissions and drops, messages per
iteration, the urgent packet's delay (worker 0's p50/p99).

    python3 bench/cluster_table.py RUN.json
"""
import json
import re
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/cluster_table.py RUN.json (quicksilver run --netns --json's output)")
    try:
        with open(sys.argv[1]) as f:
            run = json.load(f)
        config, results = run["config"], run["results"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("cluster_table: {}: not a `quicksilver run --json` output ({})".format(sys.argv[1], e))
    print("{} workers + {} servers, {} at {:.0f} Mbit/s per host (scale {}); calibration: {}".format(
        config.get("workers"), config.get("servers"), config.get("model"), config.get("bandwidth_bps", 0) / 1e6,
        config.get("scale", "n/a"), config.get("calibration", "n/a")))
    print("{:<14} {:>10} {:>10} {:>7} {:>6} {:>8} {:>9} {:>7} {:>9} {:>17}".format(
        "policy", "iteration", "predicted", "error", "link", "CPU idle", "retr/iter", "drops", "msgs/iter",
        "urgent p50/p99"))
    for r in results:
        retr = r.get("retransmits_per_iteration") or []
        urgent = ""
        for note in r.get("notes", []):
            m = re.search(r"urgent-packet delay p50/p99 ([0-9.]+[mun]?s)/([0-9.]+[mun]?s)", note)
            if m:
                urgent = "{}/{}".format(m.group(1), m.group(2))
                break
        pred = r.get("predicted_iteration_ms")
        print("{:<14} {:>8.1f}ms {:>8}ms {:>6}% {:>5.0f}% {:>7.0f}% {:>9.1f} {:>7} {:>9} {:>17}".format(
            r["policy"], r["iteration_ms"], "n/a" if pred is None else "{:.1f}".format(pred),
            "n/a" if r.get("relative_error") is None else "{:+.1f}".format(100 * r["relative_error"]),
            100 * r.get("link_utilisation", 0), 100 * r.get("cpu_idle", -0.0),
            sum(retr) / len(retr) if retr else 0.0,
            "{}/{}".format(r.get("host_queue_drops", "-"), r.get("switch_drops", "-")),
            r.get("messages_per_iteration", "-"), urgent or "-"))


if __name__ == "__main__":
    main()
