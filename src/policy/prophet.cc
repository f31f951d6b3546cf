// Prophet (Prophet paper Algorithm 1): placeholder until the Prophet policy lands.
#include "ps_policies.h"

namespace qs {

Result<std::unique_ptr<PsPolicy>> make_prophet_policy(const PolicyOptions&, const PsContext&) {
  return invalid_argument("prophet is not available yet");
}

}  // namespace qs
