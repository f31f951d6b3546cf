"""quicksilver.torch against torch.nn.parallel.DistributedDataParallel (gloo), in the same
run: real CPU training (one thread per process) of one model, samples/s over all workers
after a warm-up. Run as N processes:

    ./build/quicksilver run --workers 2 --script bench/pytorch_ddp.py --model resnet18
    PYTHONPATH=build/python torchrun --redirects 2 --tee 2 --standalone --nproc_per_node 2 \\
        bench/pytorch_ddp.py --model vgg11

Rank 0 prints the limit (the longer of the compute, measured with no communication, and
the bytes each host must send at the link's measured goodput), then one line per mode:
samples/s, the fraction of the limit, and for each Quicksilver policy the ratio to DDP.
"""
import argparse
import gc
import sys
import time

import torch
import torch.nn as nn

import quicksilver.torch as qs
from torch_models import make_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet18", choices=["resnet18", "vgg11", "digits"])
ap.add_argument("--policies", default="mercury,bytescheduler,wfbp,mgwfbp,deft")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--iterations", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--auto-warmup", type=int, default=None,
                help="policy=auto's warm-up (default --warmup): its first decision and trial before the window")
ap.add_argument("--tail", type=int, default=2, help="iterations trained after the measured ones (not timed)")
ap.add_argument("--probe-mb", type=float, default=16, help="MB each host sends to measure the link's goodput")
args = ap.parse_args()


def cpu_ticks():
    """(idle, total) jiffies of the whole machine (/proc/stat is not per namespace)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def idle_since(t0):
    i1, a1 = cpu_ticks()
    return (i1 - t0[0]) / max(1, a1 - t0[1])


def wire():
    """Communication alone: all-reduces of the model's gradient bytes with gloo (DDP's
    engine), no compute; seconds per all-reduce and the machine's idle share meanwhile."""
    model, _ = make_model(args.model)
    buf = torch.zeros(sum(p.numel() for p in model.parameters()))
    torch.distributed.all_reduce(buf)  # warm-up: connections, buffers
    torch.distributed.barrier()
    t0, start = cpu_ticks(), time.perf_counter()
    for _ in range(2):
        torch.distributed.all_reduce(buf)
    took = (time.perf_counter() - start) / 2
    idle = idle_since(t0)
    torch.distributed.barrier()
    return took, idle


def train(mode):
    """samples/s over all workers in steady state: from the start of the first measured
    iteration's forward pass to the start of the forward pass after the last measured one,
    with more iterations after it (--tail), so that no mode's figure holds the flush of the
    communication still in flight when training ends (DeFT's merged updates keep some in
    flight across iterations by design). Mode "alone": every process trains on its own, no
    communication (the compute the limit is made of, with the processes sharing the machine
    as in the other modes)."""
    torch.manual_seed(0)
    model, shape = make_model(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif mode != "alone":
        # "POLICY:ARCHITECTURE" picks the architecture ("auto:allreduce", "wfbp:allreduce").
        policy, _, architecture = mode.partition(":")
        opt = qs.DistributedOptimizer(opt, model, policy=policy, architecture=architecture or None)
        qs.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.rand(args.batch, *shape)
    y = torch.randint(0, 10, (args.batch,))
    loss_fn = nn.CrossEntropyLoss()
    qs_mode = mode not in ("ddp", "alone")
    warmup = args.auto_warmup if mode.startswith("auto") and args.auto_warmup is not None else args.warmup
    end = warmup + args.iterations
    for it in range(end + args.tail + 1):
        if it == warmup:
            t0, start = cpu_ticks(), time.perf_counter()
        if it == end:
            took = time.perf_counter() - start
            idle = idle_since(t0)
        if it == end + args.tail:
            break
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    merged = None
    if qs_mode:
        opt.synchronize()
        opt.shutdown()  # DeFT: its last updates too
        # DeFT: the delayed updates applied in the measured window (an update applies
        # before the forward pass after `before` backward passes): updates per layer per
        # iteration, the iterations each merged, and the share of the window's gradients
        # they applied (well below 1: the schedule falls behind, holding merged sums back).
        log = opt.quicksilver_updates() if mode == "deft" else None
        if log:
            layers = len({layer for _, layer, _, _ in log})
            ks = [last - first + 1 for before, _, first, last in log
                  if isinstance(before, int) and args.warmup < before <= end]
            cells = layers * args.iterations
            merged = (len(ks) / cells, sum(ks) / len(ks) if ks else 0.0, max(ks, default=0), sum(ks) / cells)
    torch.distributed.barrier()
    return (args.iterations * args.batch * qs.size() / took, sum(p.numel() * 4 for p in model.parameters()), idle,
            merged)


def goodput():
    """Bits/s of one link: rank 0 sends to rank 1 (a host's uplink and its peer's downlink,
    shaped alike), the median of three transfers."""
    r = qs.rank()
    buf = torch.ones(int(args.probe_mb * 2**20 / 4))
    took = []
    for _ in range(3):
        torch.distributed.barrier()
        start = time.perf_counter()
        if r == 0:
            torch.distributed.send(buf, 1)
            torch.distributed.recv(buf[:1], 1)  # rank 1 has all of it
        elif r == 1:
            torch.distributed.recv(buf, 0)
            torch.distributed.send(buf[:1], 0)
        took.append(time.perf_counter() - start)
    t = torch.tensor([sorted(took)[1]])
    torch.distributed.broadcast(t, 0)
    return buf.numel() * 4 * 8 / t.item()


torch.set_num_threads(1)
qs.init()
if qs.size() < 2:
    sys.exit("run as 2 or more processes (quicksilver run --workers N --script ...)")
# DDP first and last: the machine's load drifts (its cores are shared), so the spread of
# the two DDP figures says how far the comparison can be trusted.
modes = ["alone", "ddp"] + args.policies.split(",") + ["ddp again"]
bps = goodput()
wire_alone, wire_idle = wire()
results, idles, merges = {}, {}, {}
for m in modes:
    results[m], model_bytes, idles[m], merges[m] = train(m.split()[0])
    # The mode's model, optimizer and hooks hold reference cycles: free them before the
    # next mode allocates its own (VGG-11 on 4 processes needs 4 x ~3 GB at once).
    gc.collect()
ddp = (results["ddp"] + results["ddp again"]) / 2
n = qs.size()
# The limit: an iteration is no shorter than its compute, nor than the bytes each host
# must send for an all-reduce of the gradients (2 (N-1)/N of them, bandwidth-optimal: ring
# all-reduce, or N co-located parameter servers) at the link's goodput.
compute_s = args.batch * n / results["alone"]
wire_s = 2 * (n - 1) / n * model_bytes * 8 / bps
limit = args.batch * n / max(compute_s, wire_s)
if qs.rank() == 0:
    print("{}: {} workers, batch {} each, {} iterations after {} of warm-up, one thread per process".format(
        args.model, n, args.batch, args.iterations, args.warmup))
    print("  limit {:.1f} samples/s: compute {:.1f} ms per iteration (no communication), {:.1f} MB sent per host "
          "at {:.3f} Gbit/s goodput {:.1f} ms".format(limit, compute_s * 1e3, 2 * (n - 1) / n * model_bytes / 1e6,
                                                      bps / 1e9, wire_s * 1e3))
    # Rank 0's view of the whole machine: below ~10 % idle, CPU bounds the mode, not its schedule.
    print("  communication alone: one gloo all-reduce of the gradients {:.1f} ms, machine {:.0%} idle".format(
        wire_alone * 1e3, wire_idle))
    for m, sps in results.items():
        ratio = "" if m.startswith("ddp") or m == "alone" else "  {:.2f}x DDP (mean of both)".format(sps / ddp)
        if merges[m]:
            ratio += ("\n{:>20} updates: {:.2f} per layer per iteration, each of {:.1f} iterations (at most {}); "
                      "{:.2f} of the window's gradients applied in it").format("", *merges[m])
        # Two decimals: VGG-11 at 1 Gbit/s trains about 5 samples/s, where one decimal is 2 %.
        print("  {:<16} {:9.2f} samples/s  {:.2f} of the limit  machine {:3.0%} idle{}".format(
            m, sps, sps / limit, idles[m], ratio))
