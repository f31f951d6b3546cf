"""policy="auto" (issue 30): the job measures itself and picks its own policy.

Rank 0 times each training pass (from the forward pass's start to the backward pass's
end) and, inside it, the time the forward pass waited at its gates for the last pass's
sums (Session.enter_forward): the wait is the communication the compute did not hide, the
rest is compute (updates applied in the forward pass included). At each decision point
(every rank reaches it at the same step(): the passes are counted alike everywhere):

1. the profile measured at the first pass is scaled to the compute measured since the
   last decision (per-layer shares kept);
2. the network is the rate at which the simulator predicts the measured iteration time
   for the policy that ran (a bisection on the rate: the prediction falls as the rate
   grows). The simulator was checked against the runtime (docs/simulator.md); what it
   does not model of this machine is absorbed into this effective rate;
3. every policy of the job's architecture is ranked on that network with its knobs tuned
   (quicksilver advise, without its sweep: _quicksilver.rank_policies);
4. the job switches when the best is predicted faster than the running one by more than
   MIN_GAIN of an iteration and, over the passes until the next decision, by more than
   the measured cost of a switch (the last switch's; before the first, the time the
   first session took to start).

Rank 0 decides and broadcasts the decision over torch.distributed; every rank switches at
the same step(): the session is closed once every update of the steps taken is applied
(nothing in flight: no gradient lost or applied twice) and a new one opened with the new
policy on the same gradient buffers. Deterministic: decide() is a function of the
measurements (and the simulator is deterministic).

Policies that delay updates (DeFT) are candidates only with allow_stale=True: they apply
updates of several iterations late and merged, which changes the optimisation.

QS_AUTO_SCHEDULE="PASS:POLICY[/KNOB=VALUE...],..." (tests, as QS_FORCE_STAGING) replaces
rank 0's planner by a fixed schedule ("4:bytescheduler,6:deft/deft_horizon=3": switch at
those passes, keep elsewhere), so that a test can switch at passes of its choosing through
the same broadcast and switch."""

import json
import math
import os
import statistics
import time

# The policy a job starts with, measured to decide the first time: the architecture's
# reference (docs/pytorch.md).
START_POLICY = {"ps": "mercury", "allreduce": "ddp"}
# The one-way latency the planner assumes: the rate is the one unknown the measured
# iteration time can determine; a loopback or LAN hop is tens of microseconds.
LATENCY_US = 50.0
# The rates the bisection searches (Gbit/s).
GBPS_RANGE = (0.01, 400.0)
# A switch must gain at least this share of the running policy's predicted iteration
# (near-ties, such as mercury and mercury-nopreempt on a fast network, are not switched).
MIN_GAIN = 0.02
# Passes after a session opens that are not measured (connections warm up, first sums).
WARMUP_PASSES = 2
# Passes measured before the first decision (fewer when replan_every is smaller).
FIRST_WINDOW = 8
DEFAULT_REPLAN_EVERY = 200


def first_decision(replan_every):
    """The pass of the first decision: after the warm-up and a first window."""
    return WARMUP_PASSES + min(FIRST_WINDOW, replan_every)


def describe(d):
    """A decision's policy and knobs in words: "bytescheduler (partition_size 4MiB)"."""
    knobs = ", ".join("{} {}".format(k, v) for k, v in sorted(d["knobs"].items()))
    return "{} ({})".format(d["policy"], knobs) if knobs else d["policy"]


def parse_schedule(text):
    """QS_AUTO_SCHEDULE's "PASS:POLICY[/KNOB=VALUE...],..." as {pass: (policy, knobs)};
    None when empty."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        n, _, spec = item.partition(":")
        policy, *pairs = spec.strip().split("/")
        knobs = dict(pair.partition("=")[::2] for pair in pairs)
        if not n.strip().isdigit() or not policy or any(not k or not v for k, v in knobs.items()):
            raise ValueError("QS_AUTO_SCHEDULE={!r}: give PASS:POLICY[/KNOB=VALUE...],... (e.g. "
                             "4:bytescheduler,6:deft/deft_horizon=3)".format(text))
        out[int(n)] = (policy, knobs)
    return out


def scaled_profile(profile, compute_ms):
    """`profile` (DESIGN.md's format) with every layer's forward and backward times
    scaled so that their sum is `compute_ms`."""
    total = sum(l["forward_ms"] + l["backward_ms"] for l in profile["layers"])
    f = compute_ms / total if total > 0 else 1.0
    out = dict(profile)
    out["layers"] = [dict(l, forward_ms=l["forward_ms"] * f, backward_ms=l["backward_ms"] * f)
                     for l in profile["layers"]]
    return out


def effective_gbps(predict, iteration_ms):
    """The rate (Gbit/s) at which predict(gbps) (ms, falling as gbps grows) equals
    iteration_ms, clamped to GBPS_RANGE; 24 bisection steps on the log of the rate."""
    lo, hi = math.log(GBPS_RANGE[0]), math.log(GBPS_RANGE[1])
    if predict(math.exp(hi)) >= iteration_ms:
        return GBPS_RANGE[1]  # compute-bound: no rate explains more
    if predict(math.exp(lo)) <= iteration_ms:
        return GBPS_RANGE[0]
    for _ in range(24):
        mid = (lo + hi) / 2
        if predict(math.exp(mid)) > iteration_ms:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


class Planner:
    """Rank 0's measurements and the decisions (see the module's comment)."""

    def __init__(self, qs, architecture, workers, servers, compression, allow_stale, replan_every):
        self.qs = qs
        self.architecture = architecture
        self.workers = workers
        self.servers = servers
        self.compression = compression
        self.allow_stale = allow_stale
        self.replan_every = replan_every
        self.spans = []          # (pass, span_ms, wait_ms) since the last decision
        self.measure_from = WARMUP_PASSES + 1  # the first pass measured
        self.switch_cost_ms = None
        self.schedule = parse_schedule(os.environ.get("QS_AUTO_SCHEDULE", ""))

    def record(self, n, span_ms, wait_ms):
        if n >= self.measure_from:
            self.spans.append((n, span_ms, wait_ms))

    def measurement(self):
        """(compute_ms, iteration_ms, passes) over the passes measured since the last
        decision: medians, or None when none was measured."""
        if not self.spans:
            return None
        return (statistics.median(s - w for _, s, w in self.spans), statistics.median(s for _, s, _ in self.spans),
                len(self.spans))

    def decide(self, n, profile, policy, knobs):
        """The decision at pass n (a dict: what the log and every rank get); a pure
        function of the measurements, the profile and the running policy."""
        start = time.perf_counter()
        m = self.measurement()
        d = {"pass": n, "from": policy, "policy": policy, "knobs": dict(knobs), "switch": False}
        if self.schedule is not None:
            forced, forced_knobs = self.schedule.get(n, (None, {}))
            if forced is not None and (forced, forced_knobs) != (policy, knobs):
                d.update(policy=forced, knobs=forced_knobs, switch=True)
            d["reason"] = "QS_AUTO_SCHEDULE " + ("switches to " + forced if d["switch"] else "keeps " + policy)
            return d
        if m is None:
            d["reason"] = "no pass measured since the last decision"
            return d
        compute_ms, iteration_ms, passes = m
        prof = json.dumps(scaled_profile(profile, compute_ms))
        args = (prof, self.architecture, self.workers, self.servers)

        def predict(gbps, p=policy, k=knobs):
            return self.qs.predict(*args, gbps, LATENCY_US, self.compression, p, k)

        gbps = effective_gbps(predict, iteration_ms)
        ranking = self.qs.rank_policies(*args, gbps, LATENCY_US, self.compression, self.allow_stale)
        now_ms = predict(gbps)
        best = ranking[0]
        gain = now_ms - best["iteration_ms"]
        cost = self.switch_cost_ms or 0.0
        d.update(measured={"compute_ms": compute_ms, "iteration_ms": iteration_ms, "passes": passes},
                 network_gbps=gbps, predicted_ms=now_ms,
                 ranking=[(r["policy"], r["iteration_ms"]) for r in ranking[:4]], switch_cost_ms=cost)
        same = best["policy"] == policy and best["knobs"] == {k: v for k, v in knobs.items() if k in best["knobs"]}
        if same:
            d["reason"] = "{} is still predicted fastest ({:.2f} ms)".format(policy, now_ms)
        elif gain <= MIN_GAIN * now_ms:
            d["reason"] = "{} is predicted {:.2f} ms faster, under {:.0%} of an iteration: kept {}".format(
                best["policy"], gain, MIN_GAIN, policy)
        elif gain * self.replan_every <= cost:
            d["reason"] = ("{} is predicted {:.2f} ms an iteration faster, {:.0f} ms over the next {} passes, "
                           "less than a switch costs ({:.0f} ms): kept {}").format(
                               best["policy"], gain, gain * self.replan_every, self.replan_every, cost, policy)
        else:
            d.update(policy=best["policy"], knobs=dict(best["knobs"]), switch=True)
            d["reason"] = ("measured {:.2f} ms an iteration ({:.2f} compute) under {}: the network is about "
                           "{:.3g} Gbit/s, where {} is predicted {:.2f} ms against {:.2f}").format(
                               iteration_ms, compute_ms, policy, gbps, best["policy"], best["iteration_ms"], now_ms)
        d["decide_ms"] = (time.perf_counter() - start) * 1e3
        return d

    def decided(self, n, switched, switch_ms=None):
        """After the decision at pass n (on rank 0): what is measured for the next one."""
        self.spans = []
        if switched:
            self.measure_from = n + WARMUP_PASSES + 1
            self.switch_cost_ms = switch_ms
