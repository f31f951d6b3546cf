"""Quicksilver for PyTorch: data-parallel training through Quicksilver's schedulers.

Three lines in a user's script (docs/pytorch.md):

    import quicksilver.torch as qs
    qs.init()                                                   # torchrun's environment
    optimizer = qs.DistributedOptimizer(optimizer, model, policy="mercury")
    qs.broadcast_parameters(model.state_dict(), root_rank=0)

The user's loop stays: zero_grad(); loss = ...; loss.backward(); optimizer.step().

What happens underneath (the C++ side is quicksilver/torch/session.h):
- the first forward pass records the order in which it uses the modules that own
  parameters (forward pre-hooks): that order is the layers' order, the parameters'
  priorities (not parameters() order, not names), and the profile the policy plans with;
  the first backward pass measures each layer's backward time; the first step() builds
  the profile, starts this process's parameter server and worker, and hands them the
  first gradients;
- from then on every parameter's AccumulateGrad hook reports its gradient (the gradient
  buffer is the parameter's own .grad, which the sums overwrite in place);
- step() applies the update of every layer whose sums are already in, and returns; a
  layer's forward pre-hook waits (GIL released) only for that layer's sums, then applies
  its update: the next forward pass overlaps the rest of the communication;
- the update is the wrapped optimizer's own step() on that layer's parameters alone, on
  the sum divided by the number of workers (the average, as DistributedDataParallel).

DeFT (delayed updates) differs: a layer's sums may cover iterations first..last and arrive
while later iterations compute. Worker 0 decides which updates are due before each forward
pass (those whose sums it had when it began it); every worker applies the same ones at the
same point, each as one step on the sum divided by workers x iterations (a step with batch
size k x B, DeFT IV-C1). Rank 0 also measures the loss (the scalar its backward ran
from), the averaged gradient's squared norm and its noise, and feeds them to DeFT's
Preserver (IV-C), which raises its knapsack capacities when the schedule executed would
slow convergence.
"""

import atexit
import datetime
import json
import os
import socket
import sys
import time
import weakref

import torch
import torch.distributed as dist

try:
    from . import _quicksilver as _qs
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "quicksilver.torch: the compiled module quicksilver._quicksilver is missing ({}); build "
        "with scripts/build.sh (QS_WITH_TORCH=ON) and put build/python on PYTHONPATH".format(e)) from e

QuicksilverError = _qs.QuicksilverError
AFTER_TRAINING = _qs.AFTER_TRAINING

__all__ = ["init", "rank", "size", "local_rank", "DistributedOptimizer", "broadcast_parameters",
           "shutdown", "QuicksilverError", "policies"]

_env = {"rank": 0, "size": 1, "local_rank": 0, "master_addr": "127.0.0.1", "initialized": False,
        "timeout": 120.0}
_live = weakref.WeakSet()  # integrations not yet shut down (finished at exit)


def _env_int(name, default):
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError("quicksilver.torch.init: {}={!r} is not an integer".format(name, text)) from None


def init(timeout=120.0):
    """Joins the job described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, LOCAL_RANK), as `torchrun` and `quicksilver run --script` set it. Without
    them: one process. Starts torch.distributed (gloo) for the control plane (parameter
    broadcast, exchanging the servers' addresses), unless the script did already.
    `timeout` (seconds) bounds the wait for every peer."""
    rank = _env_int("RANK", 0)
    size = _env_int("WORLD_SIZE", 1)
    if size < 1 or not 0 <= rank < size:
        raise ValueError("quicksilver.torch.init: RANK={} is not in [0, WORLD_SIZE={})".format(rank, size))
    if size > 1 and not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise RuntimeError("quicksilver.torch.init: WORLD_SIZE={} but {} not set: launch with "
                               "`torchrun --redirects 2 --tee 2 --nproc_per_node N script.py` or "
                               "`quicksilver run --workers N --script script.py`".format(size, " and ".join(missing)))
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout))
        _env["owns_group"] = True  # destroyed at exit (_at_exit)
    if dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
    _env.update(rank=rank, size=size, local_rank=_env_int("LOCAL_RANK", 0),
                master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), initialized=True, timeout=timeout)


def rank():
    return _env["rank"]


def size():
    return _env["size"]


def local_rank():
    return _env["local_rank"]


def policies():
    """The policies this build runs from PyTorch: the parameter-server ones (TCP) and the
    all-reduce ones (gloo), without the simulator's compute-only 'oracle'."""
    names = list(_qs.ps_policies()) + [p for p in _qs.allreduce_policies() if _qs.is_allreduce_policy(p)]
    return [p for p in names if p != "oracle"]


def _require_init(what):
    if not _env["initialized"]:
        raise RuntimeError("quicksilver.torch.{}: call quicksilver.torch.init() first".format(what))


def broadcast_parameters(params, root_rank=0):
    """Overwrites every tensor of `params` (a state_dict, an iterable of (name, tensor), or
    of tensors) with root_rank's, in place, so that all workers start equal."""
    _require_init("broadcast_parameters")
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    if _env["size"] == 1:
        return
    for _, t in items:
        if not torch.is_tensor(t):
            continue
        if t.is_contiguous():
            dist.broadcast(t.data, src=root_rank)
        else:
            tmp = t.data.contiguous()
            dist.broadcast(tmp, src=root_rank)
            t.data.copy_(tmp)


def shutdown():
    """Ends every Quicksilver optimizer of this process (each after its sums are in).
    Runs at exit by itself."""
    for integration in list(_live):
        integration.shutdown()


def _my_address(master):
    """The address peers reach this process at: the one this host routes MASTER_ADDR from."""
    if master in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((master, 9))  # no packet is sent: this only picks the route
        return s.getsockname()[0]
    finally:
        s.close()


class _LossTap:
    """The training loss, for DeFT's Preserver: the value of the last scalar a backward pass
    ran from (loss.backward() and torch.autograd.backward both go through
    torch.autograd.backward, wrapped while some integration needs it). The user's loop
    stays as it is."""

    def __init__(self):
        self.users = 0
        self.original = None
        self.last = None

    def acquire(self):
        if self.users == 0:
            self.original = torch.autograd.backward
            original = self.original
            tap = self

            def backward(tensors, *args, **kwargs):
                if torch.is_tensor(tensors) and tensors.numel() == 1:
                    tap.last = float(tensors.detach())
                return original(tensors, *args, **kwargs)

            torch.autograd.backward = backward
        self.users += 1

    def release(self):
        self.users -= 1
        if self.users == 0 and self.original is not None:
            torch.autograd.backward = self.original
            self.original = None

    def take(self):
        value, self.last = self.last, None
        return value


_loss_tap = _LossTap()


def _accumulate_grad_hook(p, fn):
    """Calls fn() once p's gradient of a backward pass is accumulated into p.grad. PyTorch
    2.1+ has a hook for exactly that; 1.13 hooks the AccumulateGrad node, which must be kept
    referenced (else every graph makes a new one, without the hook). Returns what to keep."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return (p.register_post_accumulate_grad_hook(lambda _p: fn()), None)
    node = p.expand_as(p).grad_fn.next_functions[0][0]
    return (node.register_hook(lambda *_: fn()), node)


class _Recorder:
    """A model's layers, as its forward pass uses them, and the times of a pass.

    Layers are the modules that own trainable parameters (recurse=False), in the order in
    which the first recorded forward pass enters them (forward pre-hooks); a parameter
    shared by two modules belongs to the first. A module whose parameters all belong to
    earlier layers is no layer. Times (perf_counter ns): a layer's forward runs from its
    pre-hook to the next layer's (the layers without parameters in between count with the
    one before them) or the end of the model's forward; its backward from the previous
    layer's last gradient (in backward order; for the last layer, the end of the forward
    pass, so the loss counts with it) to its own last one. The owner calls begin/enter/end
    from its hooks, grad from each parameter's accumulate-grad hook."""

    def __init__(self, model):
        self.model = model
        self.names = {}
        for n, p in model.named_parameters():
            self.names.setdefault(id(p), n)
        self.layer_of_module = {}  # id(module) -> layer, or None
        self.layers = []           # [(name, [params])]
        self.assigned = set()      # id of every parameter some layer owns
        self.discovering = True
        self.batch_size = 1
        self.reset()

    def reset(self):
        self.t_begin = self.t_end = None
        self.forward_at = {}  # layer -> ns
        self.grad_at = {}     # id(param) -> ns

    def begin(self, inputs):
        self.t_begin = time.perf_counter_ns()
        first = inputs[0] if inputs else None
        if torch.is_tensor(first) and first.dim() > 0:
            self.batch_size = int(first.shape[0])

    def enter(self, name, module):
        if self.discovering and id(module) not in self.layer_of_module:
            own = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in self.assigned]
            self.layer_of_module[id(module)] = len(self.layers) if own else None
            if own:
                self.assigned.update(id(p) for p in own)
                self.layers.append((name or type(module).__name__, own))
        layer = self.layer_of_module.get(id(module))
        if layer is not None and layer not in self.forward_at:
            self.forward_at[layer] = time.perf_counter_ns()
        return layer

    def end(self):
        self.t_end = time.perf_counter_ns()
        if self.layers:
            self.discovering = False

    def grad(self, p):
        self.grad_at[id(p)] = time.perf_counter_ns()

    def times(self):
        """(forward, backward) per layer of the last pass, in ns."""
        L = len(self.layers)
        start = [self.forward_at.get(l, self.t_end) for l in range(L)]
        fw = [max((start[l + 1] if l + 1 < L else self.t_end) - start[l], 0) for l in range(L)]
        done = [max(self.grad_at.get(id(p), self.t_end) for p in ps) for _, ps in self.layers]
        bw = [max(done[l] - (done[l + 1] if l + 1 < L else self.t_end), 0) for l in range(L)]
        return fw, bw

    def profile(self, name, fw, bw):
        """DESIGN.md's profile format, with these per-layer times (ns)."""
        return {"name": name, "batch_size": max(self.batch_size, 1),
                "layers": [{"name": lname, "forward_ms": fw[l] / 1e6, "backward_ms": bw[l] / 1e6,
                            "tensors": [{"name": self.names[id(p)], "elements": p.numel()} for p in ps]}
                           for l, (lname, ps) in enumerate(self.layers)]}

    def hook(self, on_begin, on_enter, on_end):
        """Registers the forward hooks on the model; returns their handles."""
        # A hook that returned a value would replace the module's input or output: these
        # never do, whatever the callbacks return.
        def begin(_m, inputs):
            on_begin(inputs)

        def end(_m, _inputs, _output):
            on_end()

        def enter(name):
            def pre_hook(m, _inputs):
                on_enter(name, m)
            return pre_hook

        handles = [self.model.register_forward_pre_hook(begin)]
        for name, module in self.model.named_modules():
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(self.model.register_forward_hook(end))
        return handles


class _Integration:
    """The hooks of one (optimizer, model) pair and the session they drive."""

    def __init__(self, optimizer, model, policy, knobs, servers, bandwidth, congestion,
                 connect_timeout, peer_timeout, architecture):
        self.opt = optimizer
        self.model = model
        self.policy = policy
        self.architecture = architecture or ""
        self.knobs = {k: _knob_text(v) for k, v in knobs.items()}
        self.servers = servers
        self.store = None  # rank 0 of an all-reduce job: the rendezvous store
        self.bandwidth = bandwidth
        self.congestion = congestion
        self.connect_timeout = connect_timeout
        self.peer_timeout = peer_timeout
        self.base = type(optimizer)
        self.session = None
        self.state = "recording"  # -> "recorded" (first forward seen) -> "running" -> "closed"
        self.report = None
        self.handles = []
        self.nodes = []
        self.delayed = False
        self.update_log = []  # delayed updates applied: (before, layer, first, last)
        self.tapping = False

        self.rec = _Recorder(model)
        names = self.names = self.rec.names
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError("quicksilver.torch: parameter '{}' is {} on {}: only float32 CPU parameters "
                                 "are supported".format(names[id(p)], p.dtype, p.device))
        model_ids = {id(p) for p in self.params}
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in model_ids and p.requires_grad:
                    raise ValueError("quicksilver.torch: the optimizer updates a parameter of shape {} that is "
                                     "not a trainable parameter of the model".format(tuple(p.shape)))
        # Validates the policy and the knobs before any training (a one-layer stand-in).
        _qs.Job(json.dumps({"name": "check", "layers": [{"name": "l", "forward_ms": 0, "backward_ms": 0,
                                                         "tensors": [{"name": "t", "elements": 1}]}]}),
                policy, self.knobs, 1, 1, bandwidth, congestion, connect_timeout, peer_timeout, self.architecture)

        # Layers: the modules that own trainable parameters, in first-use order.
        self.handles += self.rec.hook(self._begin, self._pre_hook, self._end)
        for p in self.params:
            handle, node = _accumulate_grad_hook(p, lambda p=p: self._grad_hook(p))
            self.handles.append(handle)
            self.nodes.append(node)
        # model.zero_grad() would clear sums not yet applied: it does what optimizer.zero_grad() does.
        self.model_zero_grad = model.__dict__.get("zero_grad")
        integration = self
        model.zero_grad = lambda set_to_none=None: integration.zero_grad(set_to_none)
        _live.add(self)

    # ---- the hooks ----

    # Until the first step, every pass is timed afresh: the profile has the last forward
    # pass before it (not, say, an evaluation pass before training) and its backward.
    def _begin(self, inputs):
        if self.state in ("recording", "recorded"):
            self.rec.reset()
            self.rec.begin(inputs)

    def _pre_hook(self, name, module):
        if self.state in ("recording", "recorded"):
            self.rec.enter(name, module)
        elif self.state == "running":
            layer = self.rec.layer_of_module.get(id(module))
            if layer is None:
                return
            self.session.enter_forward(layer)
            if self.delayed:
                self._apply_due(layer, self.session.backwards(layer))
            elif self.applied[layer] < self.session.backwards(layer):
                self._apply(layer)

    def _end(self):
        if self.state in ("recording", "recorded"):
            self.rec.end()
            if self.rec.layers:
                self.state = "recorded"
        elif self.state == "running":
            self.session.leave_forward()
            if self.delayed:
                self._measured_pass()

    def _grad_hook(self, p):
        if self.state == "recorded":
            self.rec.grad(p)
        elif self.state == "running":
            t = self.tensor_of[id(p)]
            buf = self.grads[t]
            if p.grad is not buf and (p.grad is None or p.grad.data_ptr() != buf.data_ptr()):
                # Someone replaced .grad (set it to None): the sums go to the registered buffer.
                buf.copy_(p.grad)
                p.grad = buf
            self.session.gradient_ready(t)

    # ---- the first step: the profile, the servers, the session ----

    def _start(self):
        self.layers = self.rec.layers
        unused = [self.names[id(p)] for p in self.params if id(p) not in self.rec.assigned]
        if unused:
            raise RuntimeError("quicksilver.torch: the first forward pass did not use parameters {}: every "
                               "trainable parameter must be used in every pass".format(", ".join(unused[:5])))
        nograd = [self.names[id(p)] for p in self.params if p.grad is None]
        if nograd:
            raise RuntimeError("quicksilver.torch: parameters {} got no gradient in the first backward pass"
                               .format(", ".join(nograd[:5])))
        L = len(self.layers)
        # The times of the first pass (the first iteration's: they include its warm-up).
        profile = self.rec.profile(type(self.model).__name__, *self.rec.times())
        size, rank = _env["size"], _env["rank"]
        if size > 1:
            # Every worker plans with rank 0's measured times; the layers must agree.
            box = [profile]
            dist.broadcast_object_list(box, src=0)
            theirs = box[0]
            mine = [(l["name"], [(t["name"], t["elements"]) for t in l["tensors"]]) for l in profile["layers"]]
            root = [(l["name"], [(t["name"], t["elements"]) for t in l["tensors"]]) for l in theirs["layers"]]
            if mine != root:
                raise RuntimeError("quicksilver.torch: rank {}'s model differs from rank 0's (layers in first-use "
                                   "order, their parameters and sizes)".format(rank))
            profile = theirs
        self.profile = profile
        servers = self.servers
        hosted = None
        links = []
        # The job's secret: drawn by rank 0, shared over torch.distributed (the channel the
        # script trusts already); the servers and the all-reduce store demand it
        # (docs/reliability.md). Separately started servers have their own (none here).
        secret = os.urandom(32) if rank == 0 else None
        if size > 1:
            box = [secret]
            dist.broadcast_object_list(box, src=0)
            secret = box[0]
        job_args = (json.dumps(profile), self.policy, self.knobs, size)
        probe = _qs.Job(*job_args, 1, self.bandwidth, self.congestion, self.connect_timeout, self.peer_timeout,
                        self.architecture)
        if probe.allreduce:
            # All-reduce on gloo: rank 0 hosts the rendezvous store; every worker binds its
            # gloo context to the address it reaches MASTER_ADDR from.
            job = probe
            me = _my_address(_env["master_addr"]) if size > 1 else "127.0.0.1"
            box = [None]
            if rank == 0:
                self.store = _qs.Store(size, me, secret)
                box = [(me, self.store.port)]
            if size > 1:
                dist.broadcast_object_list(box, src=0)
            endpoints = [box[0]]
            links = [me]
        elif servers is None:
            job = _qs.Job(*job_args, size, self.bandwidth, self.congestion, self.connect_timeout, self.peer_timeout)
            host = _my_address(_env["master_addr"]) if size > 1 else "127.0.0.1"
            hosted = _qs.Server(job, rank, host, secret)
            me = (host, hosted.port)
            endpoints = [me]
            if size > 1:
                endpoints = [None] * size
                dist.all_gather_object(endpoints, me)
        else:
            endpoints = _parse_servers(servers)
            job = _qs.Job(*job_args, len(endpoints), self.bandwidth, self.congestion, self.connect_timeout,
                          self.peer_timeout)
        # The registry: tensor ids in layer order, each parameter's own .grad.
        self.layer_params = [ps for _, ps in self.layers]
        self.tensor_of = {}
        self.grads = []
        for ps in self.layer_params:
            for p in ps:
                g = p.grad
                if not g.is_contiguous() or g.data_ptr() == 0:
                    p.grad = g = g.contiguous().clone()
                self.tensor_of[id(p)] = len(self.grads)
                self.grads.append(g)
        self.layer_grads = [[self.grads[self.tensor_of[id(p)]] for p in ps] for ps in self.layer_params]
        # Each layer's parameters within each of the optimizer's groups (per-layer steps).
        self.layer_groups = []
        for ps in self.layer_params:
            ids = {id(p) for p in ps}
            self.layer_groups.append([[p for p in g["params"] if id(p) in ids] for g in self.opt.param_groups])
        self.applied = [0] * L
        self.session = _qs.Session(job, rank, endpoints, [(g.data_ptr(), g.numel()) for g in self.grads], hosted,
                                   links, "ring", secret if servers is None else b"")
        self.state = "running"
        self.delayed = self.session.delayed_updates
        if self.delayed and rank == 0:
            _loss_tap.acquire()
            self.tapping = True
            self.measure = None    # this pass's sums (_measure)
            self.measured = None   # the last complete measurement (grad_sq, noise)
            self.noise = None      # sigma, measured on passes whose updates were k = 1
            self.measured_before = None  # the pass measured last
            self.loss = None       # the last loss the tap saw
        # The first backward's gradients, as its hooks would have reported them.
        for l in reversed(range(L)):
            for p in self.layer_params[l]:
                self.session.gradient_ready(self.tensor_of[id(p)])

    def _step_layer(self, l, divisor):
        """The wrapped optimizer's step on layer l's parameters alone, its .grad (the sums)
        divided by `divisor` first."""
        for p, g in zip(self.layer_params[l], self.layer_grads[l]):
            if p.grad is not g:
                p.grad = g
            g.div_(divisor)
        groups = self.opt.param_groups
        self.opt.param_groups = [dict(g, params=ps) for g, ps in zip(groups, self.layer_groups[l]) if ps]
        try:
            self.base.step(self.opt)
        finally:
            self.opt.param_groups = groups

    def _apply(self, l):
        """The optimizer's update of layer l's parameters, on the average of the sums."""
        self._step_layer(l, _env["size"])
        for g in self.layer_grads[l]:
            g.zero_()
        self.applied[l] += 1

    # Rank 0 measures the gradient's noise on every 4th pass that can (a copy of each
    # layer's gradient): the Preserver judges means over many iterations.
    MEASURE_EVERY = 4

    def _apply_due(self, l, before):
        """Delayed updates: layer l's updates due before this forward pass (after `before`
        backward passes), each one step on its sums over workers x iterations; then the
        gradient buffers are cleared for the next backward (the last one's gradients were
        copied when it ended)."""
        # Measured once per training pass (an evaluation pass after it sees zeroed buffers).
        measuring = self.tapping and before != _qs.AFTER_TRAINING and before != self.measured_before
        if measuring:
            self._measure_local(l, before)
        for first, last in self.session.take_updates(l, before):
            local = None
            if measuring and first == last == before - 1 and (before % self.MEASURE_EVERY == 1
                                                             or self.noise is None):
                local = [g.clone() for g in self.layer_grads[l]]
            self.session.load_update(l, first, last)
            if measuring:
                self._measure(l, before, _env["size"] * (last - first + 1), local)
            self._step_layer(l, _env["size"] * (last - first + 1))
            self.update_log.append((before, l, first, last))
        for g in self.layer_grads[l]:
            g.zero_()

    def _pass_measure(self, before):
        if self.measure is None or self.measure[0] != before:
            # before, layers, G.G, noise layers, G.G, G.g, local layers, g.g
            self.measure = [before, 0, 0.0, 0, 0.0, 0.0, 0, 0.0]
        return self.measure

    def _measure_local(self, l, before):
        """Rank 0: this worker's own gradient of the last iteration, g.g, the estimate of mu
        when no update applies (a schedule that delays everything still gets judged; it
        overestimates mu by the noise over the batch)."""
        m = self._pass_measure(before)
        for g in self.layer_grads[l]:
            v = g.view(-1)
            m[7] += float(torch.dot(v, v))
        m[6] += 1

    def _measure(self, l, before, divisor, local):
        """Rank 0, an update of layer l before pass `before`: with G the average its step
        applies, accumulates G.G (mu, IV-C2's squared gradient); for an update of the last
        iteration alone, with g this worker's own gradient (`local`), G.g too."""
        m = self._pass_measure(before)
        for k, g in enumerate(self.layer_grads[l]):
            avg = (g / divisor).view(-1)
            gg = float(torch.dot(avg, avg))
            m[2] += gg
            if local is not None:
                m[4] += gg
                m[5] += float(torch.dot(avg, local[k].view(-1)))
        m[1] += 1
        if local is not None:
            m[3] += 1

    def _measured_pass(self):
        """After a forward pass: a measurement that covered every layer becomes the last
        one. sigma (the per-sample deviation of the gradient along itself) from this
        worker's deviation from the average, on passes whose updates were of the last
        iteration alone: Var(G.g_w) ~ sigma^2 / B per worker of batch B; carried over
        between such passes; 0 until one (and with one worker, which cannot see it)."""
        if not self.tapping or self.measure is None:
            return
        before, layers, gg, noisy, gg1, gl, mine, ggl = self.measure
        self.measure = None
        self.measured_before = before
        L, size = len(self.layers), _env["size"]
        if noisy == L and size > 1:
            self.noise = (self.rec.batch_size * size / (size - 1) * (gl - gg1) ** 2) ** 0.5
        if layers == L:
            self.measured = (gg, self.noise or 0.0)
        elif mine == L:
            self.measured = (ggl, self.noise or 0.0)

    def _feedback(self):
        """Rank 0, each step: the loss and the last gradient measurement to the policy."""
        loss = _loss_tap.take()
        if loss is not None:
            self.loss = loss
        if self.measured is None or self.loss is None:
            return
        lr = float(self.opt.param_groups[0].get("lr", 0.0))
        self.session.feedback(self.session.backwards(0) - 1, self.loss, self.measured[0], self.measured[1], lr,
                              float(self.rec.batch_size * _env["size"]))

    # ---- the optimizer's methods ----

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.state == "recorded":
            self._start()
        elif self.state != "running":
            if self.state == "closed":
                raise RuntimeError("quicksilver.torch: step() after shutdown()")
            raise RuntimeError("quicksilver.torch: step() before any forward pass of the model")
        if self.delayed:
            if self.tapping:
                self._feedback()
            return loss
        for l in range(len(self.layers)):
            if self.applied[l] < self.session.backwards(l) and self.session.sum_ready(l, False):
                self._apply(l)
        return loss

    def zero_grad(self, set_to_none=None):
        # Running, every gradient buffer is zeroed right after its layer's update (the sums
        # land in it: clearing it earlier would lose them). Before, the optimizer's own.
        if self.session is None or self.state == "closed":
            if set_to_none is None:
                self.base.zero_grad(self.opt)
            else:
                self.base.zero_grad(self.opt, set_to_none=set_to_none)

    def synchronize(self):
        """Waits for every sum of the last backward pass and applies the updates. Under
        DeFT the updates follow its schedule: this applies none (shutdown() the rest)."""
        if self.state != "running" or self.delayed:
            return
        for l in range(len(self.layers)):
            if self.applied[l] < self.session.backwards(l):
                self.session.sum_ready(l, True)
                self._apply(l)

    def shutdown(self):
        if self.state == "closed":
            return self.report
        try:
            if self.state == "running":
                self.synchronize()
                self.report = self.session.finish()
                if self.delayed:  # the updates held back until the end of training
                    for l in range(len(self.layers)):
                        self._apply_due(l, _qs.AFTER_TRAINING)
        except Exception:
            if self.session is not None:
                self.session.abort("shutdown after a failure")
            raise
        finally:
            self.state = "closed"
            # The session's buffers (this process's server shares, DeFT's merged sums) go
            # now, not when the garbage collector breaks the optimizer's cycle with us.
            self.session = None
            if self.tapping:
                _loss_tap.release()
                self.tapping = False
            for h in self.handles:
                h.remove()
            self.nodes = []
            if self.model_zero_grad is None:
                self.model.__dict__.pop("zero_grad", None)
            else:
                self.model.zero_grad = self.model_zero_grad
            _live.discard(self)
        return self.report


def _knob_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)  # sizes as numbers are bytes; with a unit, "32KiB"; times need one: "200us"


def _parse_servers(servers):
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s]
    out = []
    for s in servers:
        host, sep, port = s.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError("quicksilver.torch: server address {!r} is not HOST:PORT".format(s))
        out.append((host, int(port)))
    if not out:
        raise ValueError("quicksilver.torch: servers= lists no server")
    return out


def DistributedOptimizer(optimizer, model, policy="mercury", servers=None, bandwidth="10Gbps",
                         congestion="cubic", connect_timeout=120.0, peer_timeout=600.0, architecture=None,
                         **knobs):
    """Makes `optimizer` (any torch.optim optimizer of `model`'s parameters) train through
    Quicksilver with `policy` (one of policies()) and its knobs as keywords (e.g.
    packet_size="32KiB", partition_size=4000000, credit_size="20MB"; docs/pytorch.md).
    Returns the same object, of a subclass of its class: isinstance checks and LR
    schedulers keep working. `servers`: "host:port,..." of separately started `quicksilver
    server` processes (default: each process hosts one server, N = M). `architecture`:
    "ps" or "allreduce" (gloo; rank 0 hosts the rendezvous store); by default the policy's
    own, and "ps" for the names both have (wfbp, bytescheduler). `bandwidth`: the
    nominal NIC rate for the policies that plan with one. Added methods: synchronize()
    (wait for and apply every outstanding update, e.g. before reading the parameters
    without a forward pass), shutdown() (end; returns this worker's measurements),
    quicksilver_profile() (the measured profile, DESIGN.md's format), quicksilver_updates()
    (DeFT: the delayed updates applied, as (before, layer, first, last): layer's step on the
    sums of iterations first..last, before the forward pass after `before` backward passes;
    quicksilver.torch.AFTER_TRAINING: at shutdown)."""
    _require_init("DistributedOptimizer")
    if isinstance(optimizer.__class__.__dict__.get("_quicksilver"), bool):
        raise ValueError("quicksilver.torch.DistributedOptimizer: this optimizer is wrapped already")
    integration = _Integration(optimizer, model, policy, knobs, servers, bandwidth, congestion,
                               connect_timeout, peer_timeout, architecture)
    base = type(optimizer)
    cls = type("Distributed" + base.__name__, (base,), {
        "_quicksilver": True,
        "step": lambda self, closure=None: self._qs.step(closure),
        "zero_grad": lambda self, set_to_none=None: self._qs.zero_grad(set_to_none),
        "synchronize": lambda self: self._qs.synchronize(),
        "shutdown": lambda self: self._qs.shutdown(),
        "quicksilver_profile": lambda self: getattr(self._qs, "profile", None),
        "quicksilver_updates": lambda self: list(self._qs.update_log),
    })
    optimizer._qs = integration
    optimizer.__class__ = cls
    return optimizer


@atexit.register
def _at_exit():
    for integration in list(_live):
        try:
            integration.shutdown()
        except Exception as e:  # the process is ending: say why, do not hang
            print("quicksilver.torch: at exit: {}".format(e), file=sys.stderr)
    # The process group init() started goes while the interpreter is whole: left to the
    # interpreter's teardown, gloo's threads can abort the process after training ended
    # ("terminate called without an active exception", exit 134; seen once on rank 1 of a
    # time-to-accuracy run, and the subject of pytorch/pytorch PR 179291).
    if _env.get("owns_group") and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:
            print("quicksilver.torch: at exit: {}".format(e), file=sys.stderr)
        _env["owns_group"] = False
