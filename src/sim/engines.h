// Private: the two simulation engines behind qs::simulate().
#pragma once

#include "quicksilver/sim/simulator.h"

namespace qs {

// Simulated time beyond which a run stops with an error instead of risking overflow
// (about 73 years; reached only with absurd rates such as a few bits per second).
inline constexpr TimeNs kSimHorizon = kTimeNever / 4;
Status horizon_error();

// Parameter-server engine (ps_engine.cc). Preconditions: cluster validated, PS architecture.
Result<SimResult> simulate_ps(const Profile& profile, const std::string& policy,
                              const PolicyOptions& policy_options, const ClusterConfig& cluster,
                              const SimOptions& options);
// The same for several jobs sharing the cluster (simulate_shared); one result per job.
// Preconditions as simulate_ps's, for every job; the pointers outlive the call.
struct PsJobInput {
  const Profile* profile = nullptr;
  std::string policy;
  const PolicyOptions* options = nullptr;
};
Result<std::vector<SimResult>> simulate_ps_jobs(const std::vector<PsJobInput>& jobs,
                                                const ClusterConfig& cluster,
                                                const SimOptions& options,
                                                const SharingOptions& sharing);

// All-reduce engine (allreduce_engine.cc). Preconditions: cluster validated, all-reduce.
Result<SimResult> simulate_allreduce(const Profile& profile, const std::string& policy,
                                     const PolicyOptions& policy_options,
                                     const ClusterConfig& cluster, const SimOptions& options);

}  // namespace qs
