// Private: constructors of all-reduce policies that live in their own files.
#pragma once

#include <memory>

#include "quicksilver/policy/allreduce_policy.h"

namespace qs {

// US-Byte (usbyte.cc).
std::unique_ptr<AllReducePolicy> make_usbyte(const AllReduceContext& context,
                                             const PolicyOptions& options);
// DeFT (deft.cc). Errors: invalid DeFT options.
Result<std::unique_ptr<AllReducePolicy>> make_deft(const AllReduceContext& context,
                                                   const PolicyOptions& options);

}  // namespace qs
