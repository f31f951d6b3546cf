"""`quicksilver profile` (and python3 -m quicksilver.profile): measures a real PyTorch model
on this machine into DESIGN.md's profile format (per layer: forward and backward time,
tensors), so that `quicksilver simulate --model PROFILE.json` predicts its training.

Layers are found and timed by the same hooks quicksilver.torch trains with (the modules
that own parameters, in the order the forward pass uses them); each time is the median
over the measured iterations, after a warm-up. The update time is left at 0 (the loop
counts it with the forward).

    quicksilver profile --model torchvision:resnet18 --input 3,64,64 --batch 16 --out resnet18.json
    quicksilver profile --model mymodel.py:make --input 1,28,28 --batch 32 --out mine.json
    quicksilver profile --model torchvision:resnet50 --input 3,224,224 --batch 32 --device cuda --out r50.json
"""
import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import threading
import time

import torch
import torch.nn as nn

from .torch import _Recorder, _accumulate_grad_hook


def measure(model, inputs, targets, loss_fn=None, iterations=10, warmup=3, name=None, stats=None):
    """The profile (a dict) of training `model` on (inputs, targets) with `loss_fn`
    (cross-entropy by default): medians over `iterations` after `warmup`. On a CUDA model
    every time is from CUDA events (the hooks run before the kernels they follow). With
    `stats` (a dict): its "iteration_ms" is the median of the whole iterations, timed
    apart from the layers (forward, loss and backward), the check on their sum."""
    cuda = next((p.device for p in model.parameters() if p.device.type == "cuda"), None)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    rec = _Recorder(model)
    recording = [False]
    handles = rec.hook(lambda i: recording[0] and rec.begin(i), lambda n, m: recording[0] and rec.enter(n, m),
                       lambda: recording[0] and rec.end())
    nodes = []
    for p in model.parameters():
        if p.requires_grad:
            h, node = _accumulate_grad_hook(p, lambda p=p: recording[0] and rec.grad(p))
            handles.append(h)
            nodes.append(node)
    fws, bws, whole = [], [], []
    progress = _Progress(warmup + iterations)
    try:
        for it in range(warmup + iterations):
            progress.at = it + 1
            model.zero_grad()
            if cuda is not None:
                torch.cuda.synchronize(cuda)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            else:
                a = time.perf_counter()
            recording[0] = True
            rec.reset()
            loss_fn(model(inputs), targets).backward()
            recording[0] = False
            if cuda is not None:
                b.record()
                b.synchronize()
                took = a.elapsed_time(b)
            else:
                took = (time.perf_counter() - a) * 1e3
            if it >= warmup:
                fw, bw = rec.times()
                fws.append(fw)
                bws.append(bw)
                whole.append(took)
    finally:
        progress.stop()
        for h in handles:
            h.remove()
    if stats is not None:
        stats["iteration_ms"] = statistics.median(whole)
    rec.adopt([p for p in model.parameters() if p.requires_grad])  # every parameter is in the profile
    med = [statistics.median(col) for col in zip(*fws)]
    medb = [statistics.median(col) for col in zip(*bws)]
    return rec.profile(name or type(model).__name__, med, medb)


def _load_model(spec, classes):
    kind, _, what = spec.partition(":")
    if kind == "torchvision" and what:
        import torchvision
        factory = getattr(torchvision.models, what, None)
        if factory is None:
            raise SystemExit("quicksilver profile: torchvision has no model {!r}".format(what))
        return factory(num_classes=classes), what
    if kind.endswith(".py") and what:
        loader = importlib.util.spec_from_file_location("qs_user_model", kind)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return getattr(module, what)(), what
    raise SystemExit("quicksilver profile: --model must be torchvision:NAME or FILE.py:FUNCTION, not {!r}".format(spec))


def main(argv=None):
    """Bad input (a flag, a model that does not load, a device torch lacks) exits 2 with
    its message, as every quicksilver command does."""
    try:
        _main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            raise SystemExit(2) from None
        raise


def _main(argv):
    ap = argparse.ArgumentParser(prog="quicksilver profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="torchvision:NAME or FILE.py:FUNCTION (returns the model)")
    ap.add_argument("--input", required=True, help="one sample's shape, e.g. 3,64,64")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--classes", type=int, default=10, help="output classes (torchvision models, random labels)")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="the torch device to measure on: cpu, cuda, cuda:1 (times from "
                    "CUDA events there). Not `simulate --device`, which names a built-in GPU model for zoo profiles")
    ap.add_argument("--out", required=True, help="where the profile JSON goes ('-': standard output)")
    a = ap.parse_args(argv)
    if a.iterations < 1 or a.warmup < 0 or a.batch < 1:
        raise SystemExit("quicksilver profile: --iterations and --batch must be >= 1, --warmup >= 0")
    try:
        shape = tuple(int(d) for d in a.input.replace("x", ",").split(","))
    except ValueError:
        raise SystemExit("quicksilver profile: --input {!r} is not a shape like 3,64,64".format(a.input)) from None
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    try:
        device = torch.device(a.device)
    except RuntimeError as e:
        raise SystemExit("quicksilver profile: --device {!r}: {}".format(a.device, e)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("quicksilver profile: --device {}: torch {} sees no CUDA device here".format(
            a.device, torch.__version__))
    if device.type not in ("cpu", "cuda"):
        raise SystemExit("quicksilver profile: --device {!r}: give cpu or cuda[:N]".format(a.device))
    model, name = _load_model(a.model, a.classes)
    model = model.to(device)
    inputs = torch.rand(a.batch, *shape).to(device)
    targets = torch.randint(0, a.classes, (a.batch,)).to(device)
    stats = {}
    busy = _CpuShare()
    profile = measure(model, inputs, targets, iterations=a.iterations, warmup=a.warmup, name=name, stats=stats)
    idle = busy.idle()
    warning = _load_warning(idle, device, a.threads)
    if warning:
        print(warning, file=sys.stderr)
    text = json.dumps(profile, indent=1)
    if a.out == "-":
        print(text)
    else:
        with open(a.out, "w") as f:
            f.write(text + "\n")
        total = sum(l["forward_ms"] + l["backward_ms"] for l in profile["layers"])
        print("quicksilver profile: {} on {} ({} layers, {} parameters, {:.1f} ms of compute per iteration; the whole "
              "iteration timed apart {:.1f} ms) -> {}".format(
                  name, device, len(profile["layers"]), sum(t["elements"] for l in profile["layers"]
                                                             for t in l["tensors"]), total, stats["iteration_ms"],
                  a.out), file=sys.stderr)


class _Progress:
    """On a terminal (stderr), as the quicksilver command's own progress lines: after 1.5 s
    of measuring, the iteration it is at, then at least every 10 s; nothing off a terminal."""

    def __init__(self, total):
        self.total, self.at = total, 0
        self.start = time.monotonic()
        self.done = threading.Event()
        self.thread = None
        if sys.stderr.isatty() or os.environ.get("QS_PROGRESS") == "1":
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self):
        wait = 1.5
        while not self.done.wait(wait):
            print("quicksilver profile: iteration {} of {}, {:.0f} s".format(
                self.at, self.total, time.monotonic() - self.start), file=sys.stderr, flush=True)
            wait = 10.0

    def stop(self):
        self.done.set()
        if self.thread is not None:
            self.thread.join()


class _CpuShare:
    """The machine's idle share between creation and idle() (/proc/stat: every process on
    the machine, not only this one), and its load average then; None where /proc is not."""

    def __init__(self):
        self.start = self._ticks()

    @staticmethod
    def _ticks():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            return v[3] + v[4], sum(v)
        except (OSError, ValueError, IndexError):
            return None

    def idle(self):
        end = self._ticks()
        if self.start is None or end is None or end[1] <= self.start[1]:
            return None
        return (end[0] - self.start[0]) / (end[1] - self.start[1])


def _load_warning(idle, device, threads):
    """A line for stderr when other work shared the CPU the measurement ran on (`run` flags
    its CPU-bound rows the same way), or None."""
    if idle is None or device.type != "cpu":
        return None
    cores = os.cpu_count() or 1
    # This process uses `threads` cores; the rest should have stayed idle.
    expected = max(0.0, 1.0 - threads / cores)
    if idle >= expected * 0.5 and idle >= 0.05:
        return None
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return ("quicksilver profile: warning: the machine was busy while measuring ({:.0%} of its {} cores idle, "
            "load average {:.1f}; this measurement uses {}): the times include waiting for the CPU and may be "
            "several times an idle machine's. Measure again when it is idle.".format(idle, cores, load, threads))


if __name__ == "__main__":
    main()
