"""One markdown table from the output of bench/pytorch_netns.sh: a row per model, hosts and
link rate; per mode, its fraction of the limit and its ratio to DDP; for DeFT also the
share of the window's gradients its updates applied (below 1: it fell behind).

    bash bench/pytorch_netns.sh > matrix.txt; python3 bench/pytorch_summary.py matrix.txt   # the first as root
"""
import re
import sys

HEAD = re.compile(r"^=== (\S+), (\d+) hosts at (\S+)")
LIMIT = re.compile(r"^  limit ([\d.]+) samples/s")
MODE = re.compile(r"^  (\S+(?: again)?)\s+([\d.]+) samples/s\s+([\d.]+) of the limit")
APPLIED = re.compile(r"updates: ([\d.]+) per layer per iteration, each of ([\d.]+) iterations.*; ([\d.]+) of the window")

runs, run, last = [], None, None
for line in open(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdin"):
    line = line.rstrip("\n")
    if m := HEAD.match(line):
        run = {"config": (m.group(1), int(m.group(2)), m.group(3)), "modes": {}, "applied": {}}
        runs.append(run)
    elif run is None:
        continue
    elif m := LIMIT.match(line):
        run["limit"] = float(m.group(1))
    elif m := MODE.match(line):
        last = m.group(1)
        run["modes"][last] = (float(m.group(2)), float(m.group(3)))
    elif m := APPLIED.search(line):
        run["applied"][last] = float(m.group(3))

policies = []
for r in runs:
    for m in r["modes"]:
        if m not in ("alone", "ddp", "ddp again") and m not in policies:
            policies.append(m)
print("| model | hosts | link | limit (samples/s) | DDP: of the limit | " +
      " | ".join("{}: of the limit, x DDP".format(p) for p in policies) + " |")
print("|---" * (5 + len(policies)) + "|")
for r in runs:
    modes = r["modes"]
    if "ddp" not in modes:
        continue
    ddp = [modes[m] for m in ("ddp", "ddp again") if m in modes]
    mean = sum(d[0] for d in ddp) / len(ddp)
    cells = []
    for p in policies:
        if p not in modes:
            cells.append("")
            continue
        sps, frac = modes[p]
        cell = "{:.2f}, {:.2f}x".format(frac, sps / mean)
        if p in r["applied"]:
            cell += " (applied {:.2f})".format(r["applied"][p])
        cells.append(cell)
    model, hosts, rate = r["config"]
    print("| {} | {} | {} | {:.1f} | {} | {} |".format(model, hosts, rate, r.get("limit", 0),
                                                      " to ".join("{:.2f}".format(d[1]) for d in ddp),
                                                      " | ".join(cells)))
