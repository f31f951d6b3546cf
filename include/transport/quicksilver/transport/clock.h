// Clock: the seam through which the runtime reads time (STYLE.md practice 1). Policies
// never read it; the engine that drives them passes `now` in.
#pragma once

#include <chrono>

#include "quicksilver/core/units.h"

namespace qs::transport {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds; the origin is arbitrary but fixed for the process.
  virtual TimeNs now() const = 0;
};

// The real clock: std::chrono::steady_clock, which on Linux is CLOCK_MONOTONIC, the clock
// the event loop's timerfd is armed on. Thread-safe; stateless.
class SteadyClock final : public Clock {
 public:
  TimeNs now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance (stateless, so not a singleton holding state).
  static const SteadyClock& instance() {
    static const SteadyClock c;
    return c;
  }
};

// SteadyClock's time, for the runtime's own deadlines and timeouts (the code that reads the
// real clock directly, not through a Clock it was given).
inline TimeNs steady_now() { return SteadyClock::instance().now(); }

}  // namespace qs::transport
