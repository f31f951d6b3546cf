"""quicksilver.torch against torch.nn.parallel.DistributedDataParallel (gloo), in the same
run: real CPU training (one thread per process) of one model, samples/s over all workers
after a warm-up. Run as N processes:

    ./build/quicksilver run --workers 2 --script bench/pytorch_ddp.py --model resnet18
    PYTHONPATH=build/python torchrun --redirects 2 --tee 2 --standalone --nproc_per_node 2 \\
        bench/pytorch_ddp.py --model vgg11

Rank 0 prints one line per mode and, for each Quicksilver policy, the ratio to DDP.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

import quicksilver.torch as qs

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet18", choices=["resnet18", "vgg11", "digits"])
ap.add_argument("--policies", default="mercury,bytescheduler,wfbp")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--iterations", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
args = ap.parse_args()


def make_model():
    import torchvision
    if args.model == "resnet18":
        return torchvision.models.resnet18(num_classes=10), (3, 64, 64)
    if args.model == "vgg11":
        return torchvision.models.vgg11(num_classes=10), (3, 32, 32)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
    import models
    return models.DigitsCNN(), (1, 8, 8)


def train(mode):
    torch.manual_seed(0)
    model, shape = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        opt = qs.DistributedOptimizer(opt, model, policy=mode)
        qs.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.rand(args.batch, *shape)
    y = torch.randint(0, 10, (args.batch,))
    loss_fn = nn.CrossEntropyLoss()
    for it in range(args.warmup + args.iterations):
        if it == args.warmup:
            if mode != "ddp":
                opt.synchronize()
            torch.distributed.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    if mode != "ddp":
        opt.synchronize()
    took = time.perf_counter() - start
    if mode != "ddp":
        opt.shutdown()
    return args.iterations * args.batch * qs.size() / took


torch.set_num_threads(1)
qs.init()
if qs.size() < 2:
    sys.exit("run as 2 or more processes (quicksilver run --workers N --script ...)")
# DDP first and last: the machine's load drifts (its cores are shared), so the spread of
# the two DDP figures says how far the comparison can be trusted.
modes = ["ddp"] + args.policies.split(",") + ["ddp again"]
results = {m: train(m.split()[0]) for m in modes}
ddp = (results["ddp"] + results["ddp again"]) / 2
if qs.rank() == 0:
    print("{}: {} workers, batch {} each, {} iterations after {} of warm-up, one thread per process".format(
        args.model, qs.size(), args.batch, args.iterations, args.warmup))
    for m, sps in results.items():
        ratio = "" if m.startswith("ddp") else "  {:.2f}x DDP (mean of both)".format(sps / ddp)
        print("  {:<16} {:8.1f} samples/s{}".format(m, sps, ratio))
