"""Stage (c) of bench/gpu_check.sh: what staging a gradient costs on this GPU.

1. Pinned copy bandwidth, device to host and host to device, per size (the median of 5
   copies, timed with CUDA events): the rate at which quicksilver/staging.py can hand
   gradients to the transport and sums back.
2. The delay of the most urgent gradient behind a large copy (Mercury's question, asked of
   the staging as the transport benchmarks ask it of a packet): a small gradient (the
   first layer's: most urgent, produced last in the backward pass) is handed to Staging
   right after a large one; the time from its to_wire() to the session being told
   (ready), against the same small gradient handed over alone. The median of 9.

    PYTHONPATH=build/python python3 bench/gpu_copy.py
"""
import argparse
import statistics
import threading
import time

import torch

from quicksilver.staging import Staging

ap = argparse.ArgumentParser()
ap.add_argument("--sizes-mb", default="1,4,16,64,256")
ap.add_argument("--large-mb", type=float, default=100.0, help="the large gradient in front (float32 MB)")
ap.add_argument("--small-kb", type=float, default=16.0)
args = ap.parse_args()

if not torch.cuda.is_available():
    raise SystemExit("gpu_copy: no CUDA device here (torch.cuda.is_available() is False)")
dev = torch.device("cuda", 0)
print("gpu_copy: {}, torch {}".format(torch.cuda.get_device_name(dev), torch.__version__))
print("  pinned copies (median of 5, CUDA events):")
print("  {:>8}  {:>12}  {:>12}".format("MB", "D2H GB/s", "H2D GB/s"))
for mb in [float(v) for v in args.sizes_mb.split(",")]:
    n = int(mb * 2**20 / 4)
    d = torch.ones(n, device=dev)
    h = torch.empty(n, pin_memory=True)
    rates = {}
    for name, dst, src in (("d2h", h, d), ("h2d", d, h)):
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        rates[name] = n * 4 / statistics.median(times) / 1e9
    print("  {:>8.0f}  {:>12.1f}  {:>12.1f}".format(mb, rates["d2h"], rates["h2d"]))

large = torch.nn.Parameter(torch.ones(int(args.large_mb * 2**20 / 4), device=dev))
small = torch.nn.Parameter(torch.ones(int(args.small_kb * 1024 / 4), device=dev))
told = {}
cv = threading.Condition()


def ready(t):
    with cv:
        told[t] = time.perf_counter()
        cv.notify_all()


staging = Staging([small, large], ready)  # tensor 0: the urgent one


def delay(behind):
    with cv:
        told.clear()
    torch.cuda.synchronize()
    if behind:
        staging.to_wire(1, large)
    start = time.perf_counter()
    staging.to_wire(0, small)
    with cv:
        cv.wait_for(lambda: 0 in told and (not behind or 1 in told), timeout=10)
    return (told[0] - start) * 1e3


for _ in range(2):
    delay(False), delay(True)
alone = statistics.median(delay(False) for _ in range(9))
behind = statistics.median(delay(True) for _ in range(9))
staging.close()
print("  urgent {:.0f} KB gradient, from to_wire() to the session told: alone {:.3f} ms, behind a {:.0f} MB copy "
      "{:.3f} ms (+{:.3f} ms; that copy alone at the D2H rate above)".format(
          args.small_kb, alone, args.large_mb, behind, behind - alone))
