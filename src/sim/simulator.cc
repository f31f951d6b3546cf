#include "quicksilver/sim/simulator.h"

#include <algorithm>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/policy/registry.h"

namespace qs {

Status horizon_error() {
  return invalid_argument("simulated time passed " + format_time(kSimHorizon) +
                          " before the iterations ended; is --bandwidth too low?");
}

Result<SimResult> simulate(const Profile& profile, const std::string& policy,
                           const PolicyOptions& policy_options, const ClusterConfig& cluster,
                           const SimOptions& options) {
  QS_RETURN_IF_ERROR(validate_profile(profile));
  QS_RETURN_IF_ERROR(cluster.validate());
  if (options.iterations < 1 || options.iterations > 1'000'000) {
    return invalid_argument("--iterations must be in 1..1000000");
  }
  if (options.warmup < 0) return invalid_argument("warm-up must be >= 0");
  if (options.stop_at_least < 0) return invalid_argument("stop_at_least must be >= 0");
  if (!is_known_policy(policy)) {
    std::string known;
    for (const auto& n : all_policy_names()) known += (known.empty() ? "" : ", ") + n;
    return invalid_argument("unknown policy '" + policy + "' (known: " + known + ")");
  }
  QS_RETURN_IF_ERROR(check_unit_budget(profile, policy, cluster.architecture, policy_options,
                                       cluster.workers, cluster.servers));
  try {
    if (cluster.architecture == Architecture::kPs) {
      return simulate_ps(profile, policy, policy_options, cluster, options);
    }
    return simulate_allreduce(profile, policy, policy_options, cluster, options);
  } catch (const CheckFailure& e) {
    return internal_error(std::string("simulating ") + policy + ": " + e.what());
  }
}

Result<JobSharing> parse_job_sharing(const std::string& s) {
  if (s == "fair") return JobSharing::kFair;
  if (s == "strict") return JobSharing::kStrict;
  if (s == "deadline") return JobSharing::kDeadline;
  if (s == "flows") return JobSharing::kFlows;
  return invalid_argument("unknown job sharing '" + s + "' (known: fair, strict, deadline, flows)");
}

const char* job_sharing_name(JobSharing s) {
  switch (s) {
    case JobSharing::kFair:
      return "fair";
    case JobSharing::kStrict:
      return "strict";
    case JobSharing::kDeadline:
      return "deadline";
    case JobSharing::kFlows:
      return "flows";
  }
  return "?";
}

Result<std::vector<SimResult>> simulate_shared(const std::vector<SharedJob>& jobs,
                                               const ClusterConfig& cluster,
                                               const SimOptions& options,
                                               const SharingOptions& sharing) {
  if (jobs.empty() || static_cast<int>(jobs.size()) > kMaxSharedJobs) {
    return invalid_argument("--job: between 1 and " + std::to_string(kMaxSharedJobs) + " jobs");
  }
  QS_RETURN_IF_ERROR(cluster.validate());
  if (cluster.architecture != Architecture::kPs) {
    return invalid_argument(
        "jobs sharing a cluster: the parameter-server architecture only (--architecture ps)");
  }
  if (options.iterations < 1 || options.iterations > 1'000'000) {
    return invalid_argument("--iterations must be in 1..1000000");
  }
  if (options.warmup < 0) return invalid_argument("warm-up must be >= 0");
  if (options.stop_at_least != 0 || options.stop_when_steady) {
    return invalid_argument(
        "jobs sharing a cluster run whole (stop_at_least and stop_when_steady are simulate()'s)");
  }
  std::vector<PsJobInput> inputs;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const SharedJob& job = jobs[j];
    const std::string where = "job " + std::to_string(j);
    QS_RETURN_IF_ERROR(validate_profile(job.profile).with_context(where));
    const auto ps = ps_policy_names();
    if (std::find(ps.begin(), ps.end(), job.policy) == ps.end()) {
      return invalid_argument(where + ": '" + job.policy + "' is not a parameter-server policy");
    }
    QS_RETURN_IF_ERROR(check_unit_budget(job.profile, job.policy, Architecture::kPs,
                                         job.policy_options, cluster.workers, cluster.servers)
                           .with_context(where));
    inputs.push_back(PsJobInput{&job.profile, job.policy, &job.policy_options});
  }
  try {
    return simulate_ps_jobs(inputs, cluster, options, sharing);
  } catch (const CheckFailure& e) {
    return internal_error(std::string("simulating shared jobs: ") + e.what());
  }
}

Result<std::vector<ResultRow>> simulate(const Job& job) {
  std::vector<ResultRow> rows;
  for (const std::string& p : job.policies) {
    auto r = simulate(job.profile, p, job.policy_options, job.cluster, job.sim);
    if (!r) return r.status().with_context(p);
    rows.push_back(ResultRow{std::move(*r), std::nullopt});
  }
  return rows;
}

}  // namespace qs
