// Private: constructors of PS policies that live in their own files.
#pragma once

#include <functional>
#include <memory>

#include "quicksilver/policy/ps_policy.h"

namespace qs {

// Cuts tensor `t` into units of at most `max_bytes` inside its placement slices,
// interleaved round-robin across the slices (ps_policies.cc), and hands each to `out`.
void push_interleaved(const PsContext& ctx, TensorId t, Bytes max_bytes,
                      const std::function<void(const PushUnit&)>& out);

// Prophet (Prophet paper Algorithm 1), prophet.cc.
Result<std::unique_ptr<PsPolicy>> make_prophet_policy(const PolicyOptions& options,
                                                      const PsContext& context);

}  // namespace qs
