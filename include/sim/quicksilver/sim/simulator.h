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

// Several training jobs on one parameter-server cluster (Mercury Fig. 20: "the same 4
// workers and 4 PSes are utilized for all jobs"): every job has its own model, its own
// policy (one instance per worker, as always) and its own tensors on the servers; the jobs
// share every host's NIC and, unless share_gpus is false, every worker's GPU. A link
// serves one unit at a time and picks the job whose queue it serves by JobSharing:
//   kFair     each job's own scheduler orders its queue, and the link serves the jobs
//             round robin, one unit each (separate transports sharing a NIC fairly);
//   kStrict   job 0's units first, then job 1's, ... (a job priority);
//   kFlows    as the runtime's jobs over TCP connections of their own: the jobs'
//             messages are in flight at once and share every link max-min fairly (byte
//             by byte, docs/simulator.md "Several jobs"); within a job its own model:
//             under LinkSharing::kFair (and neither packet-level nor stop-and-wait) the
//             TCP rule, else one message at a time per host, each link serving the job's
//             messages in order, as in the per-message model;
//   kDeadline priorities that hold across jobs (the paper's future work, section VI-C):
//             earliest deadline first, a unit's deadline being when its layer's next
//             forward would start if its job computed without waiting (when the layer's
//             first unit was handed over plus the profile's backward of the layers before
//             it and their update and forward; a sum's pulls carry the deadline of the copy
//             that completed it).
//             Within a job that is Mercury's order, so each job's scheduler still decides
//             among its own units.
// With one job every sharing is the plain simulation, exactly. A GPU shared by several
// jobs is processor-shared (a GPU time-slices between processes): with k steps on it each
// runs at 1/k of its speed. Every job runs
// until all have completed options.iterations (a job that finished early would stop
// competing); each job's result covers its first options.iterations. PS only.
enum class JobSharing { kFair, kStrict, kDeadline, kFlows };
Result<JobSharing> parse_job_sharing(const std::string& s);
const char* job_sharing_name(JobSharing s);
struct SharingOptions {
  JobSharing sharing = JobSharing::kFair;
  bool share_gpus = true;
};
struct SharedJob {
  Profile profile;
  std::string policy;
  PolicyOptions policy_options;
};
inline constexpr int kMaxSharedJobs = 16;
// Errors: fewer than 1 or more than kMaxSharedJobs jobs, an invalid profile, cluster or
// policy (prefixed "job J"), a policy that is not a PS policy, the unit budget of any job.
Result<std::vector<SimResult>> simulate_shared(const std::vector<SharedJob>& jobs,
                                               const ClusterConfig& cluster,
                                               const SimOptions& options,
                                               const SharingOptions& sharing = {});
// Least-squares fit of a and b to measured "SIZE TIME" lines (units allowed: "4MiB 3.2ms").
Result<AllReduceCost> fit_allreduce_cost(const std::string& path);

}  // namespace qs
