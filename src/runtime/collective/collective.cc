// What the all-reduce runtime offers besides the worker (collective_worker.cc); its gloo
// engine (gloo_communicator.cc) is built with QS_WITH_GLOO.
#include "quicksilver/runtime/collective.h"

#include <algorithm>

#include "quicksilver/policy/registry.h"

namespace qs::runtime {

Result<GlooAlgorithm> parse_gloo_algorithm(std::string_view name) {
  for (GlooAlgorithm a : {GlooAlgorithm::kRing, GlooAlgorithm::kRingChunked,
                          GlooAlgorithm::kHalvingDoubling, GlooAlgorithm::kBcube}) {
    if (name == gloo_algorithm_name(a)) return a;
  }
  return invalid_argument("--allreduce-algorithm: '" + std::string(name) +
                          "' is not one of ring, ring-chunked, halving-doubling, bcube");
}

std::string_view gloo_algorithm_name(GlooAlgorithm a) {
  switch (a) {
    case GlooAlgorithm::kRing:
      return "ring";
    case GlooAlgorithm::kRingChunked:
      return "ring-chunked";
    case GlooAlgorithm::kHalvingDoubling:
      return "halving-doubling";
    case GlooAlgorithm::kBcube:
      return "bcube";
  }
  return "?";
}

Status validate_collective_job(const JobOptions& job) {
  QS_RETURN_IF_ERROR(check_job_size(job.workers, 1));
  if (job.iterations < 1) return invalid_argument("iterations must be >= 1");
  QS_RETURN_IF_ERROR(validate_profile(job.profile));
  for (const LayerSpec& l : job.profile.layers) {
    for (const TensorSpec& t : l.tensors) {
      if (t.bytes_per_element != 4) {
        return invalid_argument("layer '" + l.name + "' tensor '" + t.name +
                                "': the runtime sums float32, bytes_per_element must be 4");
      }
    }
  }
  const auto names = allreduce_policy_names();
  if (std::find(names.begin(), names.end(), job.policy) == names.end()) {
    return invalid_argument("--policy: '" + job.policy + "' is not an all-reduce policy");
  }
  return check_unit_budget(job.profile, job.policy, Architecture::kAllReduce, job.policy_options,
                           job.workers);
}

#ifdef QS_HAVE_GLOO
bool have_gloo() { return true; }
#else
bool have_gloo() { return false; }
#endif

}  // namespace qs::runtime
