"""Plots the test accuracy against training time and against iterations, one line per mode,
from the CSV of bench/time_to_accuracy.py --csv (DeFT's Fig. 10 in this project's terms).

    "$(bash scripts/python.sh --no-torch)" bench/tta_plot.py curves.csv docs/img/tta_digits.png [TITLE]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if len(sys.argv) < 3:
    sys.exit("usage: tta_plot.py CURVES.csv OUT.png [TITLE]")
curves = {}
with open(sys.argv[1]) as f:
    for row in csv.DictReader(f):
        curves.setdefault(row["mode"], []).append((float(row["seconds"]), int(row["iteration"]),
                                                   float(row["accuracy"])))
fig, (by_time, by_iteration) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for mode, points in curves.items():
    style = "--" if mode.startswith("ddp") else "-"
    by_time.plot([p[0] for p in points], [p[2] for p in points], style, label=mode)
    by_iteration.plot([p[1] for p in points], [p[2] for p in points], style, label=mode)
by_time.set_xlabel("training time (s, evaluations excluded)")
by_iteration.set_xlabel("iteration")
by_time.set_ylabel("test accuracy")
for ax in (by_time, by_iteration):
    ax.grid(alpha=0.3)
by_iteration.legend(loc="lower right")
if len(sys.argv) > 3:
    fig.suptitle(sys.argv[3])
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("wrote", sys.argv[2])
