"""GPU training through quicksilver.torch (issue 29, stages (a) and (b) of bench/gpu_check.sh):
N ranks sharing one CUDA device, torchvision's ResNet-18 with GroupNorm (BatchNorm would
make one process on the concatenated batch another function), its gradients staged
through pinned host buffers (quicksilver/staging.py).

(a) exactness, per policy: TF32 off, deterministic algorithms on; each rank trains
    --steps steps on its own batch; rank 0's parameters (read with model.state_dict()
    right after the loop, as a user does) against one process trained on the
    concatenated batches (synchronous policies; the tolerance is --tolerance), and every
    rank's parameters against rank 0's, bit for bit (a CRC32C of each, all-gathered).
(b) speed: samples/s over all ranks of each policy against DistributedDataParallel with
    the gloo backend on the same GPU and ranks (NCCL refuses two ranks on one GPU), and
    "alone" (no communication: the compute the ranks share), with the GPU's idle share
    (nvidia-smi's utilisation, sampled every 100 ms while the mode runs).

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/gpu_train.py
"""
import argparse
import os
import subprocess
import sys
import time
import warnings
import zlib

import torch
import torch.nn as nn

import quicksilver.torch as qs

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import models  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--policies", default="mercury,bytescheduler,wfbp,mgwfbp,deft,auto")
ap.add_argument("--stages", default="exact,speed")
ap.add_argument("--steps", type=int, default=4, help="(a): steps trained per policy")
ap.add_argument("--batch", type=int, default=16, help="samples per rank")
ap.add_argument("--size", type=int, default=64, help="image side")
ap.add_argument("--tolerance", type=float, default=5e-4, help="(a): rank 0 against one process, max |difference|")
ap.add_argument("--iterations", type=int, default=10, help="(b): measured iterations, after --warmup")
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--device", default="cuda", help="cuda (every rank on GPU 0), or cpu: the same script without a GPU")
args = ap.parse_args()

qs.init()
rank, size = qs.rank(), qs.size()
CUDA = args.device == "cuda"
device = torch.device("cuda", 0) if CUDA else torch.device("cpu")  # every rank on the one GPU
if CUDA:
    torch.cuda.set_device(device)
else:
    torch.set_num_threads(1)


def sync():
    if CUDA:
        torch.cuda.synchronize()
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = False
# warn_only: adaptive_avg_pool2d's CUDA backward has no deterministic kernel (its atomics
# change a local gradient's last bits; every rank still applies the same sums).
torch.use_deterministic_algorithms(True, warn_only=True)
warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")


def say(text):
    if rank == 0:
        print(text, flush=True)


def data(step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.rand(args.batch, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    return x.to(device), y.to(device)


def fresh():
    torch.manual_seed(0)
    model = models.resnet18().to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def exact(policy):
    model, opt = fresh()
    # auto: a decision every step (QS_AUTO_SCHEDULE, set by bench/gpu_check.sh, makes it
    # switch at step 3: the CUDA staging carried across a session's close and open).
    extra = {"replan_every": 1} if policy == "auto" else {}
    opt = qs.DistributedOptimizer(opt, model, policy=policy, check_consistency=1, **extra)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        opt.zero_grad()
        x, y = data(step, rank)
        loss_fn(model(x), y).backward()
        opt.step()
    if policy == "deft":  # its last updates are held back until shutdown
        opt.shutdown()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt.shutdown()
    digests = torch.tensor([zlib.crc32(v.cpu().numpy().tobytes()) for v in state.values()], dtype=torch.int64)
    gathered = [torch.empty_like(digests) for _ in range(size)]
    torch.distributed.all_gather(gathered, digests)
    differ = [r for r in range(1, size) if not torch.equal(gathered[r], gathered[0])]
    return state, differ


def reference():
    """One process on the concatenated batches (each step: every rank's batch, in order)."""
    model, opt = fresh()
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        opt.zero_grad()
        parts = [data(step, r) for r in range(size)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        loss_fn(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Utilisation:
    """nvidia-smi's GPU utilisation, sampled every 100 ms (rank 0), while a mode runs."""

    def __init__(self):
        self.p = None
        if rank == 0 and CUDA:
            try:
                self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                           "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.p = None

    def idle(self):
        if self.p is None:
            return None
        self.p.terminate()
        out, _ = self.p.communicate()
        samples = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]
        return 1 - sum(samples) / len(samples) / 100 if samples else None


def speed(mode):
    model, opt = fresh()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if CUDA else None)
    elif mode != "alone":
        opt = qs.DistributedOptimizer(opt, model, policy=mode)
        qs.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = data(0, rank)
    loss_fn = nn.CrossEntropyLoss()
    end = args.warmup + args.iterations
    use = None
    for it in range(end + 2):
        if it == args.warmup:
            sync()
            torch.distributed.barrier()
            use = Utilisation()
            start = time.perf_counter()
        if it == end:
            sync()
            took = time.perf_counter() - start
            idle = use.idle()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    if mode not in ("ddp", "alone"):
        opt.shutdown()
    sync()
    torch.distributed.barrier()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    return args.iterations * args.batch * size / took, idle


policies = args.policies.split(",")
stages = args.stages.split(",")
say("gpu_train: {} ranks on {} ({}), torch {}, ResNet-18 with GroupNorm, batch {} per rank, {}x{} images".format(
    size, torch.cuda.get_device_name(device) if CUDA else "the CPU", device, torch.__version__, args.batch, args.size, args.size))
failed = 0
if "exact" in stages:
    ref = reference() if rank == 0 else None
    start_state = fresh()[0].state_dict() if rank == 0 else None
    for policy in policies:
        try:
            state, differ = exact(policy)
            line = "  (a) {:<14}".format(policy)
            if differ:
                failed += 1
                line += " FAIL: rank(s) {} differ from rank 0".format(differ)
            else:
                line += " ranks bit-identical"
            if ref is not None:
                diff = max((state[k].float() - ref[k].float()).abs().max().item() for k in ref)
                moved = max((ref[k].float() - start_state[k].float()).abs().max().item() for k in ref)
                if policy == "deft":
                    line += "; rank 0 vs one process {:.1e} (delayed updates: another optimisation, not compared)"\
                        .format(diff)
                else:
                    ok = diff <= args.tolerance
                    failed += 0 if ok else 1
                    line += "; rank 0 vs one process {:.1e} ({} tolerance {:.0e}; parameters moved {:.1e})".format(
                        diff, "within" if ok else "FAIL: above", args.tolerance, moved)
            say(line)
        except Exception as e:  # report and go on: the other policies still say something
            failed += 1
            say("  (a) {:<14} FAIL: {}: {}".format(policy, type(e).__name__, str(e)[:300]))
if "speed" in stages:
    results = {}
    for mode in ["alone", "ddp"] + policies + ["ddp again"]:
        try:
            results[mode] = speed(mode.split()[0])
        except Exception as e:
            failed += 1
            say("  (b) {:<14} FAIL: {}: {}".format(mode, type(e).__name__, str(e)[:300]))
    ddp = [results[m][0] for m in ("ddp", "ddp again") if m in results]
    ddp = sum(ddp) / len(ddp) if ddp else None
    for mode, (sps, idle) in results.items():
        ratio = "" if mode.startswith("ddp") or mode == "alone" or not ddp else "  {:.2f}x DDP-gloo".format(sps / ddp)
        say("  (b) {:<14} {:8.1f} samples/s  GPU idle {}{}".format(
            mode, sps, "n/a" if idle is None else "{:.0%}".format(idle), ratio))
say("gpu_train: {} ranks: {}".format(size, "all passed" if not failed else "{} FAILED".format(failed)))
sys.exit(1 if failed else 0)
