"""GPU training through quicksilver.torch (issue 29, stages (a) and (b) of bench/gpu_check.sh):
N ranks sharing one CUDA device, torchvision's ResNet-18 with GroupNorm (BatchNorm would
make one process on the concatenated batch another function), its gradients staged
through pinned host buffers (quicksilver/staging.py).

(a) exactness, per policy: TF32 off, deterministic algorithms on; each rank trains
    --steps steps on its own batch; rank 0's parameters (read with model.state_dict()
    right after the loop, as a user does) against one process trained on the
    concatenated batches (synchronous policies; the tolerance is --tolerance), and every
    rank's parameters against rank 0's, bit for bit (a CRC-32 of each, all-gathered).
    Then the variants (--variants POLICY+VARIANT): compression on the wire (wire-bf16,
    wire-fp16) and a bfloat16 model (params-bf16), each against a reference that rounds
    the same way; mixed precision (amp: autocast + GradScaler with synchronize() and
    skip_synchronize()) against one process under the same autocast and scaler.
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
import idioms  # noqa: E402
import models  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--policies", default="mercury,bytescheduler,wfbp,mgwfbp,deft,auto")
# POLICY+VARIANT: wire-bf16/wire-fp16 (compression= on the wire), amp (torch.autocast fp16
# + GradScaler with synchronize()/skip_synchronize()), params-bf16 (a bfloat16 model).
ap.add_argument("--variants", default="mercury+wire-bf16,mgwfbp+wire-fp16,mercury+amp,mgwfbp+amp,wfbp+params-bf16",
                help="(a): variants checked after the policies, each against its own reference")
ap.add_argument("--speed-variants", default="mercury+wire-bf16,mgwfbp+wire-bf16", help="(b): variants timed too")
ap.add_argument("--stages", default="exact,speed")
ap.add_argument("--steps", type=int, default=4, help="(a): steps trained per policy")
ap.add_argument("--batch", type=int, default=16, help="samples per rank")
ap.add_argument("--size", type=int, default=64, help="image side")
ap.add_argument("--tolerance", type=float, default=5e-4, help="(a): rank 0 against one process, max |difference|")
ap.add_argument("--amp-tolerance", type=float, default=5e-3,
                help="(a) amp: float16 activations of a batch of B against one of N*B: another rounding")
ap.add_argument("--bf16-tolerance", type=float, default=2e-3,
                help="(a) params-bf16: about one bfloat16 step of a parameter near 0.3")
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


def fresh(dtype=torch.float32):
    torch.manual_seed(0)
    model = models.resnet18().to(device=device, dtype=dtype)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


WIRE = {"wire-bf16": torch.bfloat16, "wire-fp16": torch.float16}


def split(name):
    """'mercury+amp' -> ('mercury', 'amp'); 'wfbp' -> ('wfbp', '')."""
    policy, _, variant = name.partition("+")
    if variant not in ("", "amp", "params-bf16") and variant not in WIRE:
        raise SystemExit("gpu_train: unknown variant {!r} in {!r}: give wire-bf16, wire-fp16, amp or params-bf16"
                         .format(variant, name))
    if variant == "amp" and not hasattr(getattr(torch, "amp", None), "GradScaler"):
        raise SystemExit("gpu_train: {!r} needs torch.amp.GradScaler (torch >= 2.3); this is torch {}".format(
            name, torch.__version__))
    return policy, variant


def amp_step(model, opt, scaler, x, y, loss_fn, wrapped):
    """The mixed-precision loop's step: autocast forward, scaled backward, every sum in
    (synchronize) before unscale_ and the clip, step inside skip_synchronize, update."""
    with torch.autocast(device_type=device.type, dtype=torch.float16 if CUDA else torch.bfloat16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    if wrapped:
        opt.synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    if wrapped:
        with opt.skip_synchronize():
            scaler.step(opt)
    else:
        scaler.step(opt)
    scaler.update()


def scaler_for():
    return torch.amp.GradScaler(device.type, init_scale=2.0 ** 12)


def exact(name):
    policy, variant = split(name)
    model, opt = fresh(torch.bfloat16 if variant == "params-bf16" else torch.float32)
    # auto: a decision every step (QS_AUTO_SCHEDULE, set by bench/gpu_check.sh, makes it
    # switch at step 3: the CUDA staging carried across a session's close and open).
    extra = {"replan_every": 1} if policy == "auto" else {}
    if variant in WIRE:
        extra["compression"] = variant[len("wire-"):]
    opt = qs.DistributedOptimizer(opt, model, policy=policy, check_consistency=1, **extra)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_fn = nn.CrossEntropyLoss()
    scaler = scaler_for() if variant == "amp" else None
    for step in range(args.steps):
        opt.zero_grad()
        x, y = data(step, rank)
        if scaler is not None:
            amp_step(model, opt, scaler, x, y, loss_fn, True)
            continue
        if variant == "params-bf16":
            x = x.to(torch.bfloat16)
        loss_fn(model(x).float(), y).backward()
        opt.step()
    if policy == "deft":  # its last updates are held back until shutdown
        opt.shutdown()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt.shutdown()

    def raw(v):  # numpy has no bfloat16: its bits, as int16
        v = v.detach().cpu().contiguous()
        return (v.view(torch.int16) if v.dtype in (torch.bfloat16, torch.float16) else v).numpy().tobytes()
    digests = torch.tensor([zlib.crc32(raw(v)) for v in state.values()], dtype=torch.int64)
    gathered = [torch.empty_like(digests) for _ in range(size)]
    torch.distributed.all_gather(gathered, digests)
    differ = [r for r in range(1, size) if not torch.equal(gathered[r], gathered[0])]
    return state, differ


def reference(variant=""):
    """One process on the concatenated batches (each step: every rank's batch, in order);
    amp: the same loop under autocast with its own GradScaler. A variant that rounds
    (wire-*, params-bf16) rounds the same way instead: each rank's gradient apart, rounded
    to the wire's type (params-bf16: computed in bfloat16), summed in float32, the sum
    rounded to the wire's type again, averaged in float32 and narrowed to the parameter's
    type (tests/python/idioms.py's rounded_average, the idioms' reference)."""
    dtype = torch.bfloat16 if variant == "params-bf16" else torch.float32
    model, opt = fresh(dtype)
    loss_fn = nn.CrossEntropyLoss()
    scaler = scaler_for() if variant == "amp" else None
    for step in range(args.steps):
        opt.zero_grad()
        parts = [data(step, r) for r in range(size)]
        if variant in ("", "amp"):
            x = torch.cat([p[0] for p in parts])
            y = torch.cat([p[1] for p in parts])
            if scaler is not None:
                amp_step(model, opt, scaler, x, y, loss_fn, False)
                continue
            loss_fn(model(x), y).backward()
        else:
            idioms.rounded_average(model, [lambda x=x, y=y: loss_fn(model(x.to(dtype)).float(), y).backward()
                                           for x, y in parts], WIRE.get(variant))
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


def speed(name):
    mode, variant = split(name)
    model, opt = fresh()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if CUDA else None)
    elif mode != "alone":
        wire = {"compression": variant[len("wire-"):]} if variant in WIRE else {}
        opt = qs.DistributedOptimizer(opt, model, policy=mode, **wire)
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
ALLREDUCE = ("mgwfbp", "deft", "synceasgd", "ddp-buckets", "us-byte")


def tolerance(policy, variant):
    if variant == "amp":
        return args.amp_tolerance
    if variant == "params-bf16":
        return args.bf16_tolerance
    if variant in WIRE and policy in ALLREDUCE and size > 2:
        return args.amp_tolerance  # the ring rounds each hop's partial sum: not the reference's rounding
    return args.tolerance


if "exact" in stages:
    checks = policies + [v for v in args.variants.split(",") if v]
    refs = {}
    if rank == 0:
        for name in checks:
            variant = split(name)[1]
            if variant not in refs:
                refs[variant] = reference(variant)
    start_state = fresh()[0].state_dict() if rank == 0 else None
    for name in checks:
        policy, variant = split(name)
        try:
            state, differ = exact(name)
            line = "  (a) {:<18}".format(name)
            if differ:
                failed += 1
                line += " FAIL: rank(s) {} differ from rank 0".format(differ)
            else:
                line += " ranks bit-identical"
            if rank == 0:
                ref = refs[variant]
                diff = max((state[k].float() - ref[k].float()).abs().max().item() for k in ref)
                moved = max((ref[k].float() - start_state[k].float()).abs().max().item() for k in ref)
                if policy == "deft":
                    line += "; rank 0 vs one process {:.1e} (delayed updates: another optimisation, not compared)"\
                        .format(diff)
                else:
                    tol = tolerance(policy, variant)
                    ok = diff <= tol
                    failed += 0 if ok else 1
                    line += "; rank 0 vs one process{} {:.1e} ({} tolerance {:.0e}; parameters moved {:.1e})".format(
                        " (same rounding)" if variant in WIRE or variant == "params-bf16" else "",
                        diff, "within" if ok else "FAIL: above", tol, moved)
            say(line)
        except Exception as e:  # report and go on: the other policies still say something
            failed += 1
            say("  (a) {:<18} FAIL: {}: {}".format(name, type(e).__name__, str(e)[:300]))
if "speed" in stages:
    results = {}
    for mode in ["alone", "ddp"] + policies + [v for v in args.speed_variants.split(",") if v] + ["ddp again"]:
        try:
            results[mode] = speed(mode.split()[0])
        except Exception as e:
            failed += 1
            say("  (b) {:<18} FAIL: {}: {}".format(mode, type(e).__name__, str(e)[:300]))
    ddp = [results[m][0] for m in ("ddp", "ddp again") if m in results]
    ddp = sum(ddp) / len(ddp) if ddp else None
    for mode, (sps, idle) in results.items():
        ratio = "" if mode.startswith("ddp") or mode == "alone" or not ddp else "  {:.2f}x DDP-gloo".format(sps / ddp)
        say("  (b) {:<18} {:8.1f} samples/s  GPU idle {}{}".format(
            mode, sps, "n/a" if idle is None else "{:.0%}".format(idle), ratio))
say("gpu_train: {} ranks: {}".format(size, "all passed" if not failed else "{} FAILED".format(failed)))
sys.exit(1 if failed else 0)
