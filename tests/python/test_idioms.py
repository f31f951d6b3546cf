"""Training scripts as people write them (tests/python/idioms.py), on 2 and 3 workers, against
one process trained on the concatenated batches: rank 0 within 1e-5 of that reference and
every rank's parameters bit-identical to rank 0's, read where the user reads them (right
after the loop, from model.state_dict()); every worker runs with check_consistency=1. DeFT
is compared with one process replaying its logged delayed-update schedule. The idioms
that cannot be right must raise, each with the words that name the remedy."""
import json
import os
import subprocess
import sys

import pytest
import torch

import harness
import idioms

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "idiom_worker.py")
TOLERANCE = 1e-5
CPU_GRADSCALER = hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
SYNC = ["onecycle", "warmup_before", "clip", "clip_tiny", "accumulate", "checkpoint_ema", "unused", "batchnorm",
        "horovod", "sum_op", "transformer"]
DEFT = ["onecycle", "warmup_before", "accumulate", "batchnorm"]
# Small buckets and knapsacks at a twentieth of the compute make DeFT delay and merge on
# loopback (at 0.3, a CI machine whose compute ran slow issued every bucket a stage late, unmerged).
DEFT_KNOBS = {"deft_partition_size": "4KiB", "deft_horizon": 3, "deft_capacity_scale": 0.05}


def launch(build_dir, launcher, workers, args, timeout=600):
    p, took = harness.launch(build_dir, launcher, workers, WORKER, args, timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return took


KIND = {"unused": "branchy", "batchnorm": "bn", "transformer": "transformer"}


def parameter_names(name):
    kind = KIND.get(name, "digits")
    return {n for n, _ in idioms.make_model(kind).named_parameters()}


def compare(out, name, policy, workers, reference):
    """Rank 0 against the reference (every saved state); every rank's parameters against
    rank 0's, bit for bit (BatchNorm's running statistics are each rank's own, as in DDP)."""
    got = [torch.load(os.path.join(out, "{}-{}-{}.pt".format(name, policy, r))) for r in range(workers)]
    params = parameter_names(name)
    worst = 0.0
    for key, ref in reference.items():
        diff = max((got[0][key][k] - ref[k]).abs().max().item() for k in ref)
        assert diff <= TOLERANCE, "{} {} '{}': rank 0 differs from one process by {:.2e}".format(
            name, policy, key, diff)
        worst = max(worst, diff)
        for r in range(1, workers):
            for k in got[0][key]:
                if key == "norms" or k in params or key == "losses":
                    assert torch.equal(got[r][key][k], got[0][key][k]), "{} {}: rank {}'s '{}' {} differs".format(
                        name, policy, r, key, k)
    # Training moved the parameters (the comparison is not vacuous).
    start = idioms.seeded_model(KIND.get(name, "digits")).state_dict()
    moved = max((got[0]["model"][k].float() - start[k].float()).abs().max().item() for k in start)
    assert moved > 1e-4 or name == "clip_tiny", (name, policy, moved)
    return worst


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("workers,launcher,policy", [(2, "torchrun", "mercury"), (2, "quicksilver", "mgwfbp"),
                                                     (3, "quicksilver", "mercury"), (3, "torchrun", "mgwfbp")])
def test_idioms_match_one_process(build_dir, tmp_path, workers, launcher, policy):
    took = launch(build_dir, launcher, workers, ["--idioms", ",".join(SYNC), "--policies", policy, "--out",
                                                 str(tmp_path)])
    worst = {}
    for name in SYNC:
        reference = idioms.IDIOMS[name](idioms.World(workers, bn_apart=(name == "batchnorm")))
        worst[name] = compare(str(tmp_path), name, policy, workers, reference)
    print("{} workers ({}), {}: {} idioms in {:.1f} s; worst difference from one process: {}".format(
        workers, launcher, policy, len(SYNC), took, ", ".join("{} {:.1e}".format(k, v) for k, v in worst.items())))


@pytest.mark.parametrize("policy,staging", [("mercury", "async"), ("mgwfbp", "async"), ("deft", "async")])
def test_staged_tensors_match_one_process(build_dir, tmp_path, monkeypatch, policy, staging):
    """Every tensor forced through the staging component (QS_FORCE_STAGING: host float32
    buffers registered instead of .grad; "async": each gradient reported from staging's
    thread a moment after its hook, as on CUDA, so the forward pass may reach a layer
    before its report): the idioms still match one process (DeFT: its replayed schedule)."""
    monkeypatch.setenv("QS_FORCE_STAGING", staging)
    names = DEFT if policy == "deft" else ["onecycle", "clip", "accumulate", "checkpoint_ema", "unused"]
    extra = ["--knobs", json.dumps(DEFT_KNOBS)] if policy == "deft" else []
    launch(build_dir, "quicksilver", 2, ["--idioms", ",".join(names), "--policies", policy, "--out",
                                         str(tmp_path)] + extra)
    for name in names:
        if policy == "deft":
            reference, _ = deft_reference(str(tmp_path), name, 2)
        else:
            reference = idioms.IDIOMS[name](idioms.World(2, bn_apart=(name == "batchnorm")))
        compare(str(tmp_path), name, policy, 2, reference)


@pytest.mark.parametrize("dtype,policy", [("bf16", "mercury"), ("fp16", "mgwfbp")])
def test_low_precision_parameters(build_dir, tmp_path, dtype, policy):
    """bfloat16 and float16 parameters (staged; float32 sums) against a reference that
    rounds the same way, on 3 workers."""
    if dtype == "fp16" and not idioms.TORCH2:
        pytest.skip("float16 convolutions on the CPU need torch >= 2.0; this is torch " + torch.__version__)
    launch(build_dir, "quicksilver", 3, ["--idioms", dtype, "--policies", policy, "--out", str(tmp_path)])
    worst = compare(str(tmp_path), dtype, policy, 3, idioms.IDIOMS[dtype](idioms.World(3)))
    print("{} parameters, {}: worst difference {:.1e}".format(dtype, policy, worst))


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("wire,policy,workers", [("wire_bf16", "mercury", 2), ("wire_fp16", "bytescheduler", 2),
                                                 ("wire_bf16", "wfbp", 3), ("wire_fp16", "mgwfbp", 2)])
def test_compressed_gradients_match_the_same_rounding(build_dir, tmp_path, wire, policy, workers):
    """compression=bf16/fp16: half the bytes on the wire, float32 sums (the servers'; the
    all-reduce's partial sums, rounded at each hop: with 2 workers the same rounding);
    rank 0 against one process that rounds each worker's gradient and the sum the same way."""
    launch(build_dir, "quicksilver", workers, ["--idioms", wire, "--policies", policy, "--out", str(tmp_path)])
    worst = compare(str(tmp_path), wire, policy, workers, idioms.IDIOMS[wire](idioms.World(workers)))
    print("{}, {}, {} workers: worst difference {:.1e}".format(wire, policy, workers, worst))


@pytest.mark.skipif(not CPU_GRADSCALER,
                    reason="a CPU GradScaler needs torch >= 2.3; this is torch " + torch.__version__)
@pytest.mark.parametrize("policy", ["mercury", "mgwfbp"])
def test_gradscaler(build_dir, tmp_path, policy):
    """GradScaler: scale, synchronize(), unscale_, clip, step in skip_synchronize(), update;
    its first step overflows and is skipped (zero_grad() drops that pass)."""
    launch(build_dir, "quicksilver", 2, ["--idioms", "gradscaler", "--policies", policy, "--out", str(tmp_path)])
    worst = compare(str(tmp_path), "gradscaler", policy, 2, idioms.gradscaler(idioms.World(2)))
    print("gradscaler, {}: worst difference {:.1e}".format(policy, worst))


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0; this is torch "
                    + torch.__version__)
@pytest.mark.parametrize("policy", ["mercury", "mgwfbp"])
def test_compiled_model(build_dir, tmp_path, policy):
    """torch.compile'd models: the integration's hooks run outside the compiled graphs (a
    graph break each), at their place in every call."""
    launch(build_dir, "quicksilver", 2, ["--idioms", "compiled", "--policies", policy, "--out", str(tmp_path)])
    worst = compare(str(tmp_path), "compiled", policy, 2, idioms.compiled(idioms.World(2)))
    print("compiled, {}: worst difference {:.1e}".format(policy, worst))


def deft_reference(out, name, workers, policy="deft"):
    import quicksilver._quicksilver as qsm
    logs = json.load(open(os.path.join(out, "{}-{}-0.json".format(name, policy))))
    for r in range(1, workers):
        theirs = json.load(open(os.path.join(out, "{}-{}-{}.json".format(name, policy, r))))
        # The same updates (in any order across layers: a synchronous step applies the layers
        # whose sums are in, which differ from rank to rank; within a layer, in order).
        assert [sorted(map(tuple, l["updates"])) for l in theirs] == [sorted(map(tuple, l["updates"])) for l in logs], \
            "rank {} applied other updates".format(r)
    world = idioms.World(workers, bn_apart=(name == "batchnorm"))
    world.delayed = idioms.DelayedReference(logs[0]["profile"], logs[0]["updates"], qsm.AFTER_TRAINING)
    return idioms.IDIOMS[name](world), logs[0]["updates"]


@pytest.mark.runtime_matrix
@pytest.mark.parametrize("workers,launcher", [(2, "torchrun"), (3, "quicksilver")])
def test_deft_idioms_follow_their_schedule(build_dir, tmp_path, workers, launcher):
    """DeFT's delayed, merged updates under the same idioms: each update (first..last) uses
    the hyperparameters of the step() that followed iteration `last`."""
    took = launch(build_dir, launcher, workers, ["--idioms", ",".join(DEFT), "--policies", "deft", "--out",
                                                 str(tmp_path), "--knobs", json.dumps(DEFT_KNOBS)])
    merged = 0
    for name in DEFT:
        reference, updates = deft_reference(str(tmp_path), name, workers)
        compare(str(tmp_path), name, "deft", workers, reference)
        merged += sum(1 for u in updates if u[3] > u[2])
    assert merged, "DeFT merged no iterations: the test would not see merged updates"
    print("deft, {} workers ({}): {} idioms in {:.1f} s, {} merged updates".format(workers, launcher, len(DEFT), took,
                                                                                  merged))


def test_every_policy_with_a_per_iteration_schedule(build_dir, tmp_path):
    """The thirteen policies PyTorch runs, each with OneCycleLR stepped every iteration."""
    import quicksilver.torch as qs
    policies = qs.policies()
    knobs = dict(DEFT_KNOBS, packet_size="4KiB", partition_size="8KiB", credit_size="16KiB", slice_size="8KiB",
                 prophet_partition_size="8KiB", ddp_bucket_size="16KiB", ddp_first_bucket_size="4KiB")
    took = launch(build_dir, "quicksilver", 2, ["--idioms", "onecycle", "--policies", ",".join(policies), "--out",
                                                str(tmp_path), "--knobs", json.dumps(knobs)])
    sync_ref = idioms.onecycle(idioms.World(2))
    for policy in policies:
        if policy == "deft":
            reference, _ = deft_reference(str(tmp_path), "onecycle", 2)
        else:
            reference = sync_ref
        compare(str(tmp_path), "onecycle", policy, 2, reference)
    print("{} policies with OneCycleLR, {:.1f} s".format(len(policies), took))
    assert len(policies) == 13, policies


RAISE_CASES = [(name, policy) for name in idioms.RAISERS if name != "clip_during_the_send"
               for policy in ("mercury", "deft")] + [
    ("clip_without_synchronize", "mgwfbp"), ("two_forwards_undeclared", "mgwfbp"), ("clip_during_the_send", "mercury")]


@pytest.mark.parametrize("name,policy", RAISE_CASES)
def test_what_cannot_be_right_raises(build_dir, tmp_path, name, policy):
    """Each rank raises a Python error naming the remedy (never a hang, never a transport
    error, never a silent result)."""
    took = launch(build_dir, "quicksilver", 2, ["--raise", name, "--policies", policy, "--out", str(tmp_path),
                                                "--knobs", json.dumps(DEFT_KNOBS if policy == "deft" else {})],
                  timeout=180)
    expected = idioms.MUST_RAISE[name]
    if policy == "deft" and name == "clip_without_synchronize":
        expected = "use a synchronous policy"
    # Every rank runs the same loop, so each raises the same error, unless a peer raised
    # first: the session stops at once and a rank still waiting on it is told its peer is
    # gone. Never a protocol error, but for one account: the transport sends .grad in
    # place, so a clip during the send changes bytes on the wire, which the receiver's
    # checksum catches (nothing of them is used). The writer is told the remedy (its
    # transport error explained by its write); a peer whose session failed before its own
    # write (or that wrote nothing: clip_during_the_send's rank 1) may be told that the
    # writer's frame arrived changed.
    texts = [open(os.path.join(str(tmp_path), "raise-{}-{}-{}.txt".format(name, policy, r))).read() for r in range(2)]
    assert any(expected in t for t in texts), texts
    if name == "clip_during_the_send":
        assert expected in texts[0] and "protocol error" not in texts[0], texts[0]
    for r, text in enumerate(texts):
        assert expected in text or "lost" in text or "stopped" in text, "rank {}: {!r}".format(r, text)
        peers_write = name.startswith("clip_") and "lost worker" in text and "corrupted payload" in text
        assert peers_write or ("protocol error" not in text and "CRC32C" not in text), text
    assert took < 60, "took {:.1f} s".format(took)


def test_imagenet_shaped_script_trains_resumes_and_matches_one_process(build_dir, tmp_path):
    """pytorch/examples' imagenet/main.py loop (tests/python/imagenet_like.py): the scheduler
    created before the wrapper, per-epoch validation and checkpoints, a resume; two
    workers equal one process on the concatenated batches, and a run resumed from the
    first epoch's checkpoint equals the run that went straight through."""
    script = os.path.join(HERE, "imagenet_like.py")
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(build_dir, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"

    def run(out, *extra, workers=2):
        os.makedirs(out, exist_ok=True)
        if workers == 1:
            cmd = [sys.executable, script]
        else:
            cmd = [os.path.join(build_dir, "quicksilver"), "run", "--python", sys.executable, "--workers",
                   str(workers), "--script", script]
        p = subprocess.run(cmd + ["--out", out] + list(extra), env=e, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        return p.stdout

    straight, resumed, single = (str(tmp_path / d) for d in ("straight", "resumed", "single"))
    log = run(straight, "--epochs", "2")
    assert log.count("epoch 1: acc@1") == 2, log
    run(resumed, "--epochs", "1")
    run(resumed, "--epochs", "2", "--resume", os.path.join(resumed, "checkpoint.pth.tar"))
    run(single, "--epochs", "2", "--batch-size", "8", workers=1)
    got = [torch.load(os.path.join(straight, "final-{}.pt".format(r))) for r in range(2)]
    again = torch.load(os.path.join(resumed, "final-0.pt"))
    ref = torch.load(os.path.join(single, "final-0.pt"))
    for k in ref:
        assert torch.equal(got[1][k], got[0][k]), k
    diff = max((got[0][k] - ref[k]).abs().max().item() for k in ref)
    resume_diff = max((again[k] - got[0][k]).abs().max().item() for k in ref)
    assert diff <= TOLERANCE, "two workers differ from one process by {:.2e}".format(diff)
    assert resume_diff <= 1e-6, "the resumed run differs from the straight one by {:.2e}".format(resume_diff)
    assert os.path.exists(os.path.join(straight, "model_best.pth.tar"))
    print("imagenet-shaped: 2 workers vs one process {:.1e}, resumed vs straight {:.1e}".format(diff, resume_diff))


def decisions(out, name, workers):
    """Each rank's log of policy="auto"'s decisions of idiom `name`: [(pass, policy, switch)]."""
    logs = []
    for r in range(workers):
        log = json.load(open(os.path.join(out, "{}-auto-{}.json".format(name, r))))
        logs.append([(d["pass"], d["policy"], d["switch"]) for d in log[-1]["report"]["auto"]])
    return logs


# torchrun's launch and 3 ranks are covered by test_auto.py's threaded test (and torchrun by
# the DeFT one below); CI's time: each of these runs 11 idioms.
@pytest.mark.parametrize("architecture,schedule,workers,launcher", [
    ("ps", "3:bytescheduler,5:p3", 2, "quicksilver"),
    ("allreduce", "3:mgwfbp,5:wfbp", 2, "quicksilver")])
def test_auto_switches_keep_training_exact(build_dir, tmp_path, monkeypatch, architecture, schedule, workers,
                                           launcher):
    """policy="auto" switching policy mid-training (QS_AUTO_SCHEDULE puts the switches at
    passes of the test's choosing, through the same broadcast and switch as the planner's):
    every idiom still matches one process on the concatenated batches, every rank's
    parameters equal rank 0's (check_consistency=1 on), and every rank switched at the same
    passes to the same policies."""
    monkeypatch.setenv("QS_AUTO_SCHEDULE", schedule)
    knobs = {"replan_every": 1, "architecture": architecture}
    launch(build_dir, launcher, workers, ["--idioms", ",".join(SYNC), "--policies", "auto", "--knobs",
                                          json.dumps(knobs), "--out", str(tmp_path)])
    want = {int(n): p for n, _, p in (item.partition(":") for item in schedule.split(","))}
    switches = 0
    for name in SYNC:
        reference = idioms.IDIOMS[name](idioms.World(workers, bn_apart=(name == "batchnorm")))
        compare(str(tmp_path), name, "auto", workers, reference)
        logs = decisions(str(tmp_path), name, workers)
        assert all(log == logs[0] for log in logs), (name, logs)
        switched = {n: p for n, p, switch in logs[0] if switch}
        # An idiom of fewer passes than the schedule sees the switches up to its end.
        assert switched == {n: p for n, p in want.items() if n <= max(n for n, _, _ in logs[0])}, (name, logs[0])
        switches += len(switched)
    assert switches >= len(SYNC) - 1, "too few switches happened: the test would not see them"


@pytest.mark.parametrize("workers,launcher,back", [(2, "quicksilver", 5), (2, "torchrun", None)])
def test_auto_switches_into_and_out_of_delayed_updates(build_dir, tmp_path, monkeypatch, workers, launcher, back):
    """allow_stale=True: a switch into DeFT (small knapsacks, so that it delays and merges)
    and back out to DDP; the held-back updates are applied at the switch, before the next
    forward pass. Every update is logged (a synchronous one of pass n as (n, l, n-1, n-1)),
    and one process replaying that log on the concatenated batches gets the same model."""
    deft = "deft/" + "/".join("{}={}".format(k, v) for k, v in DEFT_KNOBS.items())
    monkeypatch.setenv("QS_AUTO_SCHEDULE", "3:{}".format(deft) + (",{}:ddp".format(back) if back else ""))
    knobs = {"replan_every": 1, "architecture": "allreduce", "allow_stale": True}
    launch(build_dir, launcher, workers, ["--idioms", ",".join(DEFT), "--policies", "auto", "--knobs",
                                          json.dumps(knobs), "--out", str(tmp_path)])
    merged = 0
    for name in DEFT:
        reference, updates = deft_reference(str(tmp_path), name, workers, "auto")
        compare(str(tmp_path), name, "auto", workers, reference)
        logs = decisions(str(tmp_path), name, workers)
        assert all(log == logs[0] for log in logs), (name, logs)
        want = [(3, "deft")] + ([(back, "ddp")] if back else [])
        assert [(n, p) for n, p, switch in logs[0] if switch] == want, (name, logs[0])
        merged += sum(1 for u in updates if u[3] > u[2])
    assert merged or back, "DeFT merged no iterations: the test would not see merged updates"
