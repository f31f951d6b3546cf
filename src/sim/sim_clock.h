// Private to sim/: the simulator's Timer, its event queue. The training loops and the
// emulated GPUs schedule callbacks on it; the network models schedule typed events (no
// closure per packet) that the engine hands back to them. Both share one queue, so every
// event fires in (time, scheduling order), and runs repeat exactly.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "quicksilver/engine/timer.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/sim/event_queue.h"

namespace qs {

// Trivially copyable, so that the event heap moves plain bytes: a callback waits in a
// side table, and its event carries the slot.
struct SimEvent {
  static constexpr std::uint8_t kCallback = 255;
  std::uint8_t kind = 0;  // the network model's event type, or kCallback
  int index = 0;          // its host, or the callback's slot
  PushUnit unit{};
};

class SimClock final : public Timer {
 public:
  TimeNs now() const override { return q_.now(); }
  void schedule_at(TimeNs when, Callback fn) override {
    int slot;
    if (free_.empty()) {
      slot = static_cast<int>(callbacks_.size());
      callbacks_.push_back(std::move(fn));
    } else {
      slot = free_.back();
      free_.pop_back();
      callbacks_[static_cast<std::size_t>(slot)] = std::move(fn);
    }
    q_.schedule(std::max(when, q_.now()), SimEvent{SimEvent::kCallback, slot, {}});
  }
  // A network model's event.
  void schedule_event(TimeNs when, std::uint8_t kind, int index, const PushUnit& unit = {}) {
    q_.schedule(when, SimEvent{kind, index, unit});
  }
  bool empty() const { return q_.empty(); }
  std::uint64_t fired() const { return q_.fired(); }

  // Removes the earliest event and advances now() to its time.
  EventQueue<SimEvent>::Event pop() { return q_.pop(); }
  // Runs `e` if it is a callback (true); a network event is the caller's (false).
  bool run_callback(const EventQueue<SimEvent>::Event& e) {
    if (e.payload.kind != SimEvent::kCallback) return false;
    Callback fn = std::move(callbacks_[static_cast<std::size_t>(e.payload.index)]);
    free_.push_back(e.payload.index);
    fn();
    return true;
  }

 private:
  EventQueue<SimEvent> q_;
  std::vector<Callback> callbacks_;  // by slot
  std::vector<int> free_;            // unused slots
};

}  // namespace qs
