// Private: constructors of PS policies that live in their own files.
#pragma once

#include <memory>

#include "quicksilver/policy/ps_policy.h"

namespace qs {

// Prophet (Prophet paper Algorithm 1), prophet.cc.
Result<std::unique_ptr<PsPolicy>> make_prophet_policy(const PolicyOptions& options,
                                                      const PsContext& context);

}  // namespace qs
