"""What torch.compile costs or gains under quicksilver.torch (torch >= 2.0): the same model
trained eager and compiled in one run, each through the same policy, printing the first
iteration (which compiles) and the median of the measured ones. The integration's hooks
run outside the compiled graphs (a graph break at each layer with parameters), so a
compiled model runs as one graph per layer.

    ./build/quicksilver run --workers 2 --script bench/pytorch_compile.py --model digits
    ./build/quicksilver run --workers 2 --script bench/pytorch_compile.py --model resnet18 --batch 8
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import models  # noqa: E402
import quicksilver.torch as qs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="digits", choices=["digits", "resnet18"])
ap.add_argument("--policy", default="mercury")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--iterations", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
args = ap.parse_args()
if not hasattr(torch, "compile"):
    sys.exit("torch.compile needs torch >= 2.0; this is torch " + torch.__version__)

torch.set_num_threads(1)
qs.init()
x, y = models.data(args.model)
loss_fn = torch.nn.CrossEntropyLoss()
rows = []
for mode in ("eager", "compiled"):
    torch.manual_seed(0)
    model = models.make(args.model)
    opt = qs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model,
                                  policy=args.policy)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)
    run = torch.compile(model) if mode == "compiled" else model
    times = []
    for it in range(args.iterations):
        xb, yb = models.batch(x, y, it, qs.rank(), qs.size(), args.batch)
        start = time.perf_counter()
        opt.zero_grad()
        loss_fn(run(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    opt.shutdown()
    rows.append((mode, times[0] * 1e3, statistics.median(times[args.warmup:]) * 1e3))
if qs.rank() == 0:
    print("torch {}, {} x{} per worker, {} workers, {}".format(torch.__version__, args.model, args.batch, qs.size(),
                                                               args.policy))
    print("{:<10} {:>16} {:>14}".format("mode", "first iter (ms)", "median (ms)"))
    for mode, first, median in rows:
        print("{:<10} {:>16.1f} {:>14.2f}".format(mode, first, median))
    print("compiled / eager (median): {:.2f}".format(rows[1][2] / rows[0][2]))
