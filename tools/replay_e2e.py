#!/usr/bin/env python3
"""Re-predicts the end-to-end tables of docs/benchmarks.md ("End to end on the emulated
cluster", measured 2026-11-21) with the simulator, optionally with extra simulator flags,
to test a model of what the runtime adds (issue 14 point 7; docs/simulator.md).

Usage: python3 tools/replay_e2e.py [build/quicksilver] [extra simulate flags...]
e.g.   python3 tools/replay_e2e.py build/quicksilver --ack-queue 2ms

The runtime scaled bandwidth and tensor sizes together (0.05 for 10 Gbit/s, 0.02 for 25)
and predicted at the measured iperf3 goodput; the same prediction is the unscaled job at
bandwidth x goodput, with Mercury's packet (a transport parameter, not scaled) divided by
the scale. The measured iteration times are copied from docs/benchmarks.md.
"""
import json
import subprocess
import sys

QS = sys.argv[1] if len(sys.argv) > 1 else "build/quicksilver"
EXTRA = sys.argv[2:]
# (model, Gbps, goodput, scale, iterations): docs/benchmarks.md e2e tables (2026-11-21)
SC = [("vgg16", 10, 0.956, 0.05, 6), ("vgg16", 25, 0.956, 0.02, 6), ("resnet50", 10, 0.955, 0.05, 6),
      ("resnet50", 25, 0.954, 0.02, 6), ("alexnet", 10, 0.954, 0.05, 4), ("alexnet", 25, 0.955, 0.02, 4)]
MEAS = {
 ("vgg16",10): dict(wfbp=936.919,p3=978.096,tictac=1062.830,bytescheduler=766.972,prophet=841.659,**{"mercury-nopreempt":603.142},mercury=502.825),
 ("vgg16",25): dict(wfbp=436.861,p3=950.028,tictac=431.032,bytescheduler=315.971,prophet=312.644,**{"mercury-nopreempt":301.807},mercury=305.405),
 ("resnet50",10): dict(wfbp=130.579,p3=262.930,tictac=116.531,bytescheduler=133.309,prophet=167.310,**{"mercury-nopreempt":122.338},mercury=111.135),
 ("resnet50",25): dict(wfbp=90.145,p3=233.419,tictac=90.162,bytescheduler=90.377,prophet=91.005,**{"mercury-nopreempt":90.160},mercury=90.162),
 ("alexnet",25): dict(wfbp=221.646,p3=420.984,tictac=221.633,bytescheduler=221.863,prophet=221.926,**{"mercury-nopreempt":221.555},mercury=221.564),
 ("alexnet",10): dict(wfbp=416.970,p3=434.990,tictac=420.394,bytescheduler=275.927,prophet=288.030,**{"mercury-nopreempt":288.786},mercury=234.812),
}
ALEX25 = None
pols = ["wfbp","p3","tictac","bytescheduler","prophet","mercury-nopreempt","mercury"]
within = {p: 0 for p in pols}; n = 0
rows = []
for model, g, gp, scale, it in SC:
    key = (model, g)
    if key not in MEAS: continue
    n += 1
    out = {}
    for p in pols:
        extra = list(EXTRA)
        if p.startswith("mercury"):
            extra += ["--packet-size", f"{int(32768/scale)}B"]
        cmd = [QS, "simulate", "--model", model, "--policy", p, "--bandwidth", f"{g*gp}Gbps",
               "--iterations", str(it), "--json"] + extra
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["results"][0]
        out[p] = r["iteration_ms"]
    cells = []
    for p in pols:
        m = MEAS[key][p]; e = (out[p]-m)/m*100
        within[p] += abs(e) <= 10
        cells.append(f"{p} {out[p]:.1f} ({e:+.1f}%)")
    print(f"{model} {g}G: " + ", ".join(cells))
print("within 10%:", within, "of", n)
