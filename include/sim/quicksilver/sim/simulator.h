// The discrete-event simulator: "how fast would this model train on this network with
// this scheduler?" Deterministic (integer-ns time, strictly ordered events, one seeded
// Rng), and driving the same policy objects as the runtime.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/engine/result.h"
#include "quicksilver/engine/trace.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/options.h"

namespace qs {

// Simulates `policy` on `profile`. Errors: invalid config, unknown policy, a policy that
// does not exist for the architecture, or a policy that broke an engine invariant (named).
Result<SimResult> simulate(const Profile& profile, const std::string& policy,
                           const PolicyOptions& policy_options, const ClusterConfig& cluster,
                           const SimOptions& options);

// The all-reduce cost T_ar(M) = a + b*M for `cluster` (MG-WFBP eq. 4, Table II): from
// allreduce_a/allreduce_b when set, else from the algorithm, latency (alpha), bandwidth
// (beta) and reduction rate (gamma) at time 0.
// Simulates every policy of `job` in turn, each on job.cluster with job.sim: one row per
// policy (no prediction: the result is the prediction). Errors: the first policy that
// fails, its message prefixed with the policy's name ("mercury: ...").
Result<std::vector<ResultRow>> simulate(const Job& job);

AllReduceCost allreduce_cost(const ClusterConfig& cluster);
// Least-squares fit of a and b to measured "SIZE TIME" lines (units allowed: "4MiB 3.2ms").
Result<AllReduceCost> fit_allreduce_cost(const std::string& path);

}  // namespace qs
