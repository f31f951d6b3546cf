"""Time to accuracy on sklearn's digits (DeFT's Fig. 10, at this machine's scale): the
digits CNN (--model cnn) or torchvision's ResNet-18 on the digits upsampled to 3x32x32
(--model resnet18) trained by DistributedDataParallel (gloo) and by Quicksilver policies
in the same run, each from the same initial parameters on the same batches, and the wall time
(evaluation excluded) until the test accuracy first reaches --target, with the final
accuracy after --epochs. Run as N processes:

    ./build/quicksilver run --netns --bandwidth 200Mbps --workers 2 \\
        --script bench/time_to_accuracy.py --policies deft,mercury
    ./build/quicksilver run --netns --bandwidth 200Mbps --workers 2 \\
        --script bench/time_to_accuracy.py --policies mercury,mercury+bf16,mercury+fp16

Rank 0 prints one line per mode: seconds to the target (or "not reached"), final test
accuracy, iterations, parameter updates per iteration (DeFT merges iterations).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

import quicksilver.torch as qs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import models  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="cnn", choices=["cnn", "resnet18"])
ap.add_argument("--policies", default="deft,mercury",
                help="modes beside DDP: a policy, or POLICY+bf16 / POLICY+fp16 (compressed gradients)")
ap.add_argument("--batch", type=int, default=16, help="per worker")
ap.add_argument("--epochs", type=int, default=6)
ap.add_argument("--lr", type=float, default=0.05)
ap.add_argument("--momentum", type=float, default=0.9)
ap.add_argument("--target", type=float, default=0.95, help="test accuracy")
ap.add_argument("--eval-every", type=int, default=5, help="iterations")
ap.add_argument("--csv", default="", help="rank 0 writes every evaluation here: mode,seconds,iteration,accuracy")
ap.add_argument("--knobs", default="", help="k=v,... for the Quicksilver policies (e.g. deft_capacity_scale=0.5)")
args = ap.parse_args()


def make_model():
    if args.model == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    return models.DigitsCNN()


def split():
    x, y = models.digits()
    if args.model == "resnet18":  # 1x8x8 -> 3x32x32, as ResNet-18's stem expects images
        x = nn.functional.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    g = torch.Generator().manual_seed(7)
    order = torch.randperm(len(x), generator=g)
    test = order[:297]
    train = order[297:]
    return x[train], y[train], x[test], y[test]


def accuracy(model, x, y):
    was = model.training
    model.eval()  # batch norm: the running statistics
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train(was)
    return acc


def knobs():
    out = {}
    for kv in filter(None, args.knobs.split(",")):
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def train(mode, data):
    xtr, ytr, xte, yte = data
    torch.manual_seed(0)
    model = make_model()
    net = model
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if mode == "ddp":
        net = nn.parallel.DistributedDataParallel(model)
    else:  # POLICY or POLICY+bf16 / POLICY+fp16: compressed gradients on the wire
        policy, _, wire = mode.partition("+")
        opt = qs.DistributedOptimizer(opt, model, policy=policy, compression=wire or None, **knobs())
    loss_fn = nn.CrossEntropyLoss()
    n, r = qs.size(), qs.rank()
    per_iteration = args.batch * n
    iterations = args.epochs * len(xtr) // per_iteration
    g = torch.Generator().manual_seed(11)
    order = torch.cat([torch.randperm(len(xtr), generator=g) for _ in range(args.epochs + 1)])
    reached = None
    curve = []
    clock = 0.0
    torch.distributed.barrier()
    for it in range(iterations):
        start = time.perf_counter()
        idx = order[it * per_iteration + r * args.batch: it * per_iteration + (r + 1) * args.batch]
        opt.zero_grad()
        loss_fn(net(xtr[idx]), ytr[idx]).backward()
        opt.step()
        clock += time.perf_counter() - start
        if (it + 1) % args.eval_every == 0:
            # Every rank evaluates its own copy (equal on every rank) on the test split, out
            # of the clock; under DeFT the parameters are those its schedule has applied.
            acc = accuracy(model, xte, yte)
            curve.append((clock, it + 1, acc))
            if reached is None and acc >= args.target:
                reached = (clock, it + 1)
    updates, notes = None, []
    if mode != "ddp":
        start = time.perf_counter()
        report = opt.shutdown()  # DeFT: its updates still held back
        notes = [n for n in report.get("notes", []) if n.startswith(("update frequency", "Preserver", "link 0"))]
        clock += time.perf_counter() - start
        log = opt.quicksilver_updates()
        if log:
            updates = len({(u[2], u[3]) for u in log}) / iterations
    final = accuracy(model, xte, yte)
    times = torch.tensor([clock, reached[0] if reached else float("inf")])
    torch.distributed.all_reduce(times, op=torch.distributed.ReduceOp.MAX)
    curve.append((clock, iterations, final))
    return times[0].item(), times[1].item(), reached[1] if reached else None, final, iterations, updates, notes, curve


torch.set_num_threads(1)
qs.init()
if qs.size() < 2:
    sys.exit("run as 2 or more processes (quicksilver run --workers N --script ...)")
data = split()
modes = ["ddp"] + args.policies.split(",") + ["ddp"]
rows = [(m, train(m, data)) for m in modes]
if qs.rank() == 0:
    print("{} on digits: {} workers, batch {} each, {} epochs of {} samples, SGD lr {} momentum {}; target test "
          "accuracy {:.2f} (checked every {} iterations, out of the clock)".format(
              "ResNet-18" if args.model == "resnet18" else "the CNN", qs.size(), args.batch, args.epochs,
              len(data[0]), args.lr, args.momentum, args.target, args.eval_every))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("mode,seconds,iteration,accuracy\n")
            for i, (m, row) in enumerate(rows):
                label = "ddp again" if m == "ddp" and i > 0 else m
                for t, it, acc in row[7]:
                    f.write("{},{:.4f},{},{:.4f}\n".format(label, t, it, acc))
    for m, (total, to_target, at, final, iterations, updates, notes, _) in rows:
        reach = "{:7.2f} s (iteration {})".format(to_target, at) if at else "not reached"
        upd = "" if updates is None else "  updates per iteration {:.2f}".format(updates)
        print("  {:<14} to {:.2f}: {:<26} final accuracy {:.4f} after {} iterations, {:.2f} s{}".format(
            m, args.target, reach, final, iterations, total, upd))
        for n in notes:
            print("      " + n)
