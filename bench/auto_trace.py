"""One mode's run under a moving link rate (issue 30, item 3b; bench/auto_trace.sh starts one
`quicksilver run --netns --bandwidth-trace` per mode, so that every mode sees the trace from
the same moment: the processes' start). Trains `--model` with `--mode` (a policy, "auto",
"POLICY:ARCHITECTURE", or "ddp") for `--seconds` of wall time and prints the samples per
second over all workers between `--from` seconds and the end: the same stretch of the trace
for every mode. Rank 0 prints one line: "MODE SAMPLES/S ITERATIONS"."""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quicksilver.torch as qs  # noqa: E402
from torch_models import make_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet18")
ap.add_argument("--mode", required=True)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seconds", type=float, default=60.0)
ap.add_argument("--from", dest="start", type=float, default=10.0)
ap.add_argument("--replan-every", type=int, default=None)
args = ap.parse_args()

t_launch = time.monotonic()  # about the trace's time 0 (the launcher forked us just now)
torch.set_num_threads(1)
qs.init()
torch.manual_seed(0)
model, shape = make_model(args.model)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
if args.mode == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
else:
    policy, _, architecture = args.mode.partition(":")
    extra = {"replan_every": args.replan_every} if policy == "auto" and args.replan_every else {}
    opt = qs.DistributedOptimizer(opt, model, policy=policy, architecture=architecture or None, **extra)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.rand(args.batch, *shape)
y = torch.randint(0, 10, (args.batch,))
loss_fn = nn.CrossEntropyLoss()
counted, first = 0, None
stop = torch.zeros(1)
while True:
    now = time.monotonic() - t_launch
    # Every rank ends at the same iteration: rank 0's clock decides, broadcast each step.
    stop[0] = 1.0 if now >= args.seconds else 0.0
    torch.distributed.broadcast(stop, 0)
    if stop.item():
        break
    if now >= args.start:
        if first is None:
            first = time.monotonic()
        else:
            counted += 1
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
took = time.monotonic() - first if first else float("nan")
if args.mode != "ddp":
    opt.synchronize()
    opt.shutdown()
if qs.rank() == 0:
    print("{} {:.2f} {}".format(args.mode, counted * args.batch * qs.size() / took, counted), flush=True)
