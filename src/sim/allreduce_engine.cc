// All-reduce engine: placeholder until the all-reduce policies land.
#include "engines.h"

namespace qs {

TimeNs AllReduceCost::time(Bytes m) const {
  return a + static_cast<TimeNs>(b_ns_per_byte * static_cast<double>(m) + 0.5);
}
const std::vector<std::string>& allreduce_policy_names() {
  static const std::vector<std::string> kNames = {"oracle"};
  return kNames;
}
AllReduceCost allreduce_cost(const ClusterConfig&) { return {}; }
Result<AllReduceCost> fit_allreduce_cost(const std::string&) {
  return invalid_argument("not available yet");
}
Result<SimResult> simulate_allreduce(const Profile&, const std::string&, const PolicyOptions&,
                                     const ClusterConfig&, const SimOptions&) {
  return invalid_argument("the all-reduce architecture is not available yet");
}

}  // namespace qs
