"""Training loops as people write them (a scheduler stepped every iteration or created
before the wrapper, a clip, accumulation, a checkpoint, an EMA, evaluation, BatchNorm,
unused parameters, a Horovod port), written once and run two ways: by each worker of a
quicksilver.torch job (idiom_worker.py) and by one process on the concatenated batches
(the reference, test_idioms.py). `World` is all that differs: how a batch is chosen, and
what the three added lines do."""
import contextlib
import copy
import io
import time
import types

import torch
import torch.nn as nn

import models

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
ITERATIONS = 6
PER_WORKER = 8
K = 2  # micro-batches of the accumulation idiom


class DigitsBN(nn.Module):
    """The digits CNN with BatchNorm (running statistics: buffers)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class DigitsBranchy(nn.Module):
    """A head used on odd iterations only, and a layer that never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.head_a = nn.Linear(32, 10)
        self.head_b = nn.Linear(32, 10)
        self.iteration = 0

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.head_b(h) if self.iteration % 2 else self.head_a(h)


class DigitsTransformer(nn.Module):
    """Each digit's 8 rows as 8 tokens through torch's TransformerEncoderLayer: its
    MultiheadAttention reads out_proj's weight without calling out_proj; and a
    ParameterList read by the model itself. Parameters whose own module is never entered."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.encoder = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(16))])
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = self.encoder(self.embed(x.squeeze(1))) * self.scales[0]
        return self.head(h.mean(1))


class DigitsWide(nn.Module):
    """A first layer of 16 MB of gradient: backward() returns while the transport still
    sends it (its layer is the last the backward reaches), so a write right after
    backward() lands while the bytes are on the wire."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Linear(64, 65536)
        self.head = nn.Linear(65536, 10)

    def forward(self, x):
        return self.head(torch.relu(self.wide(x.flatten(1))))


def make_model(kind):
    return {"digits": models.DigitsCNN, "bn": DigitsBN, "branchy": DigitsBranchy,
            "transformer": DigitsTransformer, "wide": DigitsWide}[kind]()


class World:
    """A worker (rank of size, with quicksilver.torch) or the reference (rank None: one
    process training on the concatenation of every worker's batch)."""

    def __init__(self, size, rank=None, qs=None, policy="mercury", knobs=None, bn_apart=False):
        self.size, self.rank, self.qs, self.policy = size, rank, qs, policy
        self.knobs = knobs or {}
        self.bn_apart = bn_apart
        self.x, self.y = models.digits()
        self.loss_fn = nn.CrossEntropyLoss()
        self.delayed = None  # the reference of a delayed-update run: DelayedReference
        self.logs = []  # a worker's: per wrapped optimizer, its profile, delayed updates and report

    @property
    def worker(self):
        return self.rank is not None

    def batch(self, index):
        if self.worker:
            return models.batch(self.x, self.y, index, self.rank, self.size, PER_WORKER)
        parts = [models.batch(self.x, self.y, index, r, self.size, PER_WORKER) for r in range(self.size)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def forward_backward(self, model, index, scale=None):
        """loss.backward() on this world's batch `index`; the loss (scaled by `scale`, a
        GradScaler, if given). The BatchNorm reference runs each worker's batch apart and
        keeps rank 0's running statistics (what DDP's broadcast_buffers leaves there)."""
        if self.worker or not self.bn_apart:
            x, y = self.batch(index)
            loss = self.loss_fn(model(x), y)
            (scale.scale(loss) if scale else loss).backward()
            return loss
        saved = [b.clone() for b in model.buffers()]
        for r in reversed(range(self.size)):
            if r != self.size - 1:
                with torch.no_grad():
                    for b, s in zip(model.buffers(), saved):
                        b.copy_(s)
            x, y = models.batch(self.x, self.y, index, r, self.size, PER_WORKER)
            loss = self.loss_fn(model(x), y) / self.size
            loss.backward()
        return loss

    def wrap(self, optimizer, model, **kwargs):
        """The three lines (the reference: none, or its delayed-update replay)."""
        if not self.worker:
            if self.delayed is not None:
                return self.delayed.wrap(optimizer, model)
            return optimizer
        kwargs.setdefault("check_consistency", 1)
        optimizer = self.qs.DistributedOptimizer(optimizer, model, policy=self.policy, **self.knobs, **kwargs)
        self.qs.broadcast_parameters(model.state_dict(), root_rank=0)
        return optimizer

    def synchronize(self, optimizer):
        if self.worker:
            optimizer.synchronize()

    def skip_synchronize(self, optimizer):
        return optimizer.skip_synchronize() if self.worker else contextlib.nullcontext()

    def done(self, optimizer, model):
        """The loop ended: the model's state as the user reads it (model.state_dict() right
        after the last step(), before shutdown; under DeFT after shutdown, which applies the
        updates still held back), and the optimizer finished."""
        stale = self.policy == "deft" or (self.policy == "auto" and self.knobs.get("allow_stale"))
        if self.delayed is not None or (self.worker and stale):
            self.finish(optimizer)
            return state(model)
        read = state(model)
        self.finish(optimizer)
        return read

    def finish(self, optimizer):
        if self.worker:
            report = optimizer.shutdown()
            self.logs.append({"profile": optimizer.quicksilver_profile(), "updates": optimizer.quicksilver_updates(),
                              "report": report})
            return report
        if self.delayed is not None:
            self.delayed.finish()
        return None


class DelayedReference:
    """One process replaying a delayed-update schedule (DeFT's, as the workers logged it):
    before the forward pass after `before` backward passes (steps), each logged layer
    takes one step of the optimizer on the mean of the full-batch gradients of
    iterations first..last, with the hyperparameters of the step() that followed
    iteration `last` (the rule quicksilver.torch states); what is due after training, at
    the end."""

    def __init__(self, profile, updates, after_training):
        self.profile, self.updates, self.after = profile, [tuple(u) for u in updates], after_training

    def wrap(self, optimizer, model):
        params = dict(model.named_parameters())
        self.layer_params = [[params[t["name"]] for t in l["tensors"]] for l in self.profile["layers"]]
        self.opt, self.model = optimizer, model
        self.passes, self.grads, self.hyper, self.done = 0, {}, {}, set()
        self.raw = type(optimizer).step
        # A method of the optimizer (a scheduler wraps it), shadowing any scheduler's
        # wrapper made before (torch then warns; the schedule is the same).
        optimizer.step = types.MethodType(lambda _opt, closure=None: self._step(closure), optimizer)
        model.register_forward_pre_hook(lambda m, i: self._due(self.passes))
        return optimizer

    def _step(self, closure=None):
        self.grads[self.passes] = {id(p): (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                                   for ps in self.layer_params for p in ps}
        self.passes += 1
        self.hyper[self.passes] = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]

    def _due(self, before):
        for u in self.updates:
            if u[0] == before and u not in self.done:
                self.done.add(u)
                self._apply(*u[1:])

    def _apply(self, layer, first, last):
        ps = self.layer_params[layer]
        saved = [p.grad for p in ps]
        for p in ps:
            p.grad = sum(self.grads[i][id(p)] for i in range(first, last + 1)) / (last - first + 1)
        hyper = self.hyper.get(last + 1, self.hyper[max(self.hyper)])
        mine = {id(p) for p in ps}
        groups = self.opt.param_groups
        self.opt.param_groups = [dict(h, params=[p for p in g["params"] if id(p) in mine])
                                 for h, g in zip(hyper, groups)]
        self.opt.param_groups = [g for g in self.opt.param_groups if g["params"]]
        try:
            self.raw(self.opt)
        finally:
            self.opt.param_groups = groups
            for p, g in zip(ps, saved):
                p.grad = None if g is None else g.zero_()

    def finish(self):
        # What was due before a forward pass that never came (the last synchronous step of
        # policy="auto"), then what was held back until after training.
        for u in self.updates:
            if u[0] != self.after and u not in self.done:
                self.done.add(u)
                self._apply(*u[1:])
        self._due(self.after)


def seeded_model(kind):
    torch.manual_seed(0)
    return make_model(kind)


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---- the idioms: each returns {name: state_dict} to compare ----

def train(world, model, opt, sched=None, forward=None, each=None):
    """The plain loop: zero_grad, forward and backward, step, the scheduler per iteration
    (if any), then `each(it)`; the model's forward through `forward` (a compiled one) if
    given. Ends with the world's finish()."""
    for it in range(ITERATIONS):
        if hasattr(model, "iteration"):
            model.iteration = it
        opt.zero_grad()
        world.forward_backward(model if forward is None else forward, it)
        opt.step()
        if sched is not None:
            sched.step()
        if each is not None:
            each(it)
    return {"model": world.done(opt, model)}


def onecycle(world):
    """OneCycleLR stepped every iteration (created after the wrapper), Nesterov momentum and
    weight decay; evaluation every other iteration."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    opt = world.wrap(opt, model)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=ITERATIONS)

    def evaluate(it):
        if it % 2:
            model.eval()
            with torch.no_grad():
                model(world.x[:16])
            model.train()
    return train(world, model, opt, sched, each=evaluate)


def warmup_before(world):
    """AdamW with two parameter groups and a warm-up LambdaLR created BEFORE the wrapper
    (any helper that returns optimizer and scheduler together does that)."""
    model = seeded_model("digits")
    head = list(model.fc2.parameters())
    rest = [p for n, p in model.named_parameters() if not n.startswith("fc2.")]
    opt = torch.optim.AdamW([{"params": rest}, {"params": head, "lr": 3e-3, "weight_decay": 0.0}],
                            lr=1e-2, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    opt = world.wrap(opt, model)
    return train(world, model, opt, sched)


def clip(world, max_norm=0.05):
    """clip_grad_norm_ between backward and step (Horovod's convention: synchronize(),
    clip, step inside skip_synchronize()), with a cosine schedule per iteration."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=ITERATIONS)
    opt = world.wrap(opt, model)
    norms = []
    for it in range(ITERATIONS):
        opt.zero_grad()
        world.forward_backward(model, it)
        world.synchronize(opt)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        with world.skip_synchronize(opt):
            opt.step()
        sched.step()
    return {"model": world.done(opt, model), "norms": {"norms": torch.tensor(norms)}}


def clip_tiny(world):
    """A clip that leaves almost nothing: the parameters barely move."""
    return clip(world, max_norm=1e-6)


def accumulate(world):
    """K micro-batches, each forward and backward, then one step (backward_passes_per_step)."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = world.wrap(opt, model, backward_passes_per_step=K) if world.worker else world.wrap(opt, model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for it in range(ITERATIONS):
        opt.zero_grad()
        for micro in range(K):
            world.forward_backward(model, it * K + micro)
        opt.step()
        sched.step()
    return {"model": world.done(opt, model)}


def checkpoint_ema(world):
    """After step(): an EMA of the parameters (zip over parameters()), torch's
    AveragedModel, a checkpoint (model and optimizer state_dict through torch.save),
    copy.deepcopy of the model; then a resume: a fresh model and optimizer load the
    checkpoint and train on."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = world.wrap(opt, model)
    ema = copy.deepcopy(model)
    swa = torch.optim.swa_utils.AveragedModel(model)
    saved, snapshot = None, None
    for it in range(ITERATIONS):
        opt.zero_grad()
        world.forward_backward(model, it)
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.8).add_(p.detach(), alpha=0.2)
        swa.update_parameters(model)
        if it == 2:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
            saved = buf.getvalue()
            snapshot = copy.deepcopy(model)
            whole = io.BytesIO()
            torch.save(model, whole)  # the module itself, pickled
            whole.seek(0)
            pickled = torch.load(whole, weights_only=False) if TORCH2 else torch.load(whole)
    final = world.done(opt, model)
    # Resume from the checkpoint of iteration 2 and train its remaining iterations again.
    resumed = make_model("digits")
    ropt = torch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    ropt = world.wrap(ropt, resumed)
    ck = torch.load(io.BytesIO(saved))
    resumed.load_state_dict(ck["model"])
    ropt.load_state_dict(ck["optimizer"])
    for it in range(3, ITERATIONS):
        ropt.zero_grad()
        world.forward_backward(resumed, it)
        ropt.step()
    return {"model": final, "ema": state(ema), "swa": state(swa.module), "snapshot": state(snapshot),
            "checkpoint": ck["model"], "pickled": state(pickled), "resumed": world.done(ropt, resumed)}


def gradscaler(world):
    """A CPU GradScaler (torch >= 2.3): scale, synchronize, unscale_, clip, step, update."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = world.wrap(opt, model)
    # The first step overflows (float32 max is 3.4e38) and is skipped (zero_grad() drops
    # it); the scale then backs off to 1e8.
    scaler = torch.amp.GradScaler("cpu", init_scale=1e38, backoff_factor=1e-30)
    for it in range(ITERATIONS):
        opt.zero_grad()
        world.forward_backward(model, it, scale=scaler)
        world.synchronize(opt)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        with world.skip_synchronize(opt):
            scaler.step(opt)
        scaler.update()
    return {"model": world.done(opt, model)}


def unused(world):
    """A head used on odd iterations only and one never used (find_unused_parameters)."""
    model = seeded_model("branchy")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt = world.wrap(opt, model, find_unused_parameters=True) if world.worker else world.wrap(opt, model)
    return train(world, model, opt)


def batchnorm(world):
    """BatchNorm: rank 0's buffers broadcast before each training forward (DDP's default)."""
    model = seeded_model("bn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(world, model, world.wrap(opt, model))


def horovod(world):
    """A Horovod script's spellings: named_parameters, Compression.none, op=Average,
    broadcast_optimizer_state, broadcast_object, allreduce of a metric."""
    qs = world.qs
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if not world.worker or world.rank == 0:
        # Rank 0 alone warms up (as if it had resumed alone): its parameters and momentum
        # buffers must reach every worker.
        x, y = models.batch(world.x, world.y, 100, 0, world.size, PER_WORKER)
        world.loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    if world.worker:
        qs.broadcast_parameters(model.state_dict(), root_rank=0)
        qs.broadcast_optimizer_state(opt, root_rank=0)
        start = qs.broadcast_object(0 if qs.rank() == 0 else 99, root_rank=0)
        assert start == 0, start
        opt = qs.DistributedOptimizer(opt, model, named_parameters=model.named_parameters(), policy=world.policy,
                                      compression=qs.Compression.none, op=qs.Average, check_consistency=1,
                                      **world.knobs)
    losses = []
    for it in range(ITERATIONS):
        opt.zero_grad()
        loss = world.forward_backward(model, it)
        opt.step()
        losses.append(qs.allreduce(loss.detach()) if world.worker else None)
    out = {"model": world.done(opt, model)}
    if world.worker:
        out["losses"] = {"losses": torch.stack(losses)}
    return out


def sum_op(world):
    """op=Sum: the sums undivided; with SGD (momentum, no weight decay) that is the average
    at `workers` times the learning rate."""
    model = seeded_model("digits")
    lr = 0.02
    if world.worker:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        opt = world.wrap(opt, model, op=world.qs.Sum)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr * world.size, momentum=0.9)
    return train(world, model, opt)


def transformer(world):
    """A Transformer layer (parameters read without their module being called)."""
    model = seeded_model("transformer")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    return train(world, model, opt)


def compiled(world):
    """torch.compile (torch 2.x) of the model after the wrapper; the reference compiles too."""
    model = seeded_model("digits")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = world.wrap(opt, model)
    fast = torch.compile(model)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=ITERATIONS)
    return train(world, model, opt, sched, forward=fast)


def rounded_average(model, backward_passes, narrow=None):
    """The reference of a run whose sums round: each worker's backward pass apart (each of
    `backward_passes`, a callable, on fresh gradients), its gradient rounded to `narrow`
    (the wire's type; None: kept), summed in float32, the sum rounded to `narrow` again,
    averaged in float32 and narrowed to the parameter's type, into .grad."""
    def rounded(t):
        return t.to(narrow).float() if narrow is not None else t
    sums = [torch.zeros_like(p, dtype=torch.float32) for p in model.parameters()]
    for backward in backward_passes:
        model.zero_grad()
        backward()
        for s, p in zip(sums, model.parameters()):
            s += rounded(p.grad.float())
    for s, p in zip(sums, model.parameters()):
        p.grad = (rounded(s) / len(backward_passes)).to(p.dtype)


def low_precision(world, dtype, wire=None):
    """A model whose parameters are `dtype` (bfloat16 or float16): staged through host
    float32 buffers, summed and averaged in float32, then rounded to `dtype` (an fp16 sum
    that would overflow averages to what fits). The reference rounds the same way: each
    worker's gradient apart in `dtype`, summed in float32, divided by the workers, rounded. With `wire` (bf16 or fp16 compression of a float32
    model): each worker's gradient rounded to `wire`, summed in float32, the sum rounded
    to `wire` again, then averaged in float32 (rounded_average)."""
    model = seeded_model("digits").to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = world.wrap(opt, model, compression=wire) if wire else world.wrap(opt, model)
    narrow = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(wire)
    loss_fn = nn.CrossEntropyLoss()
    for it in range(ITERATIONS):
        opt.zero_grad()
        ranks = [world.rank] if world.worker else range(world.size)

        def backward(r):
            x, y = models.batch(world.x, world.y, it, r, world.size, PER_WORKER)
            loss_fn(model(x.to(dtype)).float(), y).backward()
        if world.worker:
            backward(world.rank)
        else:
            rounded_average(model, [lambda r=r: backward(r) for r in ranks], narrow)
        opt.step()
    return {"model": world.done(opt, model)}


def bf16(world):
    return low_precision(world, torch.bfloat16)


def fp16(world):
    return low_precision(world, torch.float16)


def wire_bf16(world):
    return low_precision(world, torch.float32, "bf16")


def wire_fp16(world):
    return low_precision(world, torch.float32, "fp16")


IDIOMS = {f.__name__: f for f in (
    compiled, sum_op, onecycle, warmup_before, clip, clip_tiny, accumulate, checkpoint_ema,
    gradscaler, unused, batchnorm, horovod, transformer, bf16, fp16, wire_bf16, wire_fp16)}


# ---- what must raise, and with which words ----

def clip_without_synchronize(world):
    model = seeded_model("digits")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(3):
        opt.zero_grad()
        world.forward_backward(model, it)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
        opt.step()


def clip_during_the_send(world):
    """clip_without_synchronize on rank 0 alone, the write meeting the send: the
    transport reads .grad in place, so the receiver's payload checksum sees the bytes
    change (nothing of them is used) and the session fails while rank 0 still writes;
    rank 0 is told the write's remedy all the same (step() checks the versions before it
    waits on the transport), rank 1 that the writer was lost. Clipped ten times over (a
    16 MB layer written for tens of milliseconds) so that the writes overlap the send, and
    step() half a second later, once the failure has surely reached rank 0.
    The loop ends as a script's does, with a read of the model (a checkpoint, an
    evaluation). step() does not wait for its pass's sums; the read does. The first pass's
    clip comes before the session takes any gradient, so rank 0 may raise only at the
    second pass, after rank 1 had that pass's sums. Without the read, rank 1 could then end
    its loop with nothing waiting on the lost writer (CI saw rank 1 end with no error)."""
    model = seeded_model("wide")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(3):
        opt.zero_grad()
        world.forward_backward(model, it)
        if world.rank == 0:
            for _ in range(10):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
            time.sleep(0.5)  # its frames are judged by now: the session's error is waiting
        opt.step()
    return state(model)


def accumulate_undeclared(world):
    model = seeded_model("digits")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(3):
        opt.zero_grad()
        for micro in range(2):
            world.forward_backward(model, it * 2 + micro)
        opt.step()


def two_forwards_undeclared(world):
    model = seeded_model("digits")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(3):
        opt.zero_grad()
        xa, ya = world.batch(2 * it)
        xb, yb = world.batch(2 * it + 1)
        la, lb = world.loss_fn(model(xa), ya), world.loss_fn(model(xb), yb)
        la.backward()
        lb.backward()
        opt.step()


def unused_undeclared(world):
    model = seeded_model("branchy")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(3):
        model.iteration = it
        opt.zero_grad()
        world.forward_backward(model, it)
        opt.step()


def diverge(world):
    """Rank 1 changes a parameter behind the wrapper's back: the guard names it."""
    model = seeded_model("digits")
    opt = world.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for it in range(4):
        opt.zero_grad()
        world.forward_backward(model, it)
        opt.step()
        if it == 1 and world.rank == 1:
            with torch.no_grad():
                model.fc1.bias.add_(1e-4)


MUST_RAISE = {
    "clip_without_synchronize": "synchronize()",
    "clip_during_the_send": "synchronize()",
    "accumulate_undeclared": "backward_passes_per_step",
    "two_forwards_undeclared": "backward_passes_per_step",
    "unused_undeclared": "find_unused_parameters=True",
    "diverge": "parameter 'fc1.bias' differs between rank 0 and rank(s) 1",
}
RAISERS = {f.__name__: f for f in (clip_without_synchronize, clip_during_the_send, accumulate_undeclared,
                                    two_forwards_undeclared, unused_undeclared, diverge)}
