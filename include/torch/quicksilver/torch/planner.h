// The simulator as policy="auto" uses it from a training job (issue 30): the job's
// measured profile on a network of a given rate, the prediction of one policy, and the
// ranking of every policy of the architecture (qs::advise, without its sensitivity sweep).
// The Python side measures the job and keeps a trial's bookkeeping
// (python/quicksilver/auto.py); the decision's rules are qs::decide_auto's, the same as
// `run --policy auto`'s. No clock, no socket, deterministic for the same inputs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/sim/advisor.h"
#include "quicksilver/sim/auto_planner.h"

namespace qs::pytorch {

struct PlanSpec {
  std::string profile_json;  // DESIGN.md's profile format (the measured one)
  Architecture architecture = Architecture::kPs;
  int workers = 1;
  int servers = 1;  // PS only
  Rate bandwidth = Rate::gbps(10);
  TimeNs latency = 0;
  std::string compression = "none";  // "none", "bf16", "fp16"
};

// The simulator's job for `spec`, with `policy` as its only policy (none: empty).
Result<Job> plan_job(const PlanSpec& spec, const std::string& policy = "");

// The predicted iteration time of `policy` with `knobs` (JobSpec::knobs' spelling).
Result<TimeNs> predict_iteration(const PlanSpec& spec, const std::string& policy,
                                 const std::vector<std::pair<std::string, std::string>>& knobs);

// Every communicating policy of spec.architecture ranked with its knobs tuned (advise()).
Result<Advice> rank_policies(const PlanSpec& spec, bool allow_stale);

// The name decide_auto gives `policy` with `knobs` (auto_candidate).
Result<std::string> candidate(const std::string& policy,
                              const std::vector<std::pair<std::string, std::string>>& knobs,
                              Architecture architecture);

// qs::decide_auto on the job of `spec` (its rate is the one decide_auto infers), running
// `policy` with `knobs`; the simulations one at a time, beside the training's threads.
Result<AutoDecision> decide(const PlanSpec& spec, const std::string& policy,
                            const std::vector<std::pair<std::string, std::string>>& knobs,
                            TimeNs measured, TimeNs switch_cost, int horizon, bool allow_stale,
                            const AutoTrialled& trialled, AutoOptions rules);

}  // namespace qs::pytorch
