// policy="auto"'s decision (issue 30, item 2): the one rule set of `quicksilver run
// --policy auto` and of DistributedOptimizer(policy="auto"), whose planner
// (python/quicksilver/auto.py) measures the training script and keeps a trial's
// bookkeeping, and calls decide_auto through the module. The job measures its iteration
// time under the policy it runs; the network is the rate at which the simulator predicts
// that time for that policy; every policy of the architecture is ranked there (advise(),
// without its sweep); and the job switches when the best is predicted faster by more than
// kAutoMinGain of an iteration and, over the iterations until the next decision, by more
// than a switch costs. Candidates predicted within kAutoTrialBand of the best are measured
// in turn instead (a trial). No clock, no socket: a function of its arguments (and the
// deterministic simulator).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/sim/advisor.h"

namespace qs {

// The policy a job starts with, per architecture (python/quicksilver/auto.py START_POLICY).
std::string auto_start_policy(Architecture a);
// A candidate in words, as the log and a trial's record name it: the policy and the knobs
// advise() tunes for it (tuned_knobs()), "bytescheduler partition_size=64KiB
// credit_size=4MiB"; two candidates are the same when their names are.
std::string auto_candidate(const std::string& policy, const PolicyOptions& options,
                           Architecture architecture);
// The rules' thresholds (AutoOptions' defaults; python/quicksilver/auto.py reads them from
// the module). A switch must gain more than kAutoMinGain of the running policy's predicted
// iteration. Candidates predicted within kAutoTrialBand of the best are a near-tie:
// measured, not guessed, at most kAutoTrialMax of them, and only when their switches cost
// at most kAutoTrialBudget of the iterations until the next decision.
inline constexpr double kAutoMinGain = 0.02;
inline constexpr double kAutoTrialBand = 0.05;
inline constexpr int kAutoTrialMax = 3;
inline constexpr double kAutoTrialBudget = 0.1;
struct AutoOptions {
  double min_gain = kAutoMinGain;
  double trial_band = kAutoTrialBand;
  int trial_max = kAutoTrialMax;
  double trial_budget = kAutoTrialBudget;
  int threads = 2;  // simulations at once (a training script's planner: 1, beside training)
};
// A near-tie is measured already when the last trial measured it at a rate within this
// factor of today's (either way), or when the trial's pick runs and measures within this
// factor of what it measured then: re-measuring it would only chase the estimate's noise
// with switches. (The second: a small model's effective rate is ill-conditioned, its
// iteration mostly per-message costs; the digits CNN's moved 1.3 to 1.5x between decisions
// while its iteration moved 15 %.)
inline constexpr double kAutoTrialRateBand = 1.25;
// The rates the effective rate is searched over.
inline constexpr Rate kAutoSlowest{10'000'000};
inline constexpr Rate kAutoFastest{400'000'000'000};

// The rate at which predict(rate) (falling as the rate grows) is `measured` within 0.2 %,
// clamped to [kAutoSlowest, kAutoFastest]: secant steps on the time per bit from 10 and 1
// Gbit/s (an exposed communication makes an iteration nearly linear in it), bisection on
// its log where a step leaves the bracket or the prediction is flat. Errors: predict's.
Result<Rate> effective_rate(const std::function<Result<TimeNs>(Rate)>& predict, TimeNs measured);

// The last trial: every candidate it measured (auto_candidate names, the running one
// too), the effective rate of the decision that began it, the candidate it kept with what
// that measured, and what each candidate measured (as `candidates`; empty or 0: not known).
struct AutoTrialled {
  std::vector<std::string> candidates;
  Rate network{0};
  std::string pick;
  TimeNs pick_measured = 0;
  std::vector<TimeNs> measured;
};

struct AutoDecision {
  Rate network{0};                     // the effective rate
  TimeNs predicted = 0;                // the running policy's prediction there
  std::vector<AdvisedPolicy> ranking;  // there, best first
  // What runs next: the running policy (kept), the best (a switch), or, for a near-tie,
  // the candidates to measure in turn (trial: the running one not among them).
  bool change = false;
  AdvisedPolicy next;
  std::vector<AdvisedPolicy> trial;
  std::vector<std::string> near;  // the near-tie's candidates (auto_candidate), best first
  std::string reason;             // in words, for the log
};

// The decision after an iteration time of `measured` under `running` with `options` on
// `job` (its cluster's rate is replaced by the effective one), where a switch costs
// `switch_cost` and the next decision comes `horizon` iterations later. The rules, in
// order: a near-tie of at least two candidates not measured already (`trialled`, at about
// this rate, or with every other candidate measured slower than the running pick measures
// now) is a trial, when affordable (while the trial holds and its pick runs, of the
// candidates it did not measure only); the last trial's pick of this near-tie is kept
// when it runs, or taken back when it does not and the running one measures slower than
// the pick did; the best running already is kept; so is the running one when the best is a
// candidate the trial measured slower than the running one measures now, which measures
// no faster than in that trial (or slower than the trial's pick, which runs); while the
// trial's pick runs and measures as it did, with only the rate's estimate moved, candidates
// near only at the new estimate are not measured, and a gain inside the near-tie's band
// keeps the running policy; a gain under
// min_gain of an iteration, or under a switch's cost over the horizon, keeps the running
// policy; else the job switches to the best. The one rule set of `run --policy auto` and of
// DistributedOptimizer(policy="auto") (through the module's decide_auto).
Result<AutoDecision> decide_auto(const Job& job, const std::string& running,
                                 const PolicyOptions& options, TimeNs measured, TimeNs switch_cost,
                                 int horizon, bool allow_stale, const AutoTrialled& trialled,
                                 const AutoOptions& rules = {});

}  // namespace qs
