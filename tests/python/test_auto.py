"""policy="auto"'s planner (quicksilver/auto.py) on given measurements: the network it infers,
the decision's determinism, the jobs whose best policy is obvious, the switch rule; and the
keywords DistributedOptimizer refuses with it. The switch itself: under the idioms on 2 ranks,
tests/python/test_idioms.py's test_auto_switches_*; on 2 and 3 ranks, the threaded test below."""
import json
import math
import os

import pytest
import torch

import models

# 40 tiny layers: every message is latency (a collective's startup, a round trip).
TINY = {"name": "tiny", "layers": [{"name": "l{}".format(i), "forward_ms": 0.02, "backward_ms": 0.04,
                                    "tensors": [{"name": "w", "elements": 64}]} for i in range(40)]}
# One 200 MB embedding first in the forward pass, last in the backward: bandwidth.
HUGE = {"name": "huge", "layers": [{"name": "emb", "forward_ms": 0.5, "backward_ms": 1.0,
                                    "tensors": [{"name": "w", "elements": 50_000_000}]}] +
        [{"name": "l{}".format(i), "forward_ms": 2.0, "backward_ms": 4.0,
          "tensors": [{"name": "w", "elements": 100_000}]} for i in range(10)]}


def qs_module():
    from quicksilver import _quicksilver
    return _quicksilver


def planner(architecture, workers=4, replan_every=50, allow_stale=False):
    from quicksilver import auto
    return auto.Planner(qs_module(), architecture, workers, workers, "none", allow_stale, replan_every)


def measured(p, profile, architecture, policy, gbps, workers=4, passes=8):
    """Feeds p the spans a job of `policy` on a `gbps` network would show (the simulator's
    iteration; the compute is the profile's), as rank 0's hooks would."""
    from quicksilver import auto
    q = qs_module()
    iteration = q.predict(json.dumps(profile), architecture, workers, workers, gbps, auto.LATENCY_US, "none",
                          policy, {})
    compute = sum(l["forward_ms"] + l["backward_ms"] for l in profile["layers"])
    for n in range(auto.WARMUP_PASSES + 1, auto.WARMUP_PASSES + 1 + passes):
        p.record(n, iteration, iteration - compute)
    return iteration


@pytest.mark.parametrize("architecture,policy,gbps", [("ps", "mercury", 1.0), ("ps", "wfbp", 25.0),
                                                      ("allreduce", "ddp", 0.3), ("allreduce", "mgwfbp", 3.0)])
def test_the_inferred_rate_is_the_one_that_gave_the_iteration(architecture, policy, gbps):
    from quicksilver import auto
    q = qs_module()
    prof = json.dumps(HUGE)

    def predict(g):
        return q.predict(prof, architecture, 4, 4, g, auto.LATENCY_US, "none", policy, {})
    got = auto.effective_gbps(predict, predict(gbps))
    assert abs(math.log(got / gbps)) < 0.01, (got, gbps)
    # Compute-bound (an iteration no rate explains): the top of the range, not an error.
    assert auto.effective_gbps(predict, 1.0) == auto.GBPS_RANGE[1]


def test_the_decision_is_a_function_of_the_measurements():
    decisions = []
    for _ in range(2):
        p = planner("ps")
        measured(p, HUGE, "ps", "wfbp", 2.0)
        d = p.decide(10, HUGE, "wfbp", {}, p.measurement(), 0.0)
        d.pop("decide_ms")
        decisions.append(d)
    assert decisions[0] == decisions[1]
    assert decisions[0]["switch"] and decisions[0]["network_gbps"] == pytest.approx(2.0, rel=0.01)


def test_a_bandwidth_bound_job_with_a_huge_layer_picks_a_partitioning_priority_policy():
    """PS, a 200 MB layer on a 1 Gbit/s network: whole-tensor FIFO (wfbp) waits for the huge
    layer; a policy that slices it and sends the urgent layers first wins by far."""
    p = planner("ps")
    before = measured(p, HUGE, "ps", "wfbp", 1.0)
    d = p.decide(10, HUGE, "wfbp", {}, p.measurement(), 0.0)
    assert d["switch"], d["reason"]
    assert d["policy"] in ("mercury", "mercury-nopreempt", "bytescheduler", "prophet"), d
    best = dict(d["ranking"])[d["policy"]]
    assert before > 1.3 * best, (before, d["ranking"])
    assert "1 Gbit/s" in d["reason"] or "Gbit/s" in d["reason"]


def test_a_latency_bound_job_of_tiny_layers_picks_a_merging_policy():
    """All-reduce, 40 layers of 256 bytes at 500 us a collective's start: one collective per
    layer (wfbp) pays 40 startups; a policy that merges them into few wins."""
    from quicksilver import auto
    p = planner("allreduce")
    old = auto.LATENCY_US
    auto.LATENCY_US = 500.0
    try:
        before = measured(p, TINY, "allreduce", "wfbp", 10.0)
        d = p.decide(10, TINY, "wfbp", {}, p.measurement(), 0.0)
    finally:
        auto.LATENCY_US = old
    assert d["switch"], d["reason"]
    assert d["policy"] in ("mgwfbp", "mgwfbp-opt", "ddp", "synceasgd"), d
    assert before > 1.2 * dict(d["ranking"])[d["policy"]], (before, d["ranking"])


def test_a_switch_must_pay_for_itself_and_near_ties_are_kept(monkeypatch):
    from quicksilver import auto
    monkeypatch.setattr(auto, "TRIAL_BAND", 0.0)  # no trial (below): the rules without one
    p = planner("ps", replan_every=10)
    measured(p, HUGE, "ps", "wfbp", 1.0)
    d = p.decide(10, HUGE, "wfbp", {}, p.measurement(), 1e9)  # dearer than any gain over 10 passes
    assert not d["switch"] and "less than a switch costs" in d["reason"], d["reason"]
    # The best policy running already: kept, whatever a switch costs.
    p = planner("ps")
    measured(p, HUGE, "ps", "mercury", 1.0)
    d = p.decide(10, HUGE, "mercury", {}, p.measurement(), 0.0)
    assert not d["switch"], d["reason"]
    # Nothing measured since the last decision: kept, saying so.
    p = planner("ps")
    d = p.decide(10, HUGE, "mercury", {}, p.measurement(), 0.0)
    assert not d["switch"] and "no pass measured" in d["reason"]
    # On its thread (start, result): the same decision, on the measurements at start.
    p = planner("ps")
    measured(p, HUGE, "ps", "wfbp", 1.0)
    direct = p.decide(10, HUGE, "wfbp", {}, p.measurement(), 0.0)
    p.start(10, HUGE, "wfbp", {})
    assert p.measurement() is None  # the next window began
    threaded, waited = p.result()
    assert waited >= 0
    for d in (direct, threaded):
        d.pop("decide_ms")
    assert threaded == direct


def test_a_failed_plan_keeps_the_running_policy():
    """The planner's thread failing (here: a simulator that raises) keeps the policy with
    the reason, rather than raising on rank 0 alone while the other ranks wait for it."""
    p = planner("ps")
    measured(p, HUGE, "ps", "wfbp", 1.0)

    class Broken:
        def decide_auto(self, *args):
            raise RuntimeError("simulator exploded")
    p.qs = Broken()
    p.start(10, HUGE, "wfbp", {})
    d, _ = p.result()
    assert not d["switch"] and d["policy"] == "wfbp", d
    assert "the planner failed (RuntimeError: simulator exploded): kept wfbp" in d["reason"], d["reason"]


def test_delayed_updates_are_candidates_only_when_allowed():
    q = qs_module()
    prof = json.dumps(HUGE)
    strict = [r["policy"] for r in q.rank_policies(prof, "allreduce", 4, 4, 1.0, 50.0, "none", False)]
    stale = [r["policy"] for r in q.rank_policies(prof, "allreduce", 4, 4, 1.0, 50.0, "none", True)]
    assert "deft" not in strict and "deft" in stale
    assert "oracle" not in strict + stale


def test_auto_keywords_are_checked():
    import quicksilver.torch as qs
    qs.init()
    model = models.DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="tunes the knobs itself: drop packet_size"):
        qs.DistributedOptimizer(opt, model, policy="auto", packet_size="4KiB")
    with pytest.raises(ValueError, match="cannot use separately started ones"):
        qs.DistributedOptimizer(opt, model, policy="auto", servers="127.0.0.1:1")
    with pytest.raises(ValueError, match="replan_every= applies to policy='auto' only"):
        qs.DistributedOptimizer(opt, model, policy="mercury", replan_every=10)
    with pytest.raises(ValueError, match="allow_stale= applies to policy='auto' only"):
        qs.DistributedOptimizer(opt, model, policy="ddp", allow_stale=True)
    with pytest.raises(ValueError, match="replan_every=0 must be an integer >= 1"):
        qs.DistributedOptimizer(opt, model, policy="auto", replan_every=0)
    with pytest.raises(ValueError, match="give architecture='allreduce' too"):
        qs.DistributedOptimizer(opt, model, policy="auto", allow_stale=True)
    with pytest.raises(ValueError, match="drop one"):
        qs.DistributedOptimizer(opt, model, policy="auto", architecture="allreduce", allow_stale=True,
                                find_unused_parameters=True)
    with pytest.raises(ValueError, match="QS_AUTO_SCHEDULE"):
        from quicksilver import auto
        auto.parse_schedule("three:wfbp")


def test_one_process_auto_trains_as_plain_training():
    """One worker (no launcher), policy="auto" with a decision every 2 steps (each applied
    once its thread is done): the model is the one plain training gives, and the decisions
    are logged in the report (one begun near the end may never be applied)."""
    import quicksilver.torch as qs
    qs.init()
    torch.manual_seed(0)
    model = models.DigitsCNN()
    reference = models.DigitsCNN()
    reference.load_state_dict(model.state_dict())
    opt = qs.DistributedOptimizer(models.optimizer("sgd", model.parameters()), model, policy="auto",
                                  replan_every=2)
    ref_opt = models.optimizer("sgd", reference.parameters())
    x, y = models.data("digits")
    loss_fn = torch.nn.CrossEntropyLoss()
    # 30 steps of about 2 ms each: a decision (about 1 ms on its thread) is applied two or
    # three steps after it began, so at least 3 of the 9 or so fit however the threads are
    # scheduled (12 steps left it to chance: 2 decisions in the CI run of 4836c66).
    for it in range(30):
        xb, yb = models.batch(x, y, it, 0, 1, 8)
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            loss_fn(m(xb), yb).backward()
            o.step()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = opt.shutdown()
    for k, v in reference.state_dict().items():
        assert torch.allclose(state[k], v, atol=1e-6), k
    passes = [(d["pass"], d["applied"]) for d in report["auto"]]
    # Begun at pass 4, then at least 2 passes apart; each applied after the step that saw
    # its thread done (one at least).
    assert passes[0][0] == 4 and len(passes) >= 3, passes
    assert all(a > p for p, a in passes), passes
    assert all(b[0] - a[0] >= 2 and b[0] >= a[1] for a, b in zip(passes, passes[1:])), passes
    assert [(d["pass"], d["applied"]) for d in opt.quicksilver_decisions()] == passes


@pytest.mark.parametrize("architecture,workers,launcher", [("ps", 2, "torchrun"), ("allreduce", 3, "quicksilver")])
def test_every_rank_applies_rank_0s_threaded_decisions_at_the_same_step(build_dir, tmp_path, monkeypatch,
                                                                        architecture, workers, launcher):
    """replan_every=4: each decision is computed on rank 0's thread while training goes on
    and applied at a step every rank learns from rank 0's "ready" broadcast. Every rank logs
    the same decisions, applied at the same passes; the parameters equal one process trained
    on the concatenated batches (check_consistency=1 on). QS_AUTO_SCHEDULE makes the picks
    (from pass 6 one policy, from pass 14 another) so that two switches happen."""
    import test_torch
    second = {"ps": "bytescheduler", "allreduce": "mgwfbp"}[architecture]
    monkeypatch.setenv("QS_AUTO_SCHEDULE", "6:{},14:wfbp".format(second))
    iterations, per_worker = 24, 8
    p, took = test_torch.launch(build_dir, launcher, workers,
                                ["--model", "digits", "--policies", "auto", "--iterations", str(iterations),
                                 "--batch", str(per_worker), "--out", str(tmp_path), "--architecture", architecture,
                                 "--knobs", json.dumps({"replan_every": 4})], 300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    test_torch.check_equal(str(tmp_path), ["auto"], "sgd", "digits", workers, per_worker, iterations)
    logs = []
    for r in range(workers):
        report = json.load(open(os.path.join(str(tmp_path), "auto-sgd-{}.json".format(r))))["report"]
        logs.append([(d["pass"], d["applied"], d["policy"], d["switch"]) for d in report["auto"]])
    assert all(log == logs[0] for log in logs), logs
    assert [policy for _, _, policy, switch in logs[0] if switch] == [second, "wfbp"], logs[0]
    assert all(applied > begun for begun, applied, _, _ in logs[0]), logs[0]


@pytest.mark.parametrize("later_faster", [True, False])
def test_near_ties_are_measured_in_turn_and_the_fastest_measured_is_kept(later_faster):
    """A decision whose top candidates are predicted within TRIAL_BAND of each other runs
    each a few passes (a trial: every step of it a decision of its own, "next_in" passes
    apart) and keeps the fastest measured, whatever the simulator's order (switching back to
    it when it is not the last one run); the same near-tie at about the same rate is not
    measured again."""
    from quicksilver import auto
    # A network where the PS policies are near-ties: HUGE at 10 Gbit/s.
    p = planner("ps", replan_every=200)
    measured(p, HUGE, "ps", "mercury", 10.0)
    d = p.decide(10, HUGE, "mercury", {}, p.measurement(), 1.0)
    assert d["switch"] and "trial" in d and d["next_in"] == auto.WARMUP_PASSES + auto.TRIAL_PASSES, d["reason"]
    names = d["trial"]["set"]
    assert 2 <= len(names) <= auto.TRIAL_MAX and "measuring each" in d["reason"], d
    # Each candidate then measures: make the last one the fastest, the simulator's order aside.
    times = {}
    step = 20
    while "trial" in d:
        p.decided(d)
        key = auto.candidate_key(d["policy"], d["knobs"], "ps")
        times[key] = 100.0 - len(times) if later_faster else 100.0 + len(times)
        m = (50.0, times[key], 8)
        d = p.decide(step, HUGE, d["policy"], d["knobs"], m, 1.0, p.trial, p.trialled)
        step += 10
    p.decided(d)
    fastest = min(times, key=times.get)
    assert auto.candidate_key(d["policy"], d["knobs"], "ps") == fastest, (d, times)
    assert sorted(times) == sorted(k for k in names if k != auto.candidate_key("mercury", {}, "ps")), (times, names)
    assert p.trialled is not None and "trial: measured" in d["reason"]
    # What each candidate measured goes with the trial's record, in its candidates' order
    # (the running one, measured before the trial's switches, among them).
    names, _, pick, pick_ms, each_ms = p.trialled
    assert len(each_ms) == len(names) and each_ms[names.index(pick)] == pick_ms, p.trialled
    assert all(each_ms[names.index(k)] == v for k, v in times.items()), (p.trialled, times)
    assert all(v > 0 for v in each_ms), p.trialled
    with pytest.raises(ValueError, match="one time per trialled candidate"):
        qs_module().decide_auto(json.dumps(HUGE), "ps", 4, 4, 50.0, "none", "mercury", {}, 100.0, 1.0, 200,
                                False, names, 10.0, pick, pick_ms, each_ms[:-1])
    assert d["switch"] != later_faster and "next_in" not in d, d  # back to the pick when not last
    # The same near-tie at about the same rate: not measured again, the trial's pick kept.
    q = planner("ps", replan_every=200)
    measured(q, HUGE, "ps", d["policy"], 10.0)
    again = q.decide(400, HUGE, d["policy"], d["knobs"], q.measurement(), 1.0, None, p.trialled)
    assert "trial" not in again and not again["switch"], again["reason"]


def test_a_noisy_trial_measurement_runs_on_until_it_can_tell_the_candidates_apart(monkeypatch):
    """A trial compares medians of a few passes; on a busy host a short pass varies by
    more than the near-tie's band. While the running candidate's median is too noisy
    (its relative standard error above TRIAL_PRECISION) it runs on and its passes are
    measured together, up to TRIAL_MAX_PASSES; a quiet one is compared at once."""
    from quicksilver import auto
    monkeypatch.setattr(auto, "TRIAL_MAX_SECONDS", 1e3)  # HUGE's passes last 0.2 s: passes bound it
    assert auto.noise([10.0] * 8) == 0.0 and auto.noise([10.0]) == 0.0
    noisy = [6.0, 20.0, 9.0, 16.0, 11.0, 24.0, 8.0, 14.0]
    assert auto.noise(noisy) > auto.TRIAL_PRECISION
    assert auto.noise(noisy * 8) < auto.noise(noisy) / 2.5  # falls as 1 / sqrt(passes)

    def feed(p, first, spans):
        for i, s in enumerate(spans):
            p.record(first + i, s, 1.0)

    p = planner("ps", replan_every=200)
    measured(p, HUGE, "ps", "mercury", 10.0)  # quiet: the trial begins with a switch
    quiet = p.decide(10, HUGE, "mercury", {}, p.measurement(), 1.0)
    assert quiet["switch"] and "extend" not in quiet, quiet["reason"]
    # The same near-tie with the running policy's passes spread around the same median: it
    # runs on first, no switch, and the passes it ran stay measured.
    p = planner("ps", replan_every=200)
    iteration = measured(p, HUGE, "ps", "mercury", 10.0, passes=0)
    spans = [iteration * f for f in (0.6, 1.4, 0.8, 1.25, 1.0, 1.5, 0.7, 1.1, 1.0)]
    feed(p, auto.WARMUP_PASSES + 1, spans)
    p.start(10, HUGE, "mercury", {})
    d, _ = p.result()
    assert not d["switch"] and d["extend"] and d["next_in"] == len(spans), d["reason"]
    assert "measuring {} more".format(len(spans)) in d["reason"] and d["trial"]["results"] == {}, d
    p.decided(d)
    assert p.measurement()[2] == len(spans)  # the passes before the decision are kept
    # It runs on until TRIAL_MAX_PASSES, then the trial goes on with the next candidate.
    n = 10
    while True:
        n += d["next_in"]
        feed(p, n - d["next_in"], (spans * 8)[:d["next_in"]])
        p.start(n, HUGE, "mercury", {})
        d, _ = p.result()
        p.decided(d)
        if not d.get("extend"):
            break
        assert d["next_in"] >= 1 and p.measurement()[2] < auto.TRIAL_MAX_PASSES, d["reason"]
    assert d["switch"] and "trial" in d and len(d["trial"]["results"]) == 1, d
    key = auto.candidate_key("mercury", {}, "ps")
    assert key in d["trial"]["results"] and "trial: measured" in d["reason"], d
