// Private to the policy layer: what a policy's source file needs to declare its knobs and
// register itself (include/policy/quicksilver/policy/registry.h), and the one registration
// function each built-in policy file defines.
#pragma once

#include "quicksilver/policy/registry.h"

namespace qs {

// A member of one policy's options struct as a PolicyOptions member (PolicyOptions
// derives from every such struct): knob_field(&MercuryOptions::packet_size).
template <class S, class T>
constexpr T PolicyOptions::*knob_field(T S::*member) {
  return static_cast<T PolicyOptions::*>(member);
}

inline bool knob_positive(double v) { return v > 0; }

// "must be positive for policy NAME" unless v > 0 (factories' own checks: options built
// in code, not from flags, reach them too).
Status need_positive(Bytes v, std::string_view what, std::string_view policy);

// The registrar of the mutable registry while it is built (registry.cc).
class PolicyRegistry;
Status register_placement_knobs(PolicyRegistry& r);     // layout.cc
Status register_ps_policies(PolicyRegistry& r);         // ps_policies.cc
Status register_prophet(PolicyRegistry& r);             // prophet.cc
Status register_allreduce_policies(PolicyRegistry& r);  // allreduce_policies.cc
Status register_usbyte(PolicyRegistry& r);              // usbyte.cc
Status register_deft(PolicyRegistry& r);                // deft.cc

}  // namespace qs
