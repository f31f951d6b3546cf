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
  buffer is the parameter's own .grad, which the sums overwrite in place, for float32 on
  the CPU; a parameter on a GPU or of another dtype is staged through a host float32
  buffer, pinned on CUDA: quicksilver/staging.py);
- step() applies the update of every layer whose sums are already in, and returns; a
  layer's forward pre-hook waits (GIL released) only for that layer's sums, then applies
  its update: the next forward pass overlaps the rest of the communication;
- the update is the wrapped optimizer's own step() on that layer's parameters alone, on
  the sum divided by the number of workers (the average, as DistributedDataParallel),
  with the hyperparameters its step() saw (_Integration: a pass's fate);
- from its hook until its update a gradient belongs to the transport: a write by the
  user's code is seen by its version counter and raises; synchronize() hands the
  averages over for a clip or GradScaler, skip_synchronize() steps with them;
- reads of the model or the optimizer (state_dict(), parameters(), a deepcopy, a pickle)
  first apply every update of the steps taken (settle).

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
import contextlib
import datetime
import inspect
import json
import os
import socket
import sys
import time
import types
import weakref

import torch
import torch.distributed as dist
import torch.optim.optimizer as _torch_optimizer
from torch.autograd import Variable

try:
    from . import _quicksilver as _qs
    from .staging import Staging
    from . import auto as _auto
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "quicksilver.torch: the compiled module quicksilver._quicksilver is missing ({}); build "
        "with scripts/build.sh (QS_WITH_TORCH=ON) and put build/python on PYTHONPATH".format(e)) from e

QuicksilverError = _qs.QuicksilverError
AFTER_TRAINING = _qs.AFTER_TRAINING

__all__ = ["init", "rank", "size", "local_rank", "local_size", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_optimizer_state", "broadcast_object", "allreduce", "allreduce_", "Average", "Sum",
           "Compression", "shutdown", "QuicksilverError", "policies"]

_env = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "master_addr": "127.0.0.1", "initialized": False,
        "timeout": 120.0}
_live = weakref.WeakSet()  # integrations not yet shut down (finished at exit)
# Tensors handed to torch.distributed, each with its use count before the call. Under torch
# 2.x a tensor whose last Python reference goes while gloo's worker thread still holds the
# collective's work is left to that thread to free, and freeing it takes the GIL: at the
# interpreter's teardown the thread is ended inside the work's destructor and the process
# aborts ("terminate called without an active exception", exit 134, after training ended;
# destroy_process_group() does not stop those threads once torch._dynamo, which any
# torch.optim optimizer imports, holds the group). So the references stay here until gloo
# has let go (_hold), and _at_exit waits for that (_settle) before the interpreter goes.
_held = []
_GLOO_LET_GO_S = 0.1  # _at_exit's wait for gloo's threads to drop the script's own collectives
_USE_COUNT = hasattr(torch.Tensor, "_use_count")  # torch >= 2.0; 1.13 frees in the caller


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
                local_size=_env_int("LOCAL_WORLD_SIZE", size),
                master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), initialized=True, timeout=timeout)


def rank():
    return _env["rank"]


def size():
    return _env["size"]


def local_rank():
    return _env["local_rank"]


def local_size():
    """Workers on this host: LOCAL_WORLD_SIZE (torchrun and `quicksilver run --script` set
    it), else every worker."""
    return _env["local_size"]


def policies():
    """The policies this build runs from PyTorch: the parameter-server ones (TCP) and the
    all-reduce ones (gloo), without the simulator's compute-only 'oracle'."""
    names = list(_qs.ps_policies()) + [p for p in _qs.allreduce_policies() if _qs.is_allreduce_policy(p)]
    return [p for p in names if _qs.communicates(p)]


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
        _broadcast(t.data, root_rank)


def _hold(*tensors):
    """Keeps `tensors` (this module's own, about to be handed to a collective: nothing else
    takes a lasting reference to them) until gloo's threads have let them go; drops the
    ones held before that they have let go of (see _held)."""
    if _USE_COUNT:
        _held[:] = [h for h in _held if not _released(h)]
        _held.append([(t, t._use_count()) for t in tensors])


def _released(held):
    return all(t._use_count() <= before for t, before in held)


def _settle(limit_s=10.0):
    """Waits (releasing the GIL) until gloo's threads hold none of the tensors of _held; a
    collective that never ends (a peer died) is waited for at most limit_s."""
    deadline = time.monotonic() + limit_s
    while True:
        _held[:] = [h for h in _held if not _released(h)]
        if not _held or time.monotonic() > deadline:
            return
        time.sleep(0.001)


def _broadcast(t, root_rank):
    """dist.broadcast of t in place, for any layout and dtype, through a private copy (see
    _held; gloo has no bfloat16: a float32 copy carries it, exactly)."""
    tmp = t.detach().to(torch.float32 if t.dtype == torch.bfloat16 else t.dtype, memory_format=torch.contiguous_format,
                        copy=True)
    _hold(tmp)
    dist.broadcast(tmp, src=root_rank)
    with torch.no_grad():
        t.copy_(tmp)


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


def _eager(fn):
    """`fn` as a hook torch.compile never traces (torch 2.x): it runs as Python, at its
    place in every call, a graph break around it (the hooks wait for sums and apply
    updates: side effects a traced graph would hoist or drop)."""
    disable = getattr(getattr(torch, "_dynamo", None), "disable", None)
    return disable(fn) if disable is not None else fn


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
        # Times of a model on a GPU are CUDA events recorded on the current stream (its
        # kernels run after the hooks that queue them); resolved once the pass is done.
        devices = {p.device for p in model.parameters() if p.device.type == "cuda"}
        self.cuda = next(iter(devices)) if devices else None
        self.names = {}
        for n, p in model.named_parameters():
            self.names.setdefault(id(p), n)
        self.layer_of_module = {}  # id(module) -> layer, or None
        self.layers = []           # [(name, [params])]
        self.assigned = set()      # id of every parameter some layer owns
        self.discovering = True
        self.batch_size = 1
        self.reset()

    def now(self):
        if self.cuda is None:
            return time.perf_counter_ns()
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.cuda))
        return e

    def reset(self):
        self.t_begin = self.t_end = None
        self.forward_at = {}  # layer -> ns
        self.grad_at = {}     # id(param) -> ns

    def begin(self, inputs):
        self.t_begin = self.now()
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
            self.forward_at[layer] = self.now()
        return layer

    def end(self):
        self.t_end = self.now()
        if self.layers:
            self.discovering = False

    def grad(self, p):
        self.grad_at[id(p)] = self.now()

    def times(self):
        """(forward, backward) per layer of the last pass, in ns (on CUDA: waits for the
        pass's last event, then the events' times from the pass's beginning)."""
        L = len(self.layers)
        if self.cuda is None:
            ns = lambda t: t
        else:
            for e in [self.t_end] + list(self.grad_at.values()):
                e.synchronize()
            begin = self.t_begin
            ns = lambda e: int(begin.elapsed_time(e) * 1e6)
        end = ns(self.t_end)
        start = [ns(self.forward_at[l]) if l in self.forward_at else end for l in range(L)]
        fw = [max((start[l + 1] if l + 1 < L else end) - start[l], 0) for l in range(L)]
        done = [max(ns(self.grad_at[id(p)]) if id(p) in self.grad_at else end for p in ps) for _, ps in self.layers]
        bw = [max(done[l] - (done[l + 1] if l + 1 < L else end), 0) for l in range(L)]
        return fw, bw

    def adopt(self, params):
        """Parameters (of `params`) whose own module the recorded pass never entered: read
        by another module's forward (MultiheadAttention reads out_proj's weight itself; a
        ParameterList; F.linear(x, self.child.weight)), or not used at all. Each joins the
        layer of its nearest ancestor module that is a layer, whose pre-hook comes before
        any read inside that ancestor's forward; without one, the first layer, entered
        before the model reads anything. Their updates are then never applied after a
        forward has read them."""
        self.layers = [(name, list(ps)) for name, ps in self.layers]
        owner = {}
        for name, module in self.model.named_modules():
            for p in module.parameters(recurse=False):
                owner.setdefault(id(p), name)
        layer_at = {}
        for name, module in self.model.named_modules():
            l = self.layer_of_module.get(id(module))
            if l is not None:
                layer_at.setdefault(name, l)
        for p in params:
            if id(p) in self.assigned:
                continue
            path = owner.get(id(p), "")
            l = 0
            while path:
                path = path.rpartition(".")[0]
                if path in layer_at:
                    l = layer_at[path]
                    break
            self.layers[l][1].append(p)
            self.assigned.add(id(p))

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
        @_eager
        def begin(_m, inputs):
            on_begin(inputs)

        @_eager
        def end(_m, _inputs, _output):
            on_end()

        def enter(name):
            @_eager
            def pre_hook(m, _inputs):
                on_enter(name, m)
            return pre_hook

        handles = [self.model.register_forward_pre_hook(begin)]
        for name, module in self.model.named_modules():
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                handles.append(module.register_forward_pre_hook(enter(name)))
        try:  # torch >= 2.0: also when the forward raises (the integration leaves it then)
            handles.append(self.model.register_forward_hook(end, always_call=True))
        except TypeError:
            handles.append(self.model.register_forward_hook(end))
        return handles


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_SKIPPED = "skipped"  # a pass whose step() never came: zero_grad() discarded it


def _hyperparameters(groups):
    """The optimizer's hyperparameters as they are now (every key of every param group but
    its parameters), copied so that a later change (a scheduler's, a tensor lr filled in
    place) does not reach them: the update of a step uses the values of that step."""
    return [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
            for g in groups]


def _raw_step(cls):
    """cls.step without the profiling wrapper torch's Optimizer puts around it (marked
    `hooked`; its step pre/post hooks run once per user step() here, not once per layer)."""
    step = cls.step
    return step.__wrapped__ if getattr(step, "hooked", False) and hasattr(step, "__wrapped__") else step


class _Integration:
    """The hooks of one (optimizer, model) pair and the session they drive.

    Passes: a backward pass whose gradients go to the transport (the last of
    backward_passes_per_step) is a pass, numbered from 1. Each pass's fate is decided by
    the user's step() (the hyperparameters it had, _hyperparameters) or by a zero_grad()
    without step() (_SKIPPED); a layer's update of pass n is applied once its sums are in
    and its fate is known, with that fate's hyperparameters (issue: "hyperparameters
    belong to the step they were set for"). The transport owns a layer's .grad buffers
    from the hook that reports them until the update; the user may write them only after
    synchronize() (which hands the averages over); a write without it is seen by the
    buffer's version counter and raises."""

    def __init__(self, optimizer, model, policy, knobs, servers, bandwidth, settings, architecture, options):
        self.opt = optimizer
        self.model = model
        self.policy = policy
        self.architecture = architecture or ""
        # policy="auto" (quicksilver/auto.py): the job starts with its architecture's
        # reference policy and the planner decides at fixed passes.
        self.auto = None
        self.auto_options = None
        self.decision_flag = None
        self.decisions = []      # every rank's log of the decisions (rank 0's, broadcast)
        self.pass_base = 0       # passes before the running session (a switch starts one)
        self.pass_start = None   # rank 0, auto: when this pass's forward began
        self.pass_wait = 0.0     # ... and how long it waited at the gates since
        if policy == "auto":
            self.architecture = self.architecture or "ps"
            self.policy = _auto.START_POLICY[self.architecture]
            self.auto_options = options["auto"]
            self.next_decision = _auto.first_decision(self.auto_options["replan_every"])
            self.deciding = False      # a decision was begun and is not applied yet
            self.decision_flag = None  # (rank 0's "ready" flag, its broadcast's work)
            policy = self.policy
        self.knobs = {k: _knob_text(v) for k, v in knobs.items()}
        self.servers = servers
        self.store = None  # rank 0 of an all-reduce job: the rendezvous store
        self.bandwidth = bandwidth
        self.settings = settings  # the runtime's (_qs.Job checks them by their table's names)
        self.k = options["backward_passes_per_step"]
        self.average = options["op"] == Average
        self.find_unused = options["find_unused_parameters"]
        self.broadcast_buffers = options["broadcast_buffers"]
        self.check_every = options["check_consistency"]
        self.compression = options["compression"]
        self.base = type(optimizer)
        self.raw_step = _raw_step(self.base)
        self.session = None
        self.staging = None
        self.state = "recording"  # -> "recorded" (first forward seen) -> "running" -> "closed"
        self.report = None
        self.handles = []
        self.nodes = []
        self.delayed = False
        self.update_log = []  # delayed updates applied: (before, layer, first, last)
        self.tapping = False
        # Passes (see the class comment).
        self.passes = 0          # passes handed to the transport
        self.stepped = 0         # passes whose fate is decided
        self.settled = 0         # every layer's update through this pass is applied
        self.fate = {}           # pass -> hyperparameters, or _SKIPPED
        self.averaged = 0        # the pass synchronize() averaged in place (0: none)
        self.skipping = False    # inside skip_synchronize()
        self.micro = 0           # backward passes of the current accumulation cycle
        self.in_backward = False # a backward pass of this model is running
        self.in_forward = False  # between the model's forward pre-hook and forward hook
        self.cycle_used = set()  # id(p) of every parameter with a gradient this cycle
        self.reported = set()    # id(p) handed to the transport this pass
        self.versions = {}       # id(p) -> its buffer's version when handed over
        self.unused_masks = {}   # pass -> (mask, work): find_unused_parameters' global use
        # find_unused_parameters: whether a parameter's .grad would be None at a step had
        # no worker used it (DDP leaves such a .grad as zero_grad() left it): the last pass
        # whose update gave it a gradient, against the steps taken at the last zero_grad()
        # that set gradients to None; per pass, the parameters whose .grad would be None.
        self.zero_grad_to_none = _zero_grad_default(self.base)
        self.had_grad = {}       # id(p) -> the last pass whose update gave it a gradient
        self.last_clear = 0      # self.stepped at the last zero_grad() to None
        self.none_at = {}        # pass -> {id(p)}
        self.sync_buffers_next = True  # DDP: before a forward that follows one with grad enabled
        self.next_check = self.check_every
        self.pending_check = None  # (step, gathered digests, the all-gather's work)
        self.next_layer = 0      # the layer the forward pass enters next

        self.rec = _Recorder(model)
        names = self.names = self.rec.names
        self.params = [p for p in model.parameters() if p.requires_grad]
        devices = set()
        for p in self.params:
            if p.dtype not in _DTYPES or p.device.type not in ("cpu", "cuda"):
                raise ValueError("quicksilver.torch: parameter '{}' is {} on {}: supported are float32, bfloat16 and "
                                 "float16 parameters on the CPU or on one CUDA device".format(
                                     names[id(p)], p.dtype, p.device))
            devices.add(p.device)
        if len(devices) > 1:
            raise ValueError("quicksilver.torch: the model's parameters are on {}: one device per process (a "
                             "GPU per rank: torch.cuda.set_device(local_rank) and model.to(local_rank))".format(
                                 ", ".join(sorted(str(d) for d in devices))))
        model_ids = {id(p) for p in self.params}
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in model_ids and p.requires_grad:
                    raise ValueError("quicksilver.torch: the optimizer updates a parameter of shape {} that is "
                                     "not a trainable parameter of the model".format(tuple(p.shape)))
        if self.find_unused and _qs.delays_updates(policy) and self.architecture != "ps":
            raise ValueError("quicksilver.torch: find_unused_parameters=True does not apply to policy '{}': its "
                             "delayed updates sum each pass's gradients with later ones".format(policy))
        # Validates the policy and the knobs before any training (a one-layer stand-in).
        _qs.Job(json.dumps({"name": "check", "layers": [{"name": "l", "forward_ms": 0, "backward_ms": 0,
                                                         "tensors": [{"name": "t", "elements": 1}]}]}),
                policy, self.knobs, 1, 1, bandwidth, settings, self.architecture, compression=self.compression)

        # Layers: the modules that own trainable parameters, in first-use order.
        self.handles += self.rec.hook(self._begin, self._pre_hook, self._end)
        for p in self.params:
            handle, node = _accumulate_grad_hook(p, lambda p=p: self._grad_hook(p))
            self.handles.append(handle)
            self.nodes.append(node)
        self._install_model_overrides()
        _live.add(self)

    def _broken(self, error):
        """A loop that cannot be right: the session stops at once (the peers fail fast, not at
        their timeouts) and `error` is what the user is told."""
        if self.session is not None and self.state == "running":
            self.session.abort(str(error))
            self.state = "failed"
        return error

    def use_names(self, named_parameters):
        """Horovod's named_parameters: (name, parameter) pairs, names unique, covering
        every parameter the optimizer updates; the names appear in messages and profiles."""
        pairs = list(named_parameters)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in pairs):
            raise ValueError("quicksilver.torch.DistributedOptimizer: named_parameters must be (name, parameter) "
                             "pairs, e.g. model.named_parameters()")
        names = [n for n, _ in pairs]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("quicksilver.torch.DistributedOptimizer: named_parameters names {} more than once"
                             .format(", ".join(dups)))
        mine = {id(p) for p in self.params}
        foreign = [n for n, p in pairs if id(p) not in mine and p.requires_grad]
        if foreign:
            raise ValueError("quicksilver.torch.DistributedOptimizer: named_parameters {} are not trainable "
                             "parameters of the model".format(", ".join(foreign[:5])))
        named = {id(p) for _, p in pairs}
        unnamed = [p for g in self.opt.param_groups for p in g["params"] if p.requires_grad and id(p) not in named]
        if unnamed:
            raise ValueError("quicksilver.torch.DistributedOptimizer: named_parameters was given, but {} of the "
                             "optimizer's parameters are not in it (e.g. '{}')".format(
                                 len(unnamed), self.names.get(id(unnamed[0]), "?")))
        for n, p in pairs:
            self.names[id(p)] = n

    # ---- what the model's readers see ----

    def _install_model_overrides(self):
        """Reads of the model settle first (every update of a step taken is applied): its
        and its modules' state_dict(), parameters(), named_parameters(),
        load_state_dict(); a copy or pickle of it (copy.deepcopy, torch.save) settles too
        and carries none of these hooks. Its and its modules' zero_grad() is the
        optimizer's (clearing a buffer the sums still land in would lose them)."""
        integration = self
        self.overridden = []  # (module, name, what was in its __dict__, or _MISSING)
        hook_ids = {h.id for h in self.handles if hasattr(h, "id")}

        def put(module, name, fn):
            # A method bound to the module, as the class's own would be (torch.compile
            # looks at such attributes' __func__).
            self.overridden.append((module, name, module.__dict__.get(name, _MISSING)))
            module.__dict__[name] = types.MethodType(fn, module)

        for module in self.model.modules():
            cls = type(module)

            def reader(name, cls=cls):
                method = getattr(cls, name)

                def read(module, *args, **kwargs):
                    integration.settle()
                    return method(module, *args, **kwargs)
                return read

            for name in ("state_dict", "load_state_dict", "parameters", "named_parameters"):
                put(module, name, reader(name))

            def getstate(module, cls=cls):
                integration.settle()
                base = getattr(cls, "__getstate__", None)
                state = dict(base(module) if base is not None else module.__dict__)
                for name in ("state_dict", "load_state_dict", "parameters", "named_parameters", "zero_grad",
                             "__getstate__"):
                    state.pop(name, None)
                for key, value in list(state.items()):
                    if key.endswith("_hooks") and isinstance(value, dict) and hook_ids & set(value):
                        state[key] = type(value)((k, v) for k, v in value.items() if k not in hook_ids)
                return state

            put(module, "__getstate__", getstate)
            put(module, "zero_grad", lambda _module, set_to_none=None: integration.zero_grad(set_to_none))

    def _remove_model_overrides(self):
        for module, name, before in reversed(self.overridden):
            if before is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = before
        self.overridden = []

    def settle(self, always=False):
        """Applies every update whose step() was taken, waiting for its sums: what a read
        of the parameters or of the optimizer's state must see. Within the model's own
        forward pass (a model that reads its parameters()) it does nothing unless
        `always`: there each layer waits for its own update in its pre-hook."""
        if self.state != "running" or (self.in_forward and not always) or self.delayed \
                or self.settled == self.stepped:
            return
        for l in range(len(self.layers)):
            while self.applied[l] < self.stepped:
                self._reported(l)
                self.session.sum_ready(l, True)
                self._apply(l)
        self.settled = self.stepped

    # ---- the hooks ----

    # Until the first step, every pass is timed afresh: the profile has the last forward
    # pass before it (not, say, an evaluation pass before training) and its backward.
    def _begin(self, inputs):
        self.in_forward = True
        if self.broadcast_buffers and self.sync_buffers_next and _env["size"] > 1:
            self._sync_buffers()
        if self.state in ("recording", "recorded"):
            self.rec.reset()
            self.rec.begin(inputs)
        elif self.auto is not None and self.micro == 0 and not self.in_backward and torch.is_grad_enabled():
            self.pass_start = time.perf_counter()
            self.pass_wait = 0.0
        self.next_layer = 0

    def _pre_hook(self, name, module):
        if self.state in ("recording", "recorded"):
            self.rec.enter(name, module)
        elif self.state == "running":
            layer = self.rec.layer_of_module.get(id(module))
            if layer is None:
                return
            if layer > self.next_layer:
                if not self.find_unused:
                    raise self._broken(RuntimeError(
                        "quicksilver.torch: the forward pass used layer '{}' before layer '{}': every pass must use "
                        "the layers with parameters in the order of the first one; a model that skips layers in "
                        "some passes needs DistributedOptimizer(..., find_unused_parameters=True)".format(
                            self.layers[layer][0], self.layers[self.next_layer][0])))
                while self.next_layer < layer:
                    self._enter(self.next_layer)
            self._enter(layer)

    def _enter(self, layer):
        """Layer's forward may start: its gate (the sums of its last pass) and its update."""
        self._reported(layer)
        if self.auto is not None:  # the wait at the gate: communication the compute did not hide
            start = time.perf_counter()
            self.session.enter_forward(layer)
            self.pass_wait += time.perf_counter() - start
        else:
            self.session.enter_forward(layer)
        if layer >= self.next_layer:
            self.next_layer = layer + 1
        if self.delayed:
            self._apply_due(layer, self.session.backwards(layer))
        elif self.applied[layer] < self.stepped:
            self._apply(layer)

    def _end(self):
        self.in_forward = False
        self.sync_buffers_next = torch.is_grad_enabled()
        if self.state in ("recording", "recorded"):
            self.rec.end()
            if self.rec.layers:
                self.state = "recorded"
        elif self.state == "running":
            if self.find_unused:
                while self.next_layer < len(self.layers):
                    self._enter(self.next_layer)
            self.session.leave_forward()
            if self.delayed:
                self._measured_pass()
            if self.check_every and self.stepped >= self.next_check:
                while self.next_check <= self.stepped:
                    self.next_check += self.check_every
                self._check_consistency()

    def _grad_hook(self, p):
        if self.state == "recorded":
            self.rec.grad(p)
            return
        if self.state != "running":
            return
        if not self.in_backward:
            self._backward_begins()
        self.cycle_used.add(id(p))
        if self.micro == self.k:
            self._report(p)

    def _backward_begins(self):
        self.in_backward = True
        Variable._execution_engine.queue_callback(self._backward_ends)
        if self.micro == 0 and self.stepped < self.passes:
            raise self._broken(RuntimeError(
                "quicksilver.torch: a second backward pass without optimizer.step() in between. For gradient "
                "accumulation pass DistributedOptimizer(..., backward_passes_per_step=K) and call step() once "
                "every K backward passes; to drop a pass's gradients, call optimizer.zero_grad() before the next "
                "backward"))
        self.micro += 1
        if self.micro > self.k:
            raise self._broken(RuntimeError(
                "quicksilver.torch: {} backward passes without optimizer.step(), but backward_passes_per_step={}"
                .format(self.micro, self.k)))

    def _report(self, p):
        """Hands p's gradient of this pass to the transport (its registered buffer)."""
        t = self.tensor_of[id(p)]
        buf = self.grads[t]
        if p.grad is not buf:
            # Someone replaced .grad (set it to None): the sums go to the registered buffer.
            if p.grad is None:
                buf.zero_()
            else:
                buf.copy_(p.grad)
            p.grad = buf
        self.reported.add(id(p))
        self.versions[id(p)] = buf._version
        self.staging.to_wire(t, buf)

    def _backward_ends(self):
        """Autograd's callback at the end of the backward pass: the parameters that got no
        gradient in this cycle (find_unused_parameters) or only in its earlier passes are
        reported now; the pass is complete."""
        self.in_backward = False
        if self.micro < self.k:
            return
        missing = [p for p in self.params if id(p) not in self.reported]
        unused = [p for p in missing if id(p) not in self.cycle_used]
        if unused and not self.find_unused:
            raise self._broken(RuntimeError(
                "quicksilver.torch: parameters {} got no gradient in this backward pass: pass "
                "DistributedOptimizer(..., find_unused_parameters=True) for a model that does not use every "
                "parameter in every pass".format(", ".join(self.names[id(p)] for p in unused[:5]))))
        for p in missing:
            if p.grad is None:
                p.grad = self.grads[self.tensor_of[id(p)]]
                p.grad.zero_()
            self._report(p)
        self.passes += 1
        if self.auto is not None and self.pass_start is not None:
            self.auto.record(self.passes, (time.perf_counter() - self.pass_start) * 1e3, self.pass_wait * 1e3)
            self.pass_start = None
        if self.find_unused:
            self._share_use(self.passes)
            self.none_at[self.passes] = {id(p) for p in self.params
                                         if self.had_grad.get(id(p), 0) <= self.last_clear}
        self.reported = set()
        self.cycle_used = set()
        self.micro = 0

    def _share_use(self, n):
        """find_unused_parameters: how many workers used each parameter in pass n (an
        all-reduce of a 0/1 vector on the control plane, waited for at the update): a
        parameter no worker used keeps its .grad as the user's zero_grad() left it, as
        DistributedDataParallel does."""
        mask = torch.tensor([1 if id(p) in self.cycle_used else 0 for p in self.all_params], dtype=torch.int32)
        _hold(mask)
        work = dist.all_reduce(mask, async_op=True) if _env["size"] > 1 else None
        self.unused_masks[n] = (mask, work)

    def _globally_unused(self, n):
        entry = self.unused_masks.get(n)
        if entry is None:
            return set()
        mask, work = entry
        if work is not None:
            work.wait()
            self.unused_masks[n] = (mask, None)
        return {id(p) for p, used in zip(self.all_params, mask.tolist()) if used == 0}

    # ---- the first step: the profile, the servers, the session ----

    def _start(self):
        self.rec.adopt(self.params)
        layers = [(name, list(ps)) for name, ps in self.rec.layers]
        nograd = [p for _, ps in layers for p in ps if p.grad is None]
        if nograd and not self.find_unused:
            raise RuntimeError("quicksilver.torch: parameters {} got no gradient in the first backward pass: pass "
                               "DistributedOptimizer(..., find_unused_parameters=True) for a model that does not use "
                               "every parameter in every pass".format(", ".join(self.names[id(p)] for p in nograd[:5])))
        first_used = {id(p) for _, ps in layers for p in ps if p.grad is not None}
        for p in nograd:
            p.grad = torch.zeros_like(p)
        self.layers = layers
        self.rec.layers = layers
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
        # The job's secret: drawn by rank 0, shared over torch.distributed (the channel the
        # script trusts already); the servers and the all-reduce store demand it
        # (docs/reliability.md). Separately started servers have their own (none here).
        secret = os.urandom(32) if rank == 0 else None
        if size > 1:
            box = [secret]
            dist.broadcast_object_list(box, src=0)
            secret = box[0]
        self.secret = secret
        # The registry: tensor ids in layer order, each parameter's own .grad.
        self.layer_params = [ps for _, ps in self.layers]
        self.all_params = [p for ps in self.layer_params for p in ps]
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
        self.layer_tensors = [[self.tensor_of[id(p)] for p in ps] for ps in self.layer_params]
        self._group_layers()
        self.staging = Staging(self.all_params, self._gradient_ready)
        wire = [self.staging.registered(t, g) for t, g in enumerate(self.grads)]
        self.wire_tensors = [(w.data_ptr(), w.numel(), p.device.type, str(p.dtype).replace("torch.", ""),
                              self.staging.staged[t]) for t, (w, p) in enumerate(zip(wire, self.all_params))]
        self.applied = [0] * L
        self.covered = [0] * L  # delayed updates: per layer, the iterations applied
        opened = time.perf_counter()
        try:
            self._open_session()
        except Exception:
            self.staging.close()  # its thread and pinned buffers go with the failed start
            raise
        if self.auto_options is not None and rank == 0:
            o = self.auto_options
            self.auto = _auto.Planner(_qs, self.architecture, size, size, self.compression, o["allow_stale"],
                                      o["replan_every"])
            self.auto.switch_cost_ms = (time.perf_counter() - opened) * 1e3  # until a switch is measured
        # The first backward's gradients, as its hooks would have reported them.
        for l in reversed(range(L)):
            for p in self.layer_params[l]:
                self._report(p)
        self.passes = 1
        if self.find_unused:
            self.cycle_used = first_used
            self._share_use(1)
            self.none_at[1] = {id(p) for p in self.params}
        self.reported = set()
        self.cycle_used = set()

    def _open_session(self):
        """Starts this rank's session of self.policy on the registered buffers (and its
        server, or rank 0's rendezvous store): at the first step(), and at each switch of
        policy="auto", every rank at the same pass with nothing in flight."""
        size, rank = _env["size"], _env["rank"]
        profile, servers, secret = self.profile, self.servers, self.secret
        hosted = None
        links = []
        job_args = (json.dumps(profile), self.policy, self.knobs, size)
        probe = _qs.Job(*job_args, 1, self.bandwidth, self.settings, self.architecture, compression=self.compression)
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
            job = _qs.Job(*job_args, size, self.bandwidth, self.settings, compression=self.compression)
            host = _my_address(_env["master_addr"]) if size > 1 else "127.0.0.1"
            hosted = _qs.Server(job, rank, host, secret)
            me = (host, hosted.port)
            endpoints = [me]
            if size > 1:
                endpoints = [None] * size
                dist.all_gather_object(endpoints, me)
        else:
            endpoints = _parse_servers(servers)
            job = _qs.Job(*job_args, len(endpoints), self.bandwidth, self.settings, compression=self.compression)
        self.session = _qs.Session(job, rank, endpoints, self.wire_tensors, hosted, links, "ring",
                                   secret if servers is None else b"")
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

    def _close_session(self, switching=False):
        """Ends the running session once every update of the steps taken is applied (and,
        delayed updates, those held back: applied now, before the next forward pass when
        `switching`); returns its report."""
        self.settle(always=True)
        for l in range(len(self.layers)):
            self._reported(l)
        report = self.session.finish()
        if self.delayed:  # the updates held back until the session's end
            for l in range(len(self.layers)):
                self._apply_due(l, _qs.AFTER_TRAINING, self.passes if switching else None)
        return report

    # ---- updates ----

    def _gradient_ready(self, t):
        session = self.session
        if session is not None:
            session.gradient_ready(t)

    def _reported(self, l, wait=True):
        """Whether the session was told of every gradient of layer l handed to staging
        (on CUDA it is told once the copy is done, from staging's thread); the calls that
        depend on its count of the layer's backward passes come after it."""
        return self.staging.reported(self.layer_tensors[l], wait)

    def _sums_in(self, l, divisor=1):
        """Layer l's sums, in its registered buffers, are wanted in its .grad buffers,
        divided by `divisor`: a staged tensor's are divided in float32 and copied there
        (the in-place ones are there already, divided in place)."""
        for t, g in zip(self.layer_tensors[l], self.layer_grads[l]):
            self.staging.from_wire(t, g, divisor)

    def _check_unchanged(self, n, why):
        """Raises if a gradient of pass n still owned by the transport (its layer's update
        not applied; delayed updates: any, their copies were taken) was written or
        replaced by the user's code since it was handed over."""
        if self.averaged == n:
            return
        for l, ps in enumerate(self.layer_params):
            if self.delayed or self.applied[l] < n:
                self._check_unchanged_layer(l, n, why)

    def _group_layers(self):
        """Each layer's parameters within each of the optimizer's groups (per-layer steps);
        again when a group was added (add_param_group)."""
        self.layer_groups = []
        for ps in self.layer_params:
            ids = {id(p) for p in ps}
            self.layer_groups.append([[p for p in g["params"] if id(p) in ids] for g in self.opt.param_groups])

    def _step_layer(self, l, divisor, hyper, skip=()):
        """The wrapped optimizer's step on layer l's parameters alone, with the
        hyperparameters `hyper` (one dict per param group), its gradients divided by
        `divisor` first; the parameters in `skip` have no gradient for it (None)."""
        grads = []
        for p, g in zip(self.layer_params[l], self.layer_grads[l]):
            current = p.grad
            if current is not None and current is not g:  # replaced after synchronize()
                g.copy_(current)
            if current is None or id(p) in skip:  # set to None after synchronize(); unused by all
                p.grad = None
            else:
                p.grad = g
                if divisor != 1:
                    g.div_(divisor)
            grads.append(g)
        groups = self.opt.param_groups
        if len(self.layer_groups[l]) != len(groups):
            self._group_layers()
        self.opt.param_groups = [dict(h, params=ps) for h, ps in zip(hyper, self.layer_groups[l]) if ps]
        try:
            self.raw_step(self.opt)
        finally:
            self.opt.param_groups = groups
            for p, g in zip(self.layer_params[l], grads):
                p.grad = g

    def _apply(self, l):
        """Layer l's update of its next pass (its sums are in, its fate is known)."""
        n = self.applied[l] + 1
        fate = self.fate[n]
        if fate is not _SKIPPED:
            self._check_unchanged_layer(l, n)
            if self.averaged != n:
                self._sums_in(l, _env["size"] if self.average else 1)
            unused = self._globally_unused(n) if self.find_unused else set()
            skip = {id(p) for p in self.layer_params[l] if id(p) in unused and id(p) in self.none_at.get(n, ())}
            self._step_layer(l, 1, fate, skip)
            for p in self.layer_params[l]:
                if id(p) not in skip:
                    self.had_grad[id(p)] = n
            if self.auto_options is not None:  # in the delayed updates' terms: iteration n - 1 alone
                self.update_log.append((n, l, n - 1, n - 1))
        for g in self.layer_grads[l]:
            g.zero_()
        self.applied[l] = n
        self._forget()

    def _check_unchanged_layer(self, l, n, why="after step()"):
        if self.averaged == n:
            return
        for p, buf in zip(self.layer_params[l], self.layer_grads[l]):
            if (p.grad is not buf or buf._version != self.versions.get(id(p), buf._version)) and self.delayed:
                raise self._broken(RuntimeError(
                    "quicksilver.torch: the gradient of '{}' was changed {}, after Quicksilver took it: policy '{}' "
                    "delays updates and sums each pass's gradients with later ones, so gradients cannot be changed "
                    "between backward() and step() (clip_grad_norm_, GradScaler): use a synchronous policy for "
                    "that".format(self.names[id(p)], why, self.policy)))
            if p.grad is not buf or buf._version != self.versions.get(id(p), buf._version):
                raise self._broken(RuntimeError(
                    "quicksilver.torch: the gradient of '{}' was changed {} while Quicksilver was still summing it "
                    "over the workers (clip_grad_norm_, GradScaler.unscale_, or any other write of .grad). Call "
                    "optimizer.synchronize() first: it waits for the sums and leaves the averaged gradients in "
                    ".grad for you to change; then call step() inside `with optimizer.skip_synchronize():`"
                    .format(self.names[id(p)], why)))

    def _forget(self):
        """Drops the fates and masks of passes every layer has applied."""
        done = min(self.applied) if not self.delayed else min(self.covered)
        for n in [n for n in self.fate if n <= done]:
            del self.fate[n]
        for n in [n for n in self.unused_masks if n <= done]:
            del self.unused_masks[n]
            self.none_at.pop(n, None)

    # Rank 0 measures the gradient's noise on every 4th pass that can (a copy of each
    # layer's gradient): the Preserver judges means over many iterations.
    MEASURE_EVERY = 4

    def _apply_due(self, l, before, logged_before=None):
        """Delayed updates: layer l's updates due before this forward pass (after `before`
        backward passes), each one step on its sums over workers x iterations, with the
        hyperparameters of the step() that followed the last iteration it merges; then
        the gradient buffers are cleared for the next backward (the last one's gradients
        were copied when it ended)."""
        # The session counts its own passes (policy="auto" opens one at a switch): `before`
        # and the updates' iterations are the session's, made the job's here.
        base = self.pass_base
        updates = self.session.take_updates(l, before)
        if before != _qs.AFTER_TRAINING:
            before += base
        # Measured once per training pass (an evaluation pass after it sees zeroed buffers).
        measuring = self.tapping and before != _qs.AFTER_TRAINING and before != self.measured_before
        if measuring:
            self._measure_local(l, before)
        # Within an accumulation cycle (a later micro-batch's forward) the buffers hold the
        # cycle's gradients so far: kept.
        kept = [g.clone() for g in self.layer_grads[l]] if self.micro and updates else None
        for session_first, session_last in updates:
            first, last = session_first + base, session_last + base
            local = None
            if measuring and first == last == before - 1 and (before % self.MEASURE_EVERY == 1
                                                             or self.noise is None):
                local = [g.clone() for g in self.layer_grads[l]]
            # The staged buffers' last copies back (the update before this one) must have
            # read them before this update's sums land there.
            self.staging.host_free(self.layer_tensors[l])
            self.session.load_update(l, session_first, session_last)
            divisor = (_env["size"] if self.average else 1) * (last - first + 1)
            self._sums_in(l, divisor)
            if measuring:  # the average over workers and iterations, whatever the op
                self._measure(l, before, _env["size"] * (last - first + 1) / divisor, local)
            hyper = self.fate.get(last + 1)
            if hyper is None or hyper is _SKIPPED:
                hyper = _hyperparameters(self.opt.param_groups)  # its step() never came (after training)
            self._step_layer(l, 1, hyper)
            self.update_log.append((before if logged_before is None else logged_before, l, first, last))
            self.covered[l] = max(self.covered[l], last + 1)
        if kept is not None:
            for g, k in zip(self.layer_grads[l], kept):
                g.copy_(k)
        elif not self.micro:
            for g in self.layer_grads[l]:
                g.zero_()
        for p in self.layer_params[l]:
            self.versions[id(p)] = p.grad._version if p.grad is not None else 0
        self._forget()

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
        self._reported(0)
        self.session.feedback(self.session.backwards(0) - 1, self.loss, self.measured[0], self.measured[1], lr,
                              float(self.rec.batch_size * _env["size"]))

    # ---- what runs on the control plane (torch.distributed) ----

    def _sync_buffers(self):
        """broadcast_buffers: rank 0's buffers (BatchNorm's running statistics) to every
        worker before a forward pass that follows one run with gradients enabled (and
        before the first), as DistributedDataParallel does; one broadcast per dtype."""
        buffers = [b for b in self.model.buffers() if b.numel() > 0]
        by_dtype = {}
        for b in buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        for group in by_dtype.values():
            flat = torch.cat([b.detach().reshape(-1) for b in group])
            _broadcast(flat, 0)
            at = 0
            with torch.no_grad():
                for b in group:
                    b.copy_(flat[at:at + b.numel()].view_as(b))
                    at += b.numel()

    def _check_consistency(self):
        """check_consistency, at the end of a forward pass (every layer's update of the
        steps taken is in): every worker's digest (CRC32C) of each parameter, gathered
        without waiting (a worker that stopped early must not hold the others in the
        guard: the session names that failure); the digests are compared once they are
        in (_compare_digests, from step() and the next check), and a difference raises
        naming the first parameter that differs from rank 0's."""
        self._compare_digests(wait=True)
        digests = torch.tensor([_digest(p) for p in self.all_params], dtype=torch.int64)
        if _env["size"] == 1:
            return
        gathered = [torch.empty_like(digests) for _ in range(_env["size"])]
        _hold(digests, *gathered)
        self.pending_check = (self.stepped, gathered, dist.all_gather(gathered, digests, async_op=True))

    def _compare_digests(self, wait):
        if self.pending_check is None:
            return
        step, gathered, work = self.pending_check
        if not work.is_completed():
            if not wait:
                return
            work.wait()
        self.pending_check = None
        for k, p in enumerate(self.all_params):
            differ = [r for r in range(1, len(gathered)) if gathered[r][k] != gathered[0][k]]
            if differ:
                raise self._broken(RuntimeError(
                    "quicksilver.torch: check_consistency: after step {} parameter '{}' differs between rank 0 and "
                    "rank(s) {}: the workers no longer train the same model".format(
                        step, self.names[id(p)], ", ".join(str(r) for r in differ))))

    # ---- the optimizer's methods ----

    def step(self, closure=None):
        for hook in self._step_hooks("pre"):
            hook(self.opt, (), {})
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.state == "recorded":
            self._start()
        elif self.state != "running":
            if self.state == "closed":
                raise RuntimeError("quicksilver.torch: step() after shutdown()")
            if self.state == "failed":
                raise RuntimeError("quicksilver.torch: step() after an earlier error stopped this optimizer (the "
                                   "first error says why)")
            raise RuntimeError("quicksilver.torch: step() before any forward pass of the model")
        if self.micro != 0:
            raise self._broken(RuntimeError(
                "quicksilver.torch: step() after {} of backward_passes_per_step={} backward passes".format(
                    self.micro, self.k)))
        if self.skipping and self.averaged != self.passes and self.stepped < self.passes:
            raise self._broken(RuntimeError(
                "quicksilver.torch: step() inside skip_synchronize() without optimizer.synchronize() after the "
                "backward pass: the gradients are not summed yet"))
        if self.stepped == self.passes:
            raise self._broken(RuntimeError("quicksilver.torch: step() without a backward pass since the last step()"))
        self._compare_digests(wait=False)
        self.staging.check()
        n = self.passes
        self._check_unchanged(n, "between backward() and step()")
        self.fate[n] = _hyperparameters(self.opt.param_groups)
        self.stepped = n
        post = self._step_hooks("post")
        if self.delayed:
            if self.tapping:
                self._feedback()
        elif self.averaged == n or post:
            self.settle()  # the sums are in (synchronize()), or a post hook reads the parameters
        else:
            for l in range(len(self.layers)):
                if self.applied[l] < n and self._reported(l, wait=False) and self.session.sum_ready(l, False):
                    self._apply(l)
        if self.auto_options is not None:
            self._plan(n)
        for hook in post:
            hook(self.opt, (), {})
        return loss

    # ---- policy="auto" (quicksilver/auto.py) ----

    def _plan(self, n):
        """Every rank at the same step()s: rank 0 begins a decision at n >= next_decision
        on its thread; then, each step, it says whether the decision is ready (a one-int
        broadcast, waited for one step later, so that nobody waits for it); at the step
        after it said so, it broadcasts the decision and every rank applies it (a switch,
        when it asks for one). With replan_every=1, all at once at n."""
        rank, size, every = _env["rank"], _env["size"], self.auto_options["replan_every"]
        if not self.deciding and n >= self.next_decision:
            if rank == 0:
                self.auto.start(n, self.profile, self.policy, self.knobs)
            self.deciding, self.next_decision = True, n + every
            if every > 1:
                self._poll_decision()
                return
        if not self.deciding:
            return
        if every > 1:
            flag, work = self.decision_flag
            if work is not None:
                work.wait()
            if not flag.item():
                self._poll_decision()
                return
        self.deciding, self.decision_flag = False, None
        d = None
        if rank == 0:
            d, waited = self.auto.result()
            d["applied"], d["waited_ms"] = n, waited
        if size > 1:
            box = [d]
            dist.broadcast_object_list(box, src=0)
            d = box[0]
        d = dict(d)
        if "next_in" in d:  # a trial: the next decision sooner
            self.next_decision = n + d["next_in"]
        if d["switch"]:
            start = time.perf_counter()
            d["closed"] = self._switch(d["policy"], d["knobs"])
            d["switch_ms"] = (time.perf_counter() - start) * 1e3
            if rank == 0:
                self.auto.switched(n, d["switch_ms"])
        if rank == 0:
            self.auto.decided(d)
        if rank == 0:
            print("quicksilver auto: pass {}: {}{}".format(
                d["pass"], d["reason"], "; switched to {} at pass {} in {:.0f} ms".format(
                    _auto.describe(d), n, d["switch_ms"]) if d["switch"] else ""), file=sys.stderr, flush=True)
        self.decisions.append(d)

    def _poll_decision(self):
        """Rank 0's "is the decision ready" to every rank, not waited for now."""
        flag = torch.tensor([1 if _env["rank"] == 0 and self.auto.ready() else 0], dtype=torch.int32)
        _hold(flag)
        work = dist.broadcast(flag, 0, async_op=True) if _env["size"] > 1 else None
        self.decision_flag = (flag, work)

    def _switch(self, policy, knobs):
        """Closes the running session with every update of the steps taken applied, and
        opens one of `policy` on the same buffers; the session's passes count from here.
        Returns the closed session's policy and median iteration (ms)."""
        report = self._close_session(switching=True)
        self.session = None
        self.store = None
        if self.tapping:
            _loss_tap.release()
            self.tapping = False
        L = len(self.layers)
        self.applied = [self.passes] * L
        self.covered = [self.passes] * L
        self.settled = self.stepped
        self._forget()
        self.pass_base = self.passes
        self.policy = policy
        self.knobs = {k: _knob_text(v) for k, v in knobs.items()}
        self._open_session()
        return {"policy": report["policy"], "median_iteration_ms": report["median_iteration_ms"]}

    def _step_hooks(self, kind):
        """torch >= 2.0: the step hooks ("pre" or "post") of torch.optim, global and the
        optimizer's own, in the order torch runs them (run once per step() here)."""
        own = getattr(self.opt, "_optimizer_step_{}_hooks".format(kind), None)
        if own is None:
            return []
        glob = list(getattr(_torch_optimizer, "_global_optimizer_{}_hooks".format(kind), {}).values())
        return glob + list(own.values()) if kind == "pre" else list(own.values()) + glob

    def zero_grad(self, set_to_none=None):
        """Running, every gradient buffer is zeroed right after its layer's update (the sums
        land in it: clearing it earlier would lose them), so this clears nothing itself:
        it discards a pass whose step() never came (GradScaler skipped it), or the
        micro-batches of an accumulation cycle so far. Before, the optimizer's own."""
        if set_to_none if set_to_none is not None else self.zero_grad_to_none:
            self.last_clear = self.stepped
        if self.session is None or self.state == "closed":
            if set_to_none is None:
                self.base.zero_grad(self.opt)
            else:
                self.base.zero_grad(self.opt, set_to_none=set_to_none)
            return
        if self.micro:
            for g in self.grads:
                g.zero_()
            self.micro = 0
            self.cycle_used = set()
        if self.stepped < self.passes:
            if self.delayed:
                raise self._broken(RuntimeError(
                    "quicksilver.torch: zero_grad() drops a pass without step(), which policy '{}' cannot do "
                    "(delayed updates merge every pass's gradients)".format(self.policy)))
            self.settle()
            n = self.passes
            self.fate[n] = _SKIPPED
            self.stepped = n
            for l in range(len(self.layers)):
                if self.applied[l] < n:
                    self._reported(l)
                    self.session.sum_ready(l, True)
                    self._apply(l)

    def synchronize(self):
        """Horovod's meaning: waits for the sums of the last backward pass and leaves their
        average in every .grad (for a clip, GradScaler.unscale_, a look), without updating;
        then `with optimizer.skip_synchronize(): optimizer.step()` updates with them. After
        step() (no backward since), it applies the updates of the steps taken, waiting
        for their sums (what a read of the parameters needs; reads settle by themselves)."""
        if self.state == "recorded":
            self._start()
        if self.state != "running":
            return
        if self.delayed:
            if self.stepped < self.passes:
                raise self._broken(RuntimeError(
                    "quicksilver.torch: synchronize() between backward() and step() does not apply to policy '{}': "
                    "its delayed updates sum a pass's gradients with later ones, so there is no averaged gradient "
                    "of this step to clip or unscale (use a synchronous policy for that)".format(self.policy)))
            return
        self.settle()
        n = self.passes
        if self.stepped == n or self.averaged == n:
            return
        self._check_unchanged(n, "before synchronize()")
        for l in range(len(self.layers)):
            if self.applied[l] < n:
                self._reported(l)
                self.session.sum_ready(l, True)
        unused = self._globally_unused(n) if self.find_unused else set()
        for l, ps in enumerate(self.layer_params):
            if self.applied[l] >= n:
                continue
            self._sums_in(l, _env["size"] if self.average else 1)
            for p, g in zip(ps, self.layer_grads[l]):
                if id(p) in unused and id(p) in self.none_at.get(n, ()):
                    p.grad = None
        self.averaged = n

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`with optimizer.skip_synchronize(): optimizer.step()`: the step after
        synchronize() (Horovod's spelling); a step in it without synchronize() raises."""
        self.skipping = True
        try:
            yield
        finally:
            self.skipping = False

    def shutdown(self):
        if self.state == "closed":
            return self.report
        try:
            if self.state == "running":
                self.report = self._close_session()
                if self.auto_options is not None:
                    self.report["auto"] = list(self.decisions)
                # Every worker ended at the same iteration, so each took part in every
                # consistency gather: the last one is compared too.
                self._compare_digests(wait=True)
        except Exception:
            if self.session is not None:
                self.session.abort("shutdown after a failure")
            raise
        finally:
            self.state = "closed"
            # The session's buffers (this process's server shares, DeFT's merged sums) go
            # now, not when the garbage collector breaks the optimizer's cycle with us.
            self.session = None
            if self.staging is not None:
                self.staging.close()
            self.store = None  # rank 0's rendezvous store stops listening now
            # find_unused_parameters' all-reduces still in flight (a pass whose update never
            # needed its mask): waited for, not dropped, so that no collective of the
            # process group is pending when the process exits.
            for _, work in self.unused_masks.values():
                if work is not None:
                    try:
                        work.wait()
                    except Exception:  # the job failed already; that error is the one raised
                        pass
            self.unused_masks = {}
            self.pending_check = None
            if self.tapping:
                _loss_tap.release()
                self.tapping = False
            if self.auto is not None and self.auto.thread is not None:
                self.auto.thread.join()  # a decision begun at the last steps: never applied
                self.auto.thread = None
            if self.decision_flag is not None and self.decision_flag[1] is not None:
                try:  # no collective of the process group is left pending at exit
                    self.decision_flag[1].wait()
                except Exception:  # the job failed already; that error is the one raised
                    pass
            self.decision_flag = None
            for h in self.handles:
                h.remove()
            self.nodes = []
            self._remove_model_overrides()
            _live.discard(self)
        return self.report


_MISSING = object()


def _digest(p):
    """CRC32C of a parameter's bytes (a copy on the host first when it is on a device)."""
    t = p.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous()
    return _qs.digest(t.data_ptr(), t.numel() * t.element_size())


def _zero_grad_default(cls):
    """What the optimizer's zero_grad() does without an argument: set the gradients to
    None (torch >= 2.0) or zero them (1.13)."""
    try:
        return bool(inspect.signature(cls.zero_grad).parameters["set_to_none"].default)
    except (KeyError, TypeError, ValueError):
        return False


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


# Horovod's reduction ops and compression, by the names Horovod's users know.
Average = "average"
Sum = "sum"


class Compression:
    """What a gradient element is on the wire: `Compression.none` (float32), `Compression.bf16`
    or `Compression.fp16` (half the bytes; each worker's gradient rounded to nearest even,
    summed in float32 by the parameter servers, the sum rounded once on its way back).
    Horovod's `Compression.fp16` means the same. On the all-reduce policies each partial sum
    is added in float32 and rounded as it is passed on."""
    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"


_HOROVOD_ONLY = ("gradient_predivide_factor", "sparse_as_dense", "num_groups", "groups", "process_set")


def _rewrap_scheduler_step(optimizer):
    """An LR scheduler created before DistributedOptimizer stored a wrapper of the original
    class's step on the optimizer instance (torch 1.13: `_with_counter`; 2.x:
    `_wrapped_by_lr_sched`), which would shadow the wrapper's step and train every worker
    alone. Replaced by the same bookkeeping around the wrapper's step."""
    patched = optimizer.__dict__.get("step")
    if patched is None:
        return
    ref = weakref.ref(optimizer)
    if getattr(patched, "_with_counter", False):
        def step(*args, **kwargs):
            opt = ref()
            opt._step_count = getattr(opt, "_step_count", 0) + 1
            return type(opt).step(opt, *args, **kwargs)
        step._with_counter = True
    elif getattr(patched, "_wrapped_by_lr_sched", False):
        def step(*args, **kwargs):
            opt = ref()
            opt._opt_called = True
            return type(opt).step(opt, *args, **kwargs)
        step._wrapped_by_lr_sched = True
    else:
        raise ValueError("quicksilver.torch.DistributedOptimizer: optimizer.step was replaced on the optimizer "
                         "object by {!r}, which Quicksilver does not know; create DistributedOptimizer before "
                         "whatever replaced it".format(patched))
    optimizer.step = step


# compression= names, with the spellings the command line takes too.
_WIRE_NAMES = {"none": "none", "float32": "none", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
               "float16": "fp16"}


def _launcher_setting(what, script, variable):
    """A setting `quicksilver run --script` handed over in `variable`: it, where the script
    leaves `what` to its default; refused naming both where the script names another."""
    launcher = os.environ.get(variable)
    if launcher is None:
        return script
    if script is not None and str(script) != launcher:
        raise ValueError("quicksilver.torch.DistributedOptimizer: quicksilver run was given --{} {}, but the script "
                         "asks for {}={!r}: drop one of the two".format(what, launcher, what, script))
    return launcher


def _launcher_choice(policy, architecture, compression, knobs):
    """`quicksilver run --script --policy P [--architecture A] [--compression C] [knobs]`
    hands its choice to every process (QS_POLICY, QS_ARCHITECTURE, QS_COMPRESSION, QS_KNOBS
    as name=value;...). It is honoured where the script leaves the setting to its default,
    agreed with where the script names the same, and refused where it names another (the
    user meant one of them, and training with the other would be silently different).
    Returns (policy, architecture, compression, knobs)."""
    policy = _launcher_setting("policy", policy, "QS_POLICY") or "mercury"
    architecture = _launcher_setting("architecture", architecture, "QS_ARCHITECTURE")
    compression = _launcher_setting("compression", _WIRE_NAMES.get(compression, compression), "QS_COMPRESSION")
    merged = dict(knobs)
    for item in filter(None, os.environ.get("QS_KNOBS", "").split(";")):
        name, _, text = item.partition("=")
        if name in merged and _knob_text(merged[name]) != text:
            raise ValueError("quicksilver.torch.DistributedOptimizer: quicksilver run was given --{} {}, but the "
                             "script asks for {}={!r}: drop one of the two".format(
                                 name.replace("_", "-"), text, name, merged[name]))
        merged[name] = text
    return policy, architecture, compression, merged


def _auto_options(policy, architecture, knobs, servers, replan_every, allow_stale, find_unused):
    """policy="auto"'s keywords, checked: {"replan_every", "allow_stale"}, or None for a
    fixed policy (which refuses them: they would be ignored)."""
    what = "quicksilver.torch.DistributedOptimizer"
    if policy != "auto":
        for name, value in (("replan_every", replan_every), ("allow_stale", allow_stale)):
            if value is not None:
                raise ValueError("{}: {}= applies to policy='auto' only (this job runs policy '{}')".format(
                    what, name, policy))
        return None
    if knobs:
        raise ValueError("{}: policy='auto' tunes the knobs itself: drop {} (or give a fixed policy)".format(
            what, ", ".join(sorted(knobs))))
    if servers is not None:
        raise ValueError("{}: policy='auto' restarts the servers at a switch, so it cannot use separately started "
                         "ones: drop servers= (each process hosts one)".format(what))
    if architecture not in (None, "ps", "allreduce"):
        raise ValueError("{}: architecture={!r}: give 'ps' or 'allreduce'".format(what, architecture))
    replan_every = _auto.DEFAULT_REPLAN_EVERY if replan_every is None else replan_every
    if not isinstance(replan_every, int) or isinstance(replan_every, bool) or replan_every < 1:
        raise ValueError("{}: replan_every={!r} must be an integer >= 1 (steps between decisions)".format(
            what, replan_every))
    allow_stale = bool(allow_stale)
    if allow_stale and architecture != "allreduce":
        raise ValueError("{}: allow_stale=True admits the policies that delay updates, which are all-reduce "
                         "policies (DeFT): give architecture='allreduce' too".format(what))
    if allow_stale and find_unused:
        raise ValueError("{}: allow_stale=True with find_unused_parameters=True: DeFT's delayed updates sum each "
                         "pass's gradients with later ones; drop one".format(what))
    return {"replan_every": replan_every, "allow_stale": allow_stale}


def DistributedOptimizer(optimizer, model=None, policy=None, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, find_unused_parameters=False,
                         broadcast_buffers=True, check_consistency=0, servers=None, bandwidth=None,
                         congestion=None, connect_timeout=120.0, peer_timeout=600.0, architecture=None,
                         replan_every=None, allow_stale=None, **knobs):
    """Makes `optimizer` (any torch.optim optimizer of `model`'s parameters) train through
    Quicksilver with `policy` (one of policies(); default mercury, or what `quicksilver run
    --script --policy P` chose) and its knobs as keywords (e.g.
    packet_size="32KiB", partition_size=4000000, credit_size="20MB"; docs/pytorch.md).
    Returns the same object, of a subclass of its class: isinstance checks and LR
    schedulers (created before or after) keep working.

    As Horovod's: `named_parameters` (names for the messages; must be the model's
    trainable parameters), `compression` (None, Compression.bf16 or .fp16: gradients on the
    wire), `backward_passes_per_step`
    (K backward passes accumulate locally, then one communication and one step()), `op`
    (Average, or Sum: the sums undivided). As DistributedDataParallel's:
    `find_unused_parameters` (a parameter without a gradient in a pass counts as zero;
    one no worker used keeps .grad as zero_grad() left it), `broadcast_buffers` (rank 0's
    buffers before each training forward pass). `check_consistency=N`: every N steps the
    workers compare a digest of every parameter and raise naming the first that differs.
    `servers`: "host:port,..." of separately started `quicksilver server` processes
    (default: each process hosts one server, N = M). `architecture`: "ps" or "allreduce"
    (gloo); by default the policy's own, and "ps" for the names both have (wfbp,
    bytescheduler). `bandwidth`: the nominal NIC rate for the policies that plan with one.

    policy="auto": the job measures itself and switches every rank to the policy (and
    knobs) the simulator predicts fastest on the measured network, at the same step()
    (quicksilver/auto.py, docs/pytorch.md "policy=auto"); it decides again every
    `replan_every` steps (default 200). Within `architecture` (default "ps"); policies
    that delay updates (DeFT) are candidates only with allow_stale=True (they change the
    optimisation). It takes no knobs (it tunes them) and no `servers` (it restarts them).

    Added methods: synchronize() (wait for the sums and leave the averages in .grad; after
    step(), apply the updates of the steps taken), skip_synchronize() (a context: the step
    after synchronize()), shutdown() (end; returns this worker's measurements),
    quicksilver_profile() (the measured profile, DESIGN.md's format),
    quicksilver_updates() (DeFT, and every update under policy="auto", a synchronous
    one of pass n as (n, layer, n - 1, n - 1): the delayed updates applied, as (before, layer, first,
    last): layer's step on the sums of iterations first..last, before the forward pass
    after `before` backward passes; quicksilver.torch.AFTER_TRAINING: at shutdown)."""
    _require_init("DistributedOptimizer")
    policy, architecture, compression, knobs = _launcher_choice(policy, architecture, compression, knobs)
    # --netns --bandwidth and --congestion of `quicksilver run --script`: the links' rate and
    # the congestion control the namespaces allow (defaults 10Gbps and cubic).
    bandwidth = _launcher_setting("bandwidth", bandwidth, "QS_BANDWIDTH") or "10Gbps"
    congestion = _launcher_setting("congestion", congestion, "QS_CONGESTION") or "cubic"
    if model is not None and not isinstance(model, torch.nn.Module):
        if named_parameters is None:  # Horovod's positional named_parameters
            named_parameters, model = model, None
        else:
            raise TypeError("quicksilver.torch.DistributedOptimizer: model must be a torch.nn.Module, not {}"
                            .format(type(model).__name__))
    if model is None:
        raise TypeError("quicksilver.torch.DistributedOptimizer needs the model: DistributedOptimizer(optimizer, "
                        "model, ...) (named_parameters= may come beside it). Its forward hooks let each layer start "
                        "as soon as its own update is in")
    horovod = [k for k in knobs if k in _HOROVOD_ONLY]
    if horovod:
        raise ValueError("quicksilver.torch.DistributedOptimizer: Horovod's {} is not supported".format(
            ", ".join(horovod)))
    if isinstance(optimizer.__class__.__dict__.get("_quicksilver"), bool):
        raise ValueError("quicksilver.torch.DistributedOptimizer: this optimizer is wrapped already")
    wire = "none" if compression is None else _WIRE_NAMES.get(compression) if isinstance(compression, str) else None
    if wire is None:
        raise ValueError("quicksilver.torch.DistributedOptimizer: compression={!r}: give None (float32), "
                         "Compression.bf16 or Compression.fp16".format(compression))
    if op not in (Average, Sum):
        raise ValueError("quicksilver.torch.DistributedOptimizer: op={!r}: give quicksilver.torch.Average or Sum"
                         .format(op))
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("quicksilver.torch.DistributedOptimizer: backward_passes_per_step={!r} must be an integer "
                         ">= 1".format(backward_passes_per_step))
    if not isinstance(check_consistency, int) or check_consistency < 0:
        raise ValueError("quicksilver.torch.DistributedOptimizer: check_consistency={!r} must be an integer >= 0 "
                         "(0: off; N: every N steps)".format(check_consistency))
    auto = _auto_options(policy, architecture, knobs, servers, replan_every, allow_stale, find_unused_parameters)
    settings = {"congestion": congestion, "connect_timeout": connect_timeout, "peer_timeout": peer_timeout}
    integration = _Integration(optimizer, model, policy, knobs, servers, bandwidth, settings, architecture,
                               {"backward_passes_per_step": backward_passes_per_step, "op": op,
                                "find_unused_parameters": bool(find_unused_parameters),
                                "broadcast_buffers": bool(broadcast_buffers),
                                "check_consistency": check_consistency, "compression": wire, "auto": auto})
    if named_parameters is not None:
        try:
            integration.use_names(named_parameters)
        except Exception:
            integration.shutdown()  # its hooks and the model's overrides go
            raise
    base = type(optimizer)

    def step(self, closure=None):
        return self._qs.step(closure)
    # torch 2.x wraps a class's step in its hook runner unless it is marked (load_state_dict
    # does it again): ours runs the optimizer's step hooks itself, once per step().
    step.hooked = True
    cls = type("Distributed" + base.__name__, (base,), {
        "_quicksilver": True,
        "step": step,
        "zero_grad": lambda self, set_to_none=None: self._qs.zero_grad(set_to_none),
        "synchronize": lambda self: self._qs.synchronize(),
        "skip_synchronize": lambda self: self._qs.skip_synchronize(),
        "state_dict": lambda self, *a, **k: (self._qs.settle(), base.state_dict(self, *a, **k))[1],
        "load_state_dict": lambda self, *a, **k: (self._qs.settle(), base.load_state_dict(self, *a, **k))[1],
        "shutdown": lambda self: self._qs.shutdown(),
        "quicksilver_profile": lambda self: getattr(self._qs, "profile", None),
        "quicksilver_updates": lambda self: list(self._qs.update_log),
        "quicksilver_decisions": lambda self: list(self._qs.decisions),
    })
    optimizer._qs = integration
    optimizer.__class__ = cls
    _rewrap_scheduler_step(optimizer)
    return optimizer


def _control_plane(what):
    _require_init(what)
    return _env["size"] > 1


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's `obj` (anything picklable) on every worker (Horovod's broadcast_object)."""
    if not _control_plane("broadcast_object"):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every worker's optimizer takes root_rank's state (its state_dict: per-parameter
    state such as momentum buffers, and the param groups' hyperparameters), e.g. after
    rank 0 alone resumed from a checkpoint."""
    if not _control_plane("broadcast_optimizer_state"):
        return
    state = broadcast_object(optimizer.state_dict() if _env["rank"] == root_rank else None, root_rank)
    if _env["rank"] != root_rank:
        optimizer.load_state_dict(state)


def allreduce_(tensor, average=None, name=None, op=None):
    """In place: the sum (op=Sum) or average (op=Average, the default; or average=True)
    of `tensor` over every worker, on the control plane (Horovod's allreduce_)."""
    if average is not None and op is not None:
        raise ValueError("quicksilver.torch.allreduce: give average= or op=, not both")
    op = op or (Sum if average is False else Average)
    if op not in (Average, Sum):
        raise ValueError("quicksilver.torch.allreduce: op={!r}: give quicksilver.torch.Average or Sum".format(op))
    if _control_plane("allreduce"):
        tmp = tensor.detach().clone(memory_format=torch.contiguous_format)  # our own (see _held)
        _hold(tmp)
        dist.all_reduce(tmp)
        with torch.no_grad():
            tensor.copy_(tmp)
        if op == Average:
            if tensor.is_floating_point():
                tensor.div_(_env["size"])
            else:
                tensor.floor_divide_(_env["size"])
    return tensor


def allreduce(tensor, average=None, name=None, op=None):
    """A new tensor: the average (default) or sum of `tensor` over every worker."""
    return allreduce_(tensor.detach().clone(), average=average, name=name, op=op)


@atexit.register
def _at_exit():
    for integration in list(_live):
        try:
            integration.shutdown()
        except Exception as e:  # the process is ending: say why, do not hang
            print("quicksilver.torch: at exit: {}".format(e), file=sys.stderr)
    _settle()  # see _held
    # The script's own collectives (an all_gather of its accuracy at the end) are not in
    # _held: gloo's thread lets go of a finished one just after the script's wait returned,
    # and a script that ends right then reached the teardown inside that window (torch 2.15,
    # 2 ranks, an all_gather as the script's last call: 3 runs in 52 aborted; with this wait
    # none in 100). A moment with the GIL released lets the thread free them while the
    # interpreter is whole.
    if _USE_COUNT and dist.is_initialized() and "gloo" in str(dist.get_backend()):
        time.sleep(_GLOO_LET_GO_S)
    # The process group init() started goes while the interpreter is whole: left to the
    # interpreter's teardown, gloo's threads can abort the process after training ended
    # (pytorch/pytorch PR 179291). With torch._dynamo imported the group outlives this call
    # (see _held), which is why _settle comes first.
    if _env.get("owns_group") and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:
            print("quicksilver.torch: at exit: {}".format(e), file=sys.stderr)
        _env["owns_group"] = False
