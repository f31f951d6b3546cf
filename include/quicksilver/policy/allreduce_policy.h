// The all-reduce scheduling policy: a pure event-driven state machine that decides which
// gradient bytes are all-reduced together (buckets), in which order, on which link, and
// when the next forward of each layer may start. Driven by the simulator's all-reduce
// engine and by the runtime's gloo path; never reads a clock, socket or environment.
//
// (This header is the contract between the engine and the policies; see the all-reduce
// issue for the policies: wfbp, synceasgd, mgwfbp, mgwfbp-opt, ddp, usbyte,
// bytescheduler, deft.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/policy/options.h"

namespace qs {

// T_ar(M) = a + b*M (MG-WFBP eq. 4); the policies plan with it, the engine charges it.
struct AllReduceCost {
  TimeNs a = 0;
  double b_ns_per_byte = 0;
  TimeNs time(Bytes m) const;
};

// The policies available on the all-reduce architecture, in display order.
const std::vector<std::string>& allreduce_policy_names();

}  // namespace qs
