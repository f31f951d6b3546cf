// One span on a track of a Chrome trace: what the simulator predicts and what the runtime
// measures are recorded the same way, so that `quicksilver run --trace` can lay the two
// timelines side by side.
#pragma once

#include <string>

#include "quicksilver/core/units.h"

namespace qs {

struct TraceSpan {
  int host = 0;   // worker index (servers: workers + server index)
  int track = 0;  // 0 compute, 1 uplink, 2 downlink, 3 gradients (the PS runtime: a
                  // tensor from its first push to its last pull, one span per iteration)
  TimeNs start = 0;
  TimeNs end = 0;
  std::string name;
};

}  // namespace qs
