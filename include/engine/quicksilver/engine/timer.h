// Timer: the first of the training loop's three seams (STYLE.md: "one algorithm, the world
// swapped under it"). The loop never reads a clock: it asks its Timer for now() and
// schedules callbacks. The simulator's Timer is its event queue (virtual time, sim/); the
// runtime's is a node's EventLoop (CLOCK_MONOTONIC, runtime/).
#pragma once

#include <functional>

#include "quicksilver/core/units.h"

namespace qs {

class Timer {
 public:
  using Callback = std::function<void()>;
  virtual ~Timer() = default;

  // The current time in ns. Monotonic; in the simulator, the time of the event being run.
  virtual TimeNs now() const = 0;
  // Runs `fn` at `when` on the loop's thread. Callbacks due at the same time run in the
  // order they were scheduled (a strict order: runs repeat exactly in the simulator).
  // A `when` in the past runs as soon as possible. Not thread-safe: loop thread only.
  virtual void schedule_at(TimeNs when, Callback fn) = 0;
};

}  // namespace qs
