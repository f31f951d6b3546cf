#include "quicksilver/torch/planner.h"

#include "quicksilver/model/profile.h"
#include "quicksilver/sim/simulator.h"
#include "quicksilver/torch/session.h"
#include "quicksilver/transport/wire.h"

namespace qs::pytorch {

Result<Job> plan_job(const PlanSpec& spec, const std::string& policy) {
  Job job;
  QS_ASSIGN_OR_RETURN(job.profile,
                      profile_from_json(spec.profile_json, "<measured profile>", "model"));
  if (!policy.empty()) job.policies = {policy};
  job.cluster.architecture = spec.architecture;
  job.cluster.workers = spec.workers;
  job.cluster.servers = spec.servers;
  job.cluster.bandwidth = spec.bandwidth;
  job.cluster.latency = spec.latency;
  QS_ASSIGN_OR_RETURN(const transport::WireDType wire,
                      transport::parse_wire_dtype(spec.compression));
  job.cluster.compression = transport::wire_dtype_name(wire);
  job.cluster.wire_element_bytes = transport::wire_dtype_size(wire);
  // As `simulate --compression` (docs/simulator.md): the conversions' cost per element.
  if (wire != transport::WireDType::kFloat32) job.cluster.convert_ns_per_element = 0.35;
  QS_RETURN_IF_ERROR(job.cluster.validate());
  return job;
}

Result<TimeNs> predict_iteration(const PlanSpec& spec, const std::string& policy,
                                 const std::vector<std::pair<std::string, std::string>>& knobs) {
  QS_ASSIGN_OR_RETURN(Job job, plan_job(spec, policy));
  QS_RETURN_IF_ERROR(parse_knobs(knobs, &job.policy_options));
  QS_ASSIGN_OR_RETURN(const SimResult r,
                      simulate(job.profile, policy, job.policy_options, job.cluster, job.sim));
  return r.iteration_time;
}

Result<Advice> rank_policies(const PlanSpec& spec, bool allow_stale) {
  QS_ASSIGN_OR_RETURN(const Job job, plan_job(spec));
  AdviseOptions options;
  options.allow_stale = allow_stale;
  options.sensitivity = false;  // the training job needs the ranking, not the sweep
  options.threads = 1;          // beside the training's own threads
  return advise(job, options);
}

Result<std::string> candidate(const std::string& policy,
                              const std::vector<std::pair<std::string, std::string>>& knobs,
                              Architecture architecture) {
  PolicyOptions options;
  QS_RETURN_IF_ERROR(parse_knobs(knobs, &options));
  return auto_candidate(policy, options, architecture);
}

Result<AutoDecision> decide(const PlanSpec& spec, const std::string& policy,
                            const std::vector<std::pair<std::string, std::string>>& knobs,
                            TimeNs measured, TimeNs switch_cost, int horizon, bool allow_stale,
                            const AutoTrialled& trialled, AutoOptions rules) {
  QS_ASSIGN_OR_RETURN(Job job, plan_job(spec, policy));
  QS_RETURN_IF_ERROR(parse_knobs(knobs, &job.policy_options));
  rules.threads = 1;  // beside the training's own threads
  return decide_auto(job, policy, job.policy_options, measured, switch_cost, horizon, allow_stale,
                     trialled, rules);
}

}  // namespace qs::pytorch
