"""policy="auto" (issue 30): the job measures itself and picks its own policy.

Rank 0 times each training pass (from the forward pass's start to the backward pass's
end) and, inside it, the time the forward pass waited at its gates for the last pass's
sums (Session.enter_forward): the wait is the communication the compute did not hide, the
rest is compute (updates applied in the forward pass included). At each decision point
(every rank reaches it at the same step(): the passes are counted alike everywhere):

1. the profile measured at the first pass is scaled to the compute measured since the
   last decision (per-layer shares kept);
2. the network is the rate at which the simulator predicts the measured iteration time
   for the policy that ran (secant steps on the time per bit: the prediction falls as the
   rate grows). The simulator was checked against the runtime (docs/simulator.md); what
   it does not model of this machine is absorbed into this effective rate;
3. every policy of the job's architecture is ranked on that network with its knobs tuned
   (quicksilver advise, without its sweep: _quicksilver.rank_policies);
4. the job switches when the best is predicted faster than the running one by more than
   MIN_GAIN of an iteration and, over the passes until the next decision, by more than
   the measured cost of a switch (the last switch's; before the first, the time the
   first session took to start);
5. when several candidates are predicted within TRIAL_BAND of the best (a near-tie, where
   what the simulator does not model decides), the job measures them instead: each runs
   a few passes in turn (a trial), and the fastest measured is kept.

Rank 0 decides on a thread of its own while training goes on (the simulator releases the
GIL). Each step it tells every rank whether the decision is ready (a one-int broadcast that
is waited for a step later, so nobody waits), and at the step after it is, broadcasts it
over torch.distributed. Every rank switches at that same step(): the session is closed
once every update of the steps taken is applied (nothing in flight: no gradient lost or
applied twice), and a new one is opened with the new policy on the same gradient buffers.
Deterministic: decide() is a function of the measurements (and the simulator is
deterministic); when the step applies it depends on the thread's time, the same on every
rank.

Policies that delay updates (DeFT) are candidates only with allow_stale=True: they apply
updates of several iterations late and merged, which changes the optimisation.

QS_AUTO_SCHEDULE="PASS:POLICY[/KNOB=VALUE...],..." (tests, as QS_FORCE_STAGING) replaces
rank 0's planner by a fixed schedule ("4:bytescheduler,6:deft/deft_horizon=3": from pass 4
on bytescheduler, from pass 6 on DeFT; a decision begun at pass n picks the entry of the
greatest PASS <= n, and keeps the running policy before the first), so that a test can
switch at passes of its choosing through the same broadcast and switch."""

# Steps 2 to 5 are qs::decide_auto's (include/sim/quicksilver/sim/auto_planner.h, through
# _quicksilver.decide_auto), the rules `quicksilver run --policy auto` decides by between
# the phases of its synthetic runtime; this module measures, scales the profile, and keeps
# a trial's bookkeeping (which candidate runs next, what each measured).

import json
import os
import statistics
import threading
import time

from . import _quicksilver as _qs

# The policy a job starts with, measured to decide the first time: the architecture's
# reference (docs/pytorch.md).
START_POLICY = {"ps": "mercury", "allreduce": "ddp"}
# The one-way latency the planner assumes: the rate is the one unknown the measured
# iteration time can determine; a loopback or LAN hop is tens of microseconds.
LATENCY_US = 50.0
# The rates the search for the effective rate spans (Gbit/s).
GBPS_RANGE = _qs.AUTO_GBPS_RANGE
# A switch must gain at least this share of the running policy's predicted iteration
# (near-ties, such as mercury and mercury-nopreempt on a fast network, are not switched).
MIN_GAIN = _qs.AUTO_MIN_GAIN
# Passes after a session opens that are not measured (connections warm up, first sums).
WARMUP_PASSES = 2
# Passes measured before the first decision (fewer when replan_every is smaller).
FIRST_WINDOW = 8
DEFAULT_REPLAN_EVERY = 200
# Near-ties are measured, not guessed (the simulator ranks; the job's own passes decide):
# the candidates predicted within TRIAL_BAND of the best, at most TRIAL_MAX, each run for
# WARMUP_PASSES + TRIAL_PASSES passes, when their switches (and the one back to the pick)
# cost at most TRIAL_BUDGET of the passes until the next decision. Not again for
# candidates measured at about the same rate.
TRIAL_BAND = _qs.AUTO_TRIAL_BAND
TRIAL_MAX = _qs.AUTO_TRIAL_MAX
TRIAL_PASSES = 8
TRIAL_BUDGET = _qs.AUTO_TRIAL_BUDGET
# A trial's measurement must tell candidates TRIAL_BAND apart: while its median's relative
# standard error (measurement()'s noise) is above TRIAL_PRECISION, the candidate runs on
# and its passes are measured together, up to TRIAL_MAX_PASSES passes and
# TRIAL_MAX_SECONDS of them. A short iteration on a busy host varies most: the digits CNN
# on gloo, 4 processes on 2 cores, measured 5 to 25 ms a pass around a median of 13 ms
# (docs/benchmarks.md, policy="auto" (a)), a median of 8 passes +- 15 %, where the
# candidates lay 5 to 10 % apart.
TRIAL_PRECISION = 0.02
TRIAL_MAX_PASSES = 32
TRIAL_MAX_SECONDS = 2.0


def first_decision(replan_every):
    """The pass of the first decision: after the warm-up and a first window."""
    return WARMUP_PASSES + min(FIRST_WINDOW, replan_every)


def describe(d):
    """A decision's policy and knobs in words: "bytescheduler (partition_size 4MiB)"."""
    knobs = ", ".join("{} {}".format(k, v) for k, v in sorted(d["knobs"].items()))
    return "{} ({})".format(d["policy"], knobs) if knobs else d["policy"]


def candidate_key(policy, knobs, architecture):
    """A candidate as the decisions name it: "bytescheduler partition_size=64KiB
    credit_size=4MiB" (the policy and the knobs advise tunes for it)."""
    return _qs.auto_candidate(policy, knobs, architecture)


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


def noise(values):
    """The relative standard error of the median of `values`: 1.2533 sigma / sqrt(n) / median,
    sigma estimated robustly (1.4826 times the median absolute deviation); 0 for fewer
    than 2 values or a median of 0."""
    m = statistics.median(values) if values else 0.0
    if len(values) < 2 or m <= 0:
        return 0.0
    sigma = 1.4826 * statistics.median(abs(v - m) for v in values)
    return 1.2533 * sigma / len(values) ** 0.5 / m


def effective_gbps(predict, iteration_ms):
    """The rate (Gbit/s) at which predict(gbps) (ms, falling as gbps grows) equals
    iteration_ms within 0.2 %, clamped to GBPS_RANGE (qs::effective_rate: secant steps on
    the time per bit, bisection where they leave the bracket)."""
    return _qs.effective_gbps(predict, iteration_ms)


def _more_passes(iteration_ms, passes, spread):
    """How many more passes a trial's candidate runs before it is compared: 0 when its
    median is precise enough (TRIAL_PRECISION) or it ran TRIAL_MAX_PASSES passes or
    TRIAL_MAX_SECONDS; else as many again as it ran, within those bounds."""
    if spread <= TRIAL_PRECISION or passes >= TRIAL_MAX_PASSES or passes * iteration_ms >= TRIAL_MAX_SECONDS * 1e3:
        return 0
    by_time = int(TRIAL_MAX_SECONDS * 1e3 / max(iteration_ms, 1e-3)) - passes
    return max(1, min(passes, TRIAL_MAX_PASSES - passes, by_time))


def _measuring_on(key, iteration_ms, passes, spread, more):
    return "{} measured {:.2f} ms +- {:.0f} % over {} passes: measuring {} more".format(
        key, iteration_ms, 100 * spread, passes, more)


class Planner:
    """Rank 0's measurements and the decisions (see the module's comment). A decision is
    computed on a thread of its own (the simulator releases the GIL) while training goes
    on (start, ready, result)."""

    def __init__(self, qs, architecture, workers, servers, compression, allow_stale, replan_every):
        self.qs = qs
        self.architecture = architecture
        self.workers = workers
        self.servers = servers
        self.compression = compression
        self.allow_stale = allow_stale
        self.replan_every = replan_every
        self.spans = []          # (pass, span_ms, wait_ms) since the last decision began
        self.measure_from = WARMUP_PASSES + 1  # the first pass measured
        self.switch_cost_ms = None
        self.schedule = parse_schedule(os.environ.get("QS_AUTO_SCHEDULE", ""))
        self.thread = None
        self.outcome = None
        self.window = []       # the passes the decision begun last measured
        self.trial = None      # a trial in progress (decide()'s "trial")
        self.trialled = None   # the last trial's candidates, rate, pick, its time and each one's

    def record(self, n, span_ms, wait_ms):
        if n >= self.measure_from:
            self.spans.append((n, span_ms, wait_ms))

    def measurement(self):
        """(compute_ms, iteration_ms, passes, noise) over the passes measured since the last
        decision began (with those of a trial's candidate that runs on): medians, and the
        iteration median's relative standard error (noise()); None when none was measured."""
        if not self.spans:
            return None
        spans = [s for _, s, _ in self.spans]
        return (statistics.median(s - w for _, s, w in self.spans), statistics.median(spans), len(spans),
                noise(spans))

    def start(self, n, profile, policy, knobs):
        """Begins the decision of pass n on a thread, on the measurements so far (the next
        window starts now)."""
        args = (n, profile, policy, dict(knobs), self.measurement(), self.switch_cost_ms or 0.0, self.trial,
                self.trialled)
        self.window = self.spans  # measured on when the decision runs the candidate on (decided())
        self.spans = []

        def run():
            try:
                self.outcome = self.decide(*args)
            except Exception as e:  # the job trains on with what it runs (every rank waits for
                # this decision: raising on rank 0 alone would leave them waiting)
                self.outcome = {"pass": n, "from": policy, "policy": policy, "knobs": dict(knobs),
                                "switch": False, "reason": "the planner failed ({}: {}): kept {}".format(
                                    type(e).__name__, e, policy)}
        self.thread = threading.Thread(target=run, name="quicksilver-auto", daemon=True)
        self.thread.start()

    def ready(self):
        """Whether the decision begun by start() is done (result() will not wait)."""
        return self.thread is not None and not self.thread.is_alive()

    def result(self):
        """The decision begun by start(), waited for; (decision, ms waited)."""
        start = time.perf_counter()
        self.thread.join()
        self.thread = None
        return self.outcome, (time.perf_counter() - start) * 1e3

    def decide(self, n, profile, policy, knobs, m, cost, trial=None, trialled=None):
        """The decision at pass n (a dict: what the log and every rank get): a pure
        function of its arguments (the measurement m: measurement(); cost: a switch's, ms;
        trial and trialled: the planner's, as decided() left them). A decision may ask for
        the next one sooner ("next_in" passes after it is applied: a trial's run)."""
        start = time.perf_counter()
        d = {"pass": n, "from": policy, "policy": policy, "knobs": dict(knobs), "switch": False}
        if self.schedule is not None:
            at = [k for k in self.schedule if k <= n]
            forced, forced_knobs = self.schedule[max(at)] if at else (None, {})
            if forced is not None and (forced, forced_knobs) != (policy, knobs):
                d.update(policy=forced, knobs=forced_knobs, switch=True)
            d["reason"] = "QS_AUTO_SCHEDULE " + ("switches to " + forced if d["switch"] else "keeps " + policy)
            return d
        if m is None:
            d["reason"] = "no pass measured since the last decision"
            return d
        compute_ms, iteration_ms, passes = m[:3]
        spread = m[3] if len(m) > 3 else 0.0
        if trial is not None:
            return self._trial_step(d, policy, knobs, (iteration_ms, passes, spread), trial, start)
        r = self.qs.decide_auto(json.dumps(scaled_profile(profile, compute_ms)), self.architecture, self.workers,
                                self.servers, LATENCY_US, self.compression, policy, knobs, iteration_ms, cost,
                                self.replan_every, self.allow_stale, *(trialled or ([], 0.0, "", 0.0, [])),
                                MIN_GAIN, TRIAL_BAND, TRIAL_MAX, TRIAL_BUDGET)
        d.update(measured={"compute_ms": compute_ms, "iteration_ms": iteration_ms, "passes": passes},
                 network_gbps=r["network_gbps"], predicted_ms=r["predicted_ms"],
                 ranking=[(x["policy"], x["iteration_ms"]) for x in r["ranking"][:4]], switch_cost_ms=cost,
                 reason=r["reason"])
        if r["trial"]:
            # A near-tie: each candidate runs in turn (the running one is measured already).
            queue = [[x["policy"], dict(x["knobs"])] for x in r["trial"]]
            current = candidate_key(policy, knobs, self.architecture)
            candidates = {candidate_key(p, k, self.architecture): [p, k] for p, k in queue}
            candidates[current] = [policy, dict(knobs)]
            trial = {"queue": queue, "results": {}, "set": sorted(r["near"]), "gbps": r["network_gbps"],
                     "candidates": candidates}
            more = _more_passes(iteration_ms, passes, spread)
            if more:  # the running one's measurement is too noisy to compare: it runs on first
                d.update(trial=trial, next_in=more, extend=True)
                d["reason"] += "; {} first".format(_measuring_on(current, iteration_ms, passes, spread, more))
            else:
                trial["results"][current] = iteration_ms
                d.update(policy=queue[0][0], knobs=queue[0][1], switch=True, trial=dict(trial, queue=queue[1:]),
                         next_in=WARMUP_PASSES + TRIAL_PASSES)
        elif r["change"]:
            d.update(policy=r["next"]["policy"], knobs=dict(r["next"]["knobs"]), switch=True)
        d["decide_ms"] = (time.perf_counter() - start) * 1e3
        return d

    def _trial_step(self, d, policy, knobs, m, trial, start):
        """A trial's decision: the running candidate runs on while its measurement m
        (iteration_ms, passes, noise) is too noisy (_more_passes); else its measurement in,
        then the next candidate, or, all measured, the fastest."""
        iteration_ms, passes, spread = m
        key = candidate_key(policy, knobs, self.architecture)
        more = _more_passes(iteration_ms, passes, spread)
        if more:
            d.update(trial=trial, next_in=more, extend=True, measured={"iteration_ms": iteration_ms},
                     reason="trial: " + _measuring_on(key, iteration_ms, passes, spread, more))
            d["decide_ms"] = (time.perf_counter() - start) * 1e3
            return d
        results = dict(trial["results"])
        results[key] = iteration_ms
        queue = [list(c) for c in trial["queue"]]
        measured = ", ".join("{} {:.2f} ms".format(k, v) for k, v in sorted(results.items(), key=lambda kv: kv[1]))
        if queue:
            d.update(policy=queue[0][0], knobs=dict(queue[0][1]), switch=True,
                     trial=dict(trial, queue=queue[1:], results=results), next_in=WARMUP_PASSES + TRIAL_PASSES)
            d["reason"] = "trial: measured {}; next {}".format(measured,
                                                                 candidate_key(*queue[0], self.architecture))
        else:
            best = min(results, key=results.get)
            # Every candidate measured (the running one too, near or not): its pick stays
            # "measured" at the next decisions while the near set stays within them.
            # (what each measured too: one measured slower than the pick runs now, while the
            # pick runs no faster than then, is not taken on a prediction: auto_planner.h)
            names = sorted(trial["candidates"])
            d["trialled"] = [names, trial["gbps"], best, results[best], [results.get(c, 0.0) for c in names]]
            if best != candidate_key(policy, knobs, self.architecture):
                # Not measured again sooner than the next decision, although a fresh session
                # of the same policy can run slower than the trial's did (the digits CNN on
                # gloo: mgwfbp measured 3.7 ms in a trial, then 11.8 ms a pass for 200
                # passes): a check of 10 passes, as noisy as the trial's first 8, started new
                # trials inside the window and cost more than it saved (docs/benchmarks.md).
                p, k = trial["candidates"][best]
                d.update(policy=p, knobs=dict(k), switch=True)
            d["reason"] = "trial: measured {}: {} {}".format(
                measured, "switched to" if d["switch"] else "kept", best)
        d["measured"] = {"iteration_ms": iteration_ms}
        d["decide_ms"] = (time.perf_counter() - start) * 1e3
        return d

    def decided(self, d):
        """After decision d is applied (rank 0): the trial it began, continued or ended; a
        candidate that runs on is measured on, its passes so far kept."""
        self.trial = d.get("trial")
        if d.get("extend"):
            self.spans = self.window + self.spans
        if "trialled" in d:
            self.trialled = d["trialled"]

    def switched(self, n, switch_ms):
        """A switch at pass n took switch_ms: the next window starts after its warm-up."""
        self.spans = []
        self.measure_from = n + WARMUP_PASSES + 1
        self.switch_cost_ms = switch_ms
