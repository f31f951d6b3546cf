// Private to sim/: the simulator's Timer, its event queue. The training loops and the
// emulated GPUs schedule callbacks on it; the network models schedule typed events (no
// closure per packet) that the engine hands back to them. Both share one queue, so every
// event fires in (time, scheduling order), and runs repeat exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "quicksilver/core/fifo_ring.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/sim/event_queue.h"

namespace qs {

// Trivially copyable and small (16 bytes), so that the event queue moves and keeps little
// (a large simulation has millions of events pending): a callback waits in its lane's FIFO
// or in a side table, and its event carries the lane or the slot; a network model's event
// carries a reference of its own (the PS model's units in flight, the all-reduce model's
// buckets).
struct SimEvent {
  static constexpr std::uint8_t kCallback = 255;      // index: the callback's slot
  static constexpr std::uint8_t kLaneCallback = 254;  // index: its lane (the lane's next)
  std::uint8_t kind = 0;  // the network model's event type, or a callback
  int index = 0;          // its host, or the callback's slot or lane
  std::uint32_t ref = 0;  // the network model's: what the event is about
  // Unused. It fills what was the queue's Event's tail padding, so that an Event is 32
  // bytes of fields, copied as two 16-byte halves. With 28 bytes of fields the compiler
  // copied bytes 0-15 and 12-27, and reading the second half back from a copy just stored
  // as 0-15 and 16-31 defeated store-to-load forwarding in every pop (docs/benchmarks.md
  // "advise").
  std::uint32_t unused = 0;
};
static_assert(sizeof(EventQueue<SimEvent>::Event) == 32);

class SimClock final : public Timer {
 public:
  TimeNs now() const override { return q_.now(); }
  void schedule_at(TimeNs when, Callback fn) override {
    schedule_callback(when, std::move(fn), -1);
  }
  // A callback on `lane` (-1: none): LaneTimer. A lane's events fire in the order they
  // were scheduled, so a callback that goes on the lane waits in the lane's own FIFO, read
  // in sequence (a large simulation has tens of thousands of startup delays pending, and
  // a slot of the side table, reused in whatever order they fire, was a cache miss a
  // callback); one scheduled earlier than the lane's last goes to the heap with a slot.
  void schedule_callback(TimeNs when, Callback fn, int lane) {
    const TimeNs at = std::max(when, q_.now());
    if (lane >= 0 && q_.fits_lane(at, lane)) {
      lane_callbacks_[static_cast<std::size_t>(lane)].push(std::move(fn));
      q_.schedule(at, SimEvent{SimEvent::kLaneCallback, lane, 0}, lane);
      return;
    }
    int slot;
    if (free_.empty()) {
      slot = static_cast<int>(callbacks_.size());
      callbacks_.push_back(std::move(fn));
    } else {
      slot = free_.back();
      free_.pop_back();
      callbacks_[static_cast<std::size_t>(slot)] = std::move(fn);
    }
    q_.schedule(at, SimEvent{SimEvent::kCallback, slot, 0});
  }
  // A network model's event.
  void schedule_event(TimeNs when, std::uint8_t kind, int index, std::uint32_t ref = 0) {
    q_.schedule(when, SimEvent{kind, index, ref});
  }
  // A lane for a network model's events that come in time order (one link's arrivals;
  // EventQueue "Lanes"), and an event on it: the same firing order, a smaller heap. A lane
  // carries a network model's events or callbacks, never both.
  int add_lane() {
    lane_callbacks_.emplace_back();
    return q_.add_lane();
  }
  // lane -1: none (schedule_event).
  void schedule_event_on(int lane, TimeNs when, std::uint8_t kind, int index, std::uint32_t ref) {
    if (lane < 0) return schedule_event(when, kind, index, ref);
    q_.schedule(when, SimEvent{kind, index, ref}, lane);
  }
  bool empty() const { return q_.empty(); }
  std::size_t pending() const { return q_.size(); }
  std::uint64_t fired() const { return q_.fired(); }

  // Removes the earliest event and advances now() to its time.
  EventQueue<SimEvent>::Event pop() { return q_.pop(); }
  // Runs `e` if it is a callback (true); a network event is the caller's (false).
  bool run_callback(const EventQueue<SimEvent>::Event& e) {
    if (e.payload.kind == SimEvent::kLaneCallback) {
      FifoRing<Callback>& ring = lane_callbacks_[static_cast<std::size_t>(e.payload.index)];
      ring.prefetch_second();  // the next front, popped after other lanes' events
      Callback fn = ring.pop();
      fn();
      return true;
    }
    if (e.payload.kind != SimEvent::kCallback) return false;
    Callback fn = std::move(callbacks_[static_cast<std::size_t>(e.payload.index)]);
    free_.push_back(e.payload.index);
    fn();
    return true;
  }

 private:
  EventQueue<SimEvent> q_;
  std::vector<Callback> callbacks_;                 // by slot: the heap's callbacks
  std::vector<int> free_;                           // unused slots
  std::vector<FifoRing<Callback>> lane_callbacks_;  // by lane: its callbacks, in order
};

// One worker's view of the clock: its callbacks (its GPU's steps, its policy's startup
// delays) go on a lane of their own, mostly in time order, so that N workers' callbacks do
// not make the heap N deep. The firing order is the SimClock's (EventQueue "Lanes").
class LaneTimer final : public Timer {
 public:
  explicit LaneTimer(SimClock& clock) : clock_(clock), lane_(clock.add_lane()) {}
  TimeNs now() const override { return clock_.now(); }
  void schedule_at(TimeNs when, Callback fn) override {
    clock_.schedule_callback(when, std::move(fn), lane_);
  }

 private:
  SimClock& clock_;
  int lane_;
};

}  // namespace qs
