"""quicksilver.torch against one process training on the concatenated batches.

Each job runs as real processes (torchrun, or `quicksilver run --script`) on loopback; each
worker trains a fresh model per policy in turn (tests/python/train_worker.py). Every worker's
parameters must equal, within 1e-5, those of one process that trains the same model with
the same optimizer on the concatenation of the workers' batches (the workers average their
gradients, as DistributedDataParallel does)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import harness
import models
from harness import env

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "train_worker.py")
TOLERANCE = 1e-5


def ps_policies():
    import quicksilver._quicksilver as qsm
    return [p for p in qsm.ps_policies() if p != "oracle"]


def reference(model_name, opt_name, workers, per_worker, iterations):
    torch.manual_seed(0)
    model = models.make(model_name)
    opt = models.optimizer(opt_name, model.parameters())
    x, y = models.data(model_name)
    loss_fn = torch.nn.CrossEntropyLoss()
    for it in range(iterations):
        parts = [models.batch(x, y, it, r, workers, per_worker) for r in range(workers)]
        xb = torch.cat([p[0] for p in parts])
        yb = torch.cat([p[1] for p in parts])
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return model.state_dict()


def reference_delayed(model_name, opt_name, workers, per_worker, iterations, profile, updates):
    """One process applying a delayed-update schedule (DeFT's, as a worker logged it) to
    the concatenated batches: before forward pass `before` (after `before` backward passes),
    each listed layer takes one step of its optimizer on the mean of the full-batch
    gradients of iterations first..last; what is due after the last pass, at the end."""
    torch.manual_seed(0)
    model = models.make(model_name)
    opt = models.optimizer(opt_name, model.parameters())
    params = dict(model.named_parameters())
    layer_params = [[params[t["name"]] for t in l["tensors"]] for l in profile["layers"]]
    x, y = models.data(model_name)
    loss_fn = torch.nn.CrossEntropyLoss()
    grads = {}  # iteration -> {parameter name: full-batch gradient}

    def apply(layer, first, last):
        mine = {id(p) for p in layer_params[layer]}
        for p in layer_params[layer]:
            name = next(n for n, q in params.items() if q is p)
            p.grad = sum(grads[i][name] for i in range(first, last + 1)) / (last - first + 1)
        groups = opt.param_groups
        opt.param_groups = [dict(g, params=[p for p in g["params"] if id(p) in mine]) for g in groups]
        opt.param_groups = [g for g in opt.param_groups if g["params"]]
        try:
            opt.step()
        finally:
            opt.param_groups = groups

    for it in range(iterations):
        for before, layer, first, last in updates:
            if before == it:
                apply(layer, first, last)
        parts = [models.batch(x, y, it, r, workers, per_worker) for r in range(workers)]
        xb = torch.cat([p[0] for p in parts])
        yb = torch.cat([p[1] for p in parts])
        for p in model.parameters():
            p.grad = None
        loss_fn(model(xb), yb).backward()
        grads[it] = {n: p.grad.detach().clone() for n, p in params.items()}
    for before, layer, first, last in updates:
        if before >= iterations:
            apply(layer, first, last)
    return model.state_dict()


def launch(build_dir, launcher, workers, args, timeout):
    return harness.launch(build_dir, launcher, workers, WORKER, args, timeout)


def check_equal(out, policies, opt_name, model_name, workers, per_worker, iterations):
    ref = reference(model_name, opt_name, workers, per_worker, iterations)
    worst = {}
    for policy in policies:
        for r in range(workers):
            got = torch.load(os.path.join(out, "{}-{}-{}.pt".format(policy, opt_name, r)))
            diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
            worst[(policy, r)] = diff
    bad = {k: v for k, v in worst.items() if not v <= TOLERANCE}
    assert not bad, "parameters differ from the single-process reference: {}".format(bad)
    # Training moved the parameters (the comparison is not vacuous).
    torch.manual_seed(0)
    init = models.make(model_name).state_dict()
    assert max((ref[k] - init[k]).abs().max().item() for k in ref) > 1e-3
    return max(worst.values())


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("workers,launcher", [(2, "torchrun"), (4, "quicksilver")])
def test_digits_every_ps_policy(build_dir, tmp_path, workers, launcher):
    policies = ps_policies()
    iterations, per_worker = 4, 8
    # Small packets and partitions, so that every policy cuts tensors into several units.
    knobs = {"packet_size": "4KiB", "partition_size": "8KiB", "credit_size": "16KiB", "slice_size": "8KiB",
             "prophet_partition_size": "8KiB"}
    p, took = launch(build_dir, launcher, workers,
                     ["--model", "digits", "--policies", ",".join(policies), "--iterations", str(iterations),
                      "--batch", str(per_worker), "--out", str(tmp_path), "--knobs", json.dumps(knobs)], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    worst = check_equal(str(tmp_path), policies, "sgd", "digits", workers, per_worker, iterations)
    print("{} workers ({}), {} policies: worst difference {:.2e}, {:.1f} s".format(
        workers, launcher, len(policies), worst, took))


def allreduce_policies():
    """Those that update after every iteration (DeFT delays: test_deft_* below)."""
    import quicksilver._quicksilver as qsm
    return [p for p in qsm.allreduce_policies() if p not in ("oracle", "deft")]


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("workers,launcher", [(2, "torchrun"), (3, "quicksilver")])
def test_deft_follows_its_delayed_update_schedule(build_dir, tmp_path, workers, launcher):
    """DeFT on gloo: every worker applies the same delayed updates (iterations merged into
    one step, updates a pass or more late), and its parameters equal one process applying
    that schedule to the concatenated batches. Small buckets (each all-reduce costs about
    a quarter of a millisecond on loopback, more than the digits CNN's compute) and
    knapsacks at a twentieth of the compute make DeFT delay and merge; the Preserver judges
    measured training every 3 iterations."""
    iterations, per_worker = 12, 8
    knobs = {"deft_partition_size": "4KiB", "deft_horizon": 3, "deft_capacity_scale": 0.05}
    p, took = launch(build_dir, launcher, workers,
                     ["--model", "digits", "--policies", "deft", "--iterations", str(iterations),
                      "--batch", str(per_worker), "--out", str(tmp_path), "--knobs", json.dumps(knobs)], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    runs = [json.load(open(os.path.join(str(tmp_path), "deft-sgd-{}.json".format(r)))) for r in range(workers)]
    updates = [tuple(u) for u in runs[0]["updates"]]
    for r in range(1, workers):
        assert [tuple(u) for u in runs[r]["updates"]] == updates, "worker {} applied other updates".format(r)
    layers = len(runs[0]["profile"]["layers"])
    # Every iteration's gradients are applied exactly once to every layer.
    for l in range(layers):
        covered = sorted(i for b, layer, f, la in updates if layer == l for i in range(f, la + 1))
        assert covered == list(range(iterations)), (l, covered)
    merged = [u for u in updates if u[3] > u[2]]
    late = [u for u in updates if u[0] < qs_after_training() and u[0] > u[3] + 1]
    ref = reference_delayed("digits", "sgd", workers, per_worker, iterations, runs[0]["profile"], updates)
    worst = 0.0
    for r in range(workers):
        got = torch.load(os.path.join(str(tmp_path), "deft-sgd-{}.pt".format(r)))
        worst = max(worst, max((got[k] - ref[k]).abs().max().item() for k in ref))
    assert worst <= TOLERANCE, "parameters differ from the schedule applied in one process by {:.2e}".format(worst)
    notes = " ".join(runs[0]["report"]["notes"])
    assert "Preserver (measured training)" in notes and "no judgement yet" not in notes, notes
    print("deft, {} workers ({}): {} updates, {} merged, {} later than the next pass; worst difference {:.2e}, "
          "{:.1f} s; {}".format(workers, launcher, len(updates), len(merged), len(late), worst, took,
                                [n for n in runs[0]["report"]["notes"] if "Preserver" in n]))
    assert merged, "DeFT merged no iterations: the test would not see merged sums ({})".format(updates)


def test_deft_holds_a_few_model_sized_buffers(build_dir, tmp_path):
    """DeFT merging many iterations per update (knapsacks at a fiftieth of the compute): each
    worker's staging (a running sum per range of iterations, not a copy per iteration) and
    the Session's merged sums (a layer's buffer from its first sum until its update is
    loaded) stay at a few times the model's size over the run. Before, a copy per iteration
    and a model-sized buffer per range: VGG-11 ran out of memory."""
    workers, iterations, per_worker = 2, 40, 8
    # The Preserver off: it would raise the capacities and shorten the merges.
    knobs = {"deft_partition_size": "4KiB", "deft_capacity_scale": 0.02, "deft_max_retries": 0}
    p, took = launch(build_dir, "quicksilver", workers,
                     ["--model", "digits", "--policies", "deft", "--iterations", str(iterations),
                      "--batch", str(per_worker), "--out", str(tmp_path), "--knobs", json.dumps(knobs)], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    longest = 0
    for r in range(workers):
        run = json.load(open(os.path.join(str(tmp_path), "deft-sgd-{}.json".format(r))))
        model_bytes = 4 * sum(t["elements"] for l in run["profile"]["layers"] for t in l["tensors"])
        longest = max(u[3] - u[2] + 1 for u in run["updates"])
        report = run["report"]
        print("worker {}: at most {} staging buffers, {:.1f} models of merged sums; longest update {} iterations, "
              "{:.1f} s".format(r, report["staging_buffers_max"], report["merged_bytes_max"] / model_bytes, longest,
                                took))
        assert 0 < report["staging_buffers_max"] <= 4, report
        assert 0 < report["merged_bytes_max"] <= 4 * model_bytes, (report["merged_bytes_max"], model_bytes)
    assert longest >= 8, "DeFT merged few iterations: the test does not tell a copy per iteration from a sum"


def qs_after_training():
    import quicksilver._quicksilver as qsm
    return qsm.AFTER_TRAINING


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("workers,launcher", [(2, "torchrun"), (3, "quicksilver")])
def test_digits_every_allreduce_policy(build_dir, tmp_path, workers, launcher):
    """The all-reduce policies on gloo, each worker's parameters against one process."""
    policies = allreduce_policies()
    iterations, per_worker = 4, 8
    knobs = {"partition_size": "8KiB", "credit_size": "16KiB", "ddp_bucket_size": "16KiB", "ddp_first_bucket_size": "4KiB"}
    p, took = launch(build_dir, launcher, workers,
                     ["--model", "digits", "--policies", ",".join(policies), "--iterations", str(iterations),
                      "--batch", str(per_worker), "--out", str(tmp_path), "--knobs", json.dumps(knobs),
                      "--architecture", "allreduce"], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    worst = check_equal(str(tmp_path), policies, "sgd", "digits", workers, per_worker, iterations)
    print("{} workers ({}), {} all-reduce policies: worst difference {:.2e}, {:.1f} s".format(
        workers, launcher, len(policies), worst, took))


def test_digits_adam_adamw(build_dir, tmp_path):
    p, _ = launch(build_dir, "quicksilver", 2,
                  ["--model", "digits", "--policies", "mercury", "--optimizers", "adam,adamw", "--iterations", "4",
                   "--batch", "8", "--out", str(tmp_path)], 180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    for opt_name in ("adam", "adamw"):
        check_equal(str(tmp_path), ["mercury"], opt_name, "digits", 2, 8, 4)


def test_resnet18(build_dir, tmp_path):
    p, took = launch(build_dir, "quicksilver", 2,
                     ["--model", "resnet18", "--policies", "mercury,bytescheduler", "--iterations", "3", "--batch",
                      "2", "--out", str(tmp_path)], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    worst = check_equal(str(tmp_path), ["mercury", "bytescheduler"], "sgd", "resnet18", 2, 2, 3)
    report = json.load(open(os.path.join(str(tmp_path), "mercury-sgd-0.json")))
    layers = report["profile"]["layers"]
    # The layers in the order the forward pass uses them: the stem first, the classifier last.
    assert layers[0]["name"] == "conv1" and layers[-1]["name"] == "fc", [l["name"] for l in layers]
    print("resnet18: worst difference {:.2e}, {:.1f} s, {} layers".format(worst, took, len(layers)))


def test_peer_death_ends_every_process(build_dir, tmp_path):
    """Worker 1 dies abruptly in its third iteration: worker 0 raises and every process ends."""
    p, took = launch(build_dir, "quicksilver", 2,
                     ["--model", "digits", "--policies", "mercury", "--iterations", "6", "--out", str(tmp_path),
                      "--die-at", "2"], 120)
    assert p.returncode != 0
    assert "QuicksilverError" in p.stderr or "lost" in p.stderr, p.stderr[-4000:]
    assert took < 60, "took {:.1f} s to end after a peer died".format(took)


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("policy,architecture,stops", [("mercury", "ps", 1), ("mercury", "ps", 0),
                                                        ("mgwfbp", "allreduce", 1), ("bytescheduler", "allreduce", 1),
                                                        ("mgwfbp", "allreduce", 0)])
def test_workers_that_end_apart_fail_clearly(build_dir, tmp_path, policy, architecture, stops):
    """One worker ends its loop after 2 iterations, the other goes on, the consistency guard
    on: no one waits for ever (on the all-reduce path worker 1 or worker 0, whose decisions
    the others replay). Worker 0 ending first hung on the all-reduce path: worker 1 failed,
    but its session (held by the exception's traceback) kept its connections open, and
    worker 0 waited for it in the final barrier; a failed worker now closes them."""
    p, took = launch(build_dir, "quicksilver", 2,
                     ["--model", "digits", "--policies", policy, "--architecture", architecture, "--iterations", "5",
                      "--out", str(tmp_path), "--stop-at", "2", "--stop-rank", str(stops), "--check-consistency", "1"],
                     120)
    assert p.returncode != 0
    assert "every worker must train the same number of iterations" in p.stderr, p.stderr[-4000:]
    assert took < 60, "took {:.1f} s".format(took)


def test_bad_policy_and_knob_raise():
    import quicksilver.torch as qs
    qs.init()
    model = models.DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not a parameter-server policy"):
        qs.DistributedOptimizer(opt, model, policy="no-such-policy")
    with pytest.raises(ValueError, match="not a parameter-server policy"):
        qs.DistributedOptimizer(opt, model, policy="ddp", architecture="ps")
    with pytest.raises(ValueError, match="not an all-reduce policy"):
        qs.DistributedOptimizer(opt, model, policy="mercury", architecture="allreduce")
    with pytest.raises(ValueError, match="give 'ps' or 'allreduce'"):
        qs.DistributedOptimizer(opt, model, policy="wfbp", architecture="ring")
    with pytest.raises(ValueError, match="unknown knob"):
        qs.DistributedOptimizer(opt, model, policy="mercury", packet_sise="4KiB")
    # The runtime's settings, checked by the one table the command line uses too.
    with pytest.raises(TypeError, match="peer_timeout='10s': give a number of seconds"):
        qs.DistributedOptimizer(opt, model, policy="mercury", peer_timeout="10s")
    with pytest.raises(ValueError, match="--connect-timeout must be > 0"):
        qs.DistributedOptimizer(opt, model, policy="mercury", connect_timeout=0)
    with pytest.raises(ValueError, match="congestion control 'no-such-cc' is not available"):
        qs.DistributedOptimizer(opt, model, policy="mercury", congestion="no-such-cc")


def test_single_process_matches_plain_training():
    """One worker (no launcher): the integration itself changes nothing."""
    import quicksilver.torch as qs
    qs.init()
    torch.manual_seed(0)
    model = models.DigitsCNN()
    opt = qs.DistributedOptimizer(models.optimizer("sgd", model.parameters()), model, policy="mercury")
    x, y = models.digits()
    loss_fn = torch.nn.CrossEntropyLoss()
    with torch.no_grad():  # an evaluation pass before training: the layers are found on it
        model(x[:4])
    for it in range(3):
        xb, yb = models.batch(x, y, it, 0, 1, 16)
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    with torch.no_grad():  # evaluation passes after training see the updated parameters
        model(x[:4])
        model(x[:4])
    report = opt.shutdown()
    ref = reference("digits", "sgd", 1, 16, 3)
    got = model.state_dict()
    assert max((got[k] - ref[k]).abs().max().item() for k in ref) <= TOLERANCE
    assert len(report["iteration_ms"]) == 3


def test_profile_command_feeds_the_simulator(build_dir, tmp_path):
    """`quicksilver profile` measures a model into a profile that `simulate` reads."""
    exe = os.path.join(build_dir, "quicksilver")
    out = str(tmp_path / "digits.json")
    p = subprocess.run([exe, "profile", "--model", os.path.join(HERE, "models.py") + ":DigitsCNN", "--input", "1,8,8",
                        "--batch", "8", "--iterations", "3", "--warmup", "1", "--out", out],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    profile = json.load(open(out))
    assert [l["name"] for l in profile["layers"]] == ["conv1", "conv2", "fc1", "fc2"]
    assert profile["batch_size"] == 8 and all(l["forward_ms"] > 0 for l in profile["layers"])
    s = subprocess.run([exe, "simulate", "--model", out, "--policy", "mercury", "--workers", "2", "--servers", "2",
                        "--json"], capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["results"][0]["iteration_ms"] > 0


def test_profile_device(build_dir, tmp_path):
    """`quicksilver profile --device`: the whole iteration is timed apart from the layers
    and printed beside their sum; a device torch does not have, or a wrong one, exits 2
    naming it; on a CUDA machine, the profile is measured there (CUDA events)."""
    exe = os.path.join(build_dir, "quicksilver")
    base = [exe, "profile", "--python", sys.executable, "--model", os.path.join(HERE, "models.py") + ":DigitsCNN",
            "--input", "1,8,8", "--batch", "8", "--iterations", "3", "--warmup", "1"]
    p = subprocess.run(base + ["--out", str(tmp_path / "cpu.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "on cpu (4 layers" in p.stderr and "the whole iteration timed apart" in p.stderr, p.stderr
    p = subprocess.run(base + ["--device", "tpu", "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "--device 'tpu'" in p.stderr, p.stderr
    p = subprocess.run(base + ["--device", "cuda", "--out", str(tmp_path / "cuda.json")], capture_output=True,
                       text=True, timeout=120)
    if torch.cuda.is_available():
        assert p.returncode == 0 and "on cuda" in p.stderr, p.stderr
        assert all(l["backward_ms"] > 0 for l in json.load(open(tmp_path / "cuda.json"))["layers"])
    else:
        assert p.returncode == 2 and "sees no CUDA device here" in p.stderr, p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="--netns needs root")
def test_netns_shaped_cluster(build_dir, tmp_path):
    """`quicksilver run --netns`: one namespace per worker, shaped links; still exact."""
    cmd = [os.path.join(build_dir, "quicksilver"), "run", "--python", sys.executable, "--netns", "--bandwidth", "1Gbps",
           "--workers", "2",
           "--script", WORKER, "--model", "digits", "--policies", "mercury,bytescheduler", "--iterations", "3",
           "--out", str(tmp_path)]
    p = subprocess.run(cmd, env=env(build_dir), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    assert "MASTER_ADDR=10.213." in p.stderr
    check_equal(str(tmp_path), ["mercury", "bytescheduler"], "sgd", "digits", 2, 8, 3)


def test_no_gloo_symbol_binds_across(build_dir, tmp_path):
    """The all-reduce runtime's gloo (the system's libgloo.so.0) and the gloo inside the
    user's torch never meet, and nothing binds into the module, even with torch's libraries in the global symbol scope
    (TORCH_USE_RTLD_GLOBAL=1): the dynamic linker's own record (LD_DEBUG=bindings) of a
    2-rank all-reduce job shows no binding from our module or its libgloo into torch's
    libraries, nor back. A pip torch without this died with SIGSEGV on both ranks."""
    logs = tmp_path / "ld"
    logs.mkdir()
    e = env(build_dir)
    e.update(TORCH_USE_RTLD_GLOBAL="1", LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(logs / "b"))
    cmd = [os.path.join(build_dir, "quicksilver"), "run", "--python", sys.executable, "--workers", "2", "--script", WORKER,
           "--model", "digits",
           "--policies", "mgwfbp", "--iterations", "2", "--out", str(tmp_path), "--architecture", "allreduce"]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    # A pip torch carries its own gloo; Debian's links the system's libgloo.so.0, the one
    # our module uses, so there a binding of that one library to torch's is no clash.
    torch_libs = ("libtorch", "libc10")
    bindings = []
    for f in logs.iterdir():
        for line in open(f, errors="replace"):
            parts = line.split()
            if "binding file" in line and len(parts) > 6:
                bindings.append((os.path.basename(parts[3]), os.path.basename(parts[6]), line.strip()))
    shared_gloo = any(any(t in src for t in torch_libs) and "libgloo" in dst for src, dst, _ in bindings)
    ours = ("_quicksilver",) if shared_gloo else ("_quicksilver", "libgloo")
    # A gloo symbol must not cross; nothing may bind into the module but the module itself
    # (on Ubuntu 24.04 libgloo bound libstdc++'s std::ostream::_M_insert<long> into the
    # module's copy, and crashed, until the module exported its init function alone). The
    # C++ library's unique objects (STB_GNU_UNIQUE, e.g. make_shared's type tag) are one
    # per process by the ELF rules: they bind to whichever library defined them first.
    across = [l for src, dst, l in bindings
              if (any(o in src for o in ours) and any(t in dst for t in torch_libs) and "gloo" in l.split("`")[-1])
              or ("_quicksilver" in dst and "_quicksilver" not in src)]
    into_gloo = sum(1 for src, dst, _ in bindings if "_quicksilver" in src and "libgloo" in dst)
    assert into_gloo > 0, "the log shows no call into gloo: the check saw nothing"
    assert not across, "{} bindings across, e.g. {}".format(len(across), across[:3])
    print("torch {} ({}): {} bindings from the module into its libgloo, none across".format(
        torch.__version__, "the system's gloo" if shared_gloo else "a gloo of its own", into_gloo))


def test_misuse_raises_clearly():
    """Arguments and calls that do not apply are refused with the remedy, never ignored."""
    import quicksilver.torch as qs
    qs.init()
    assert qs.local_size() == 1 and qs.size() == 1
    model = models.DigitsCNN()

    def opt():
        return torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="compression='int8': give None"):
        qs.DistributedOptimizer(opt(), model, compression="int8")
    with pytest.raises(ValueError, match="gradient_predivide_factor is not supported"):
        qs.DistributedOptimizer(opt(), model, gradient_predivide_factor=2.0)
    with pytest.raises(TypeError, match="needs the model"):
        qs.DistributedOptimizer(opt(), model.named_parameters())  # Horovod's positional form
    with pytest.raises(ValueError, match="are not in it"):
        qs.DistributedOptimizer(opt(), model, named_parameters=list(model.named_parameters())[:2])
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        qs.DistributedOptimizer(opt(), model, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op='max'"):
        qs.DistributedOptimizer(opt(), model, op="max")
    with pytest.raises(ValueError, match="does not apply to policy 'deft'"):
        qs.DistributedOptimizer(opt(), model, policy="deft", find_unused_parameters=True)
    x, y = models.digits()
    loss_fn = torch.nn.CrossEntropyLoss()

    def trained_once():
        m = models.DigitsCNN()
        o = qs.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, named_parameters=m.named_parameters())
        o.zero_grad()
        loss_fn(m(x[:8]), y[:8]).backward()
        o.step()
        return m, o

    m, o = trained_once()
    with pytest.raises(RuntimeError, match="without a backward pass since the last step"):
        o.step()
    with pytest.raises(RuntimeError, match="after an earlier error stopped this optimizer"):
        o.step()
    o.shutdown()
    m, o = trained_once()
    o.zero_grad()
    loss_fn(m(x[:8]), y[:8]).backward()
    with pytest.raises(RuntimeError, match="skip_synchronize\\(\\) without optimizer.synchronize\\(\\)"):
        with o.skip_synchronize():
            o.step()
    o.shutdown()
    m, o = trained_once()
    o.zero_grad()
    loss_fn(m(x[:8]), y[:8]).backward()
    o.synchronize()
    with o.skip_synchronize():
        o.step()
    o.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        o.step()


def test_step_hooks_run_once_and_shutdown_releases_everything():
    """torch 2.x's optimizer step hooks run once per step(), also after load_state_dict()
    (which re-wraps a class's step); shutdown() takes the integration off the model and
    closes rank 0's rendezvous store."""
    import quicksilver.torch as qs
    qs.init()
    model = models.DigitsCNN()
    opt = qs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                                  policy="mgwfbp")
    calls = []
    if hasattr(opt, "register_step_pre_hook"):
        opt.register_step_pre_hook(lambda *a: calls.append("pre"))
        opt.register_step_post_hook(lambda *a: calls.append("post"))
    x, y = models.digits()
    loss_fn = torch.nn.CrossEntropyLoss()
    for it in range(3):
        opt.zero_grad()
        loss_fn(model(x[:8]), y[:8]).backward()
        opt.step()
        if it == 0:
            opt.load_state_dict(opt.state_dict())
    if hasattr(opt, "register_step_pre_hook"):
        assert calls == ["pre", "post"] * 3, calls
    assert opt._qs.store is not None
    opt.shutdown()
    assert opt._qs.store is None
    overrides = [n for m in model.modules() for n in ("state_dict", "parameters", "zero_grad", "__getstate__")
                 if n in m.__dict__]
    assert not overrides, overrides


BENCH = os.path.join(HERE, "..", "..", "bench")
CUDA = torch.cuda.is_available()


def check_gpu_train(out, variants):
    """bench/gpu_train.py's verdicts for --policies mercury,mgwfbp,deft and VARIANTS, with
    mercury+wire-bf16 timed: exact against one process, ranks bit-identical, then samples/s
    against DDP."""
    assert "gpu_train: 2 ranks: all passed" in out, out
    assert out.count("ranks bit-identical") == 3 + len(variants), out
    assert out.count("within tolerance") == 2 + len(variants), out
    assert "(a) mercury+wire-bf16  ranks bit-identical; rank 0 vs one process (same rounding)" in out, out
    assert out.count("x DDP-gloo") == 4, out


# Its variants: compression on the wire (against a reference that rounds the same way), and
# mixed precision (autocast + GradScaler, synchronize() / skip_synchronize()) where this
# torch has a CPU GradScaler (bench/gpu_check.sh --cpu passes the same).
GPU_TRAIN_VARIANTS = ["mercury+wire-bf16"] + (["mgwfbp+amp"] if hasattr(getattr(torch, "amp", None),
                                                                         "GradScaler") else [])


@pytest.mark.skipif(not CUDA, reason="no CUDA device here (torch.cuda.is_available() is False): bench/gpu_check.sh "
                    "runs it on one; on the CPU, test_gpu_check_script_cpu_mode runs it")
def test_gpu_check_training_stage_on_cuda(build_dir):
    """bench/gpu_check.sh's stage (a)+(b) (bench/gpu_train.py) small, on CUDA: 2 ranks,
    ResNet-18 with GroupNorm, a PS, an all-reduce and a delayed-update policy. The gradients
    go through the pinned staging (on the CPU through the in-place path: the test below)."""
    p, took = harness.launch(build_dir, "quicksilver", 2, os.path.join(BENCH, "gpu_train.py"),
                             ["--device", "cuda", "--size", "32", "--batch", "4", "--steps", "2", "--iterations", "2",
                              "--warmup", "1", "--policies", "mercury,mgwfbp,deft", "--variants",
                              ",".join(GPU_TRAIN_VARIANTS), "--speed-variants", "mercury+wire-bf16"], 600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check_gpu_train(p.stdout, GPU_TRAIN_VARIANTS)


@pytest.mark.skipif(not CUDA, reason="no CUDA device here: the copy rates and the urgent gradient's delay need one")
def test_gpu_copy_bench(build_dir):
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_copy.py"), "--sizes-mb", "1,4"], env=env(build_dir),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "urgent" in p.stdout, p.stdout + p.stderr


def test_gpu_check_script_cpu_mode(build_dir):
    """`bash bench/gpu_check.sh --cpu` as a user runs it without a GPU (its build stage
    skipped: this build), on this interpreter's torch: its stage a+b/2 (bench/gpu_train.py
    on 2 ranks, ResNet-18 with GroupNorm through a PS, an all-reduce and a delayed-update
    policy, the gradients through the in-place path) and its summary."""
    e = env(build_dir)
    e.update(QS_GPU_SKIP_BUILD="1", QS_GPU_BUILD=build_dir,
             PATH=os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", ""))
    p = subprocess.run(["bash", os.path.join(BENCH, "gpu_check.sh"), "--cpu"], env=e, capture_output=True,
                       text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "a+b/2    ok" in out, out[-3000:]
    assert "build    skipped (QS_GPU_SKIP_BUILD" in out, out[-3000:]
    check_gpu_train(out, GPU_TRAIN_VARIANTS)


def test_gpu_check_script_refuses_what_it_does_not_know():
    p = subprocess.run(["bash", os.path.join(BENCH, "gpu_check.sh"), "--bogus"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2 and "usage: bash bench/gpu_check.sh" in p.stderr, p.stderr


def test_profile_warns_when_the_machine_was_busy():
    """`quicksilver profile` says so when other work shared the CPU it measured on (the
    figures then include waiting for it); a GPU measurement or an idle machine says nothing."""
    from quicksilver.profile import _load_warning
    cores = os.cpu_count() or 1
    text = _load_warning(0.0, torch.device("cpu"), 1)
    assert text and "the machine was busy while measuring (0% of its {} cores idle".format(cores) in text
    assert "Measure again when it is idle" in text
    assert _load_warning(1.0 - 1.0 / cores, torch.device("cpu"), 1) is None
    assert _load_warning(0.0, torch.device("cuda"), 1) is None
    assert _load_warning(None, torch.device("cpu"), 1) is None


def test_the_launchers_choice_reaches_the_optimizer(monkeypatch):
    """`quicksilver run --script --policy P [knobs] [--compression C]`: honoured where the
    script leaves the setting to its default, agreed with, refused naming both otherwise."""
    import quicksilver.torch as qs
    choice = qs._launcher_choice
    assert choice(None, None, None, {}) == ("mercury", None, None, {})
    monkeypatch.setenv("QS_POLICY", "bytescheduler")
    monkeypatch.setenv("QS_KNOBS", "credit_size=8MiB;partition_size=1MB")
    monkeypatch.setenv("QS_COMPRESSION", "bf16")
    assert choice(None, None, None, {"partition_size": "1MB"}) == (
        "bytescheduler", None, "bf16", {"credit_size": "8MiB", "partition_size": "1MB"})
    assert choice("bytescheduler", None, "bf16", {})[0] == "bytescheduler"
    with pytest.raises(ValueError, match="given --policy bytescheduler, but the script asks for policy='mercury'"):
        choice("mercury", None, None, {})
    with pytest.raises(ValueError, match="given --credit-size 8MiB, but the script asks for credit_size='20MB'"):
        choice(None, None, None, {"credit_size": "20MB"})
    with pytest.raises(ValueError, match="given --compression bf16, but the script asks for compression='fp16'"):
        choice(None, None, "fp16", {})
    assert choice(None, None, "bfloat16", {})[2] == "bf16"  # the command line's spelling
    monkeypatch.setenv("QS_BANDWIDTH", "1Gbps")
    assert qs._launcher_setting("bandwidth", None, "QS_BANDWIDTH") == "1Gbps"
    with pytest.raises(ValueError, match="given --bandwidth 1Gbps, but the script asks for bandwidth='25Gbps'"):
        qs._launcher_setting("bandwidth", "25Gbps", "QS_BANDWIDTH")
