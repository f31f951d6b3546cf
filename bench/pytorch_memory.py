"""Peak memory of training through quicksilver.torch: one model, one policy, a short run,
each process's peak resident set and, from the worker's report, the most gradient copies
and merged sums it held at once (DeFT's delayed updates stage the former and keep the
latter until applied). Run as N processes:

    /usr/bin/time -v ./build/quicksilver run --workers 2 --script bench/pytorch_memory.py \\
        --model vgg11 --policy deft --iterations 30 --knob deft_capacity_scale=0.3

(time -v's "Maximum resident set size" is the largest process's.) Rank 0 prints one line
per rank.
"""
import argparse
import resource

import torch
import torch.nn as nn

import quicksilver.torch as qs
from torch_models import make_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="vgg11", choices=["resnet18", "vgg11", "digits"])
ap.add_argument("--policy", default="deft")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--iterations", type=int, default=30)
ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                help="a policy knob, e.g. deft_capacity_scale=0.3 (DeFT merges more iterations)")
args = ap.parse_args()

torch.set_num_threads(1)
qs.init()
torch.manual_seed(0)
model, shape = make_model(args.model)
model_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
opt = qs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model, policy=args.policy,
                              **dict(k.split("=", 1) for k in args.knob))
qs.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.rand(args.batch, *shape)
y = torch.randint(0, 10, (args.batch,))
loss_fn = nn.CrossEntropyLoss()
for it in range(args.iterations):
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
opt.synchronize()
report = opt.shutdown()
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
line = "rank {}: {} {} x{}: peak RSS {:.0f} MiB (model {:.0f} MiB); {}".format(
    qs.rank(), args.model, args.policy, args.iterations, peak_mb, model_mb,
    "; ".join(n for n in report.get("notes", []) if "staged" in n or "merged" in n or "update frequency" in n))
lines = [None] * qs.size()
torch.distributed.all_gather_object(lines, line)
if qs.rank() == 0:
    print("\n".join(lines))
