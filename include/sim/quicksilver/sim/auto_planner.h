// policy="auto"'s decision in C++ (issue 30, item 2), for `quicksilver run --policy auto`:
// the runtime's job measures its iteration time under the policy it runs; the network is
// the rate at which the simulator predicts that time for that policy; every policy of the
// architecture is ranked there (advise(), without its sweep); and the job switches when the
// best is predicted faster by more than kAutoMinGain of an iteration and, over the
// iterations until the next decision, by more than a switch costs. Candidates predicted
// within kAutoTrialBand of the best are measured in turn instead (a trial). The same rules
// and constants as the PyTorch planner (python/quicksilver/auto.py), which decides from
// rank 0's measurements of a training script. No clock, no socket: a function of its
// arguments (and the deterministic simulator).
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
// A switch must gain more than this share of the running policy's predicted iteration.
inline constexpr double kAutoMinGain = 0.02;
// Candidates predicted within this share of the best are a near-tie: measured, not guessed.
inline constexpr double kAutoTrialBand = 0.05;
// At most this many candidates are measured in a trial, and only when their switches
// cost at most this share of the iterations until the next decision.
inline constexpr int kAutoTrialMax = 3;
inline constexpr double kAutoTrialBudget = 0.1;
// The rates the effective rate is searched over.
inline constexpr Rate kAutoSlowest{10'000'000};
inline constexpr Rate kAutoFastest{400'000'000'000};

// The rate at which predict(rate) (falling as the rate grows) is `measured` within 0.2 %,
// clamped to [kAutoSlowest, kAutoFastest]: secant steps on the time per bit from 10 and 1
// Gbit/s (an exposed communication makes an iteration nearly linear in it), bisection on
// its log where a step leaves the bracket or the prediction is flat. Errors: predict's.
Result<Rate> effective_rate(const std::function<Result<TimeNs>(Rate)>& predict, TimeNs measured);

struct AutoDecision {
  Rate network{0};                     // the effective rate
  TimeNs predicted = 0;                // the running policy's prediction there
  std::vector<AdvisedPolicy> ranking;  // there, best first
  // What runs next: the running policy (kept), the best (a switch), or, for a near-tie,
  // the candidates to measure in turn (trial: the running one not among them).
  bool change = false;
  AdvisedPolicy next;
  std::vector<AdvisedPolicy> trial;
  std::string reason;  // in words, for the log
};

// The decision after an iteration time of `measured` under `running` with `options` on
// `job` (its cluster's rate is replaced by the effective one), where a switch costs
// `switch_cost` and the next decision comes `horizon` iterations later. `trialled`: the
// candidates of the last trial (not measured again while the near-tie stays within them).
Result<AutoDecision> decide_auto(const Job& job, const std::string& running,
                                 const PolicyOptions& options, TimeNs measured, TimeNs switch_cost,
                                 int horizon, bool allow_stale,
                                 const std::vector<std::string>& trialled);

}  // namespace qs
