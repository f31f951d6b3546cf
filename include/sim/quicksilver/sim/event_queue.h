// EventQueue: the simulator's clock. Events fire in (time, sequence) order, where the
// sequence number is assigned at scheduling time and is unique: this is a strict weak
// ordering with a unique final tie-breaker (STYLE.md practice 4), so two events at the
// same nanosecond always fire in the order they were scheduled and runs repeat exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/core/units.h"

namespace qs {

template <typename Payload>
class EventQueue {
 public:
  struct Event {
    TimeNs time;
    std::uint64_t seq;
    Payload payload;
  };

  TimeNs now() const { return now_; }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  std::uint64_t fired() const { return fired_; }

  // Precondition: at >= now() (the past cannot be scheduled).
  void schedule(TimeNs at, Payload p) {
    QS_CHECK_MSG(at >= now_, "event scheduled in the past");
    heap_.push_back(Event{at, next_seq_++, std::move(p)});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }
  // Removes and returns the earliest event (moved out, not copied) and advances now() to
  // its time.
  Event pop() {
    QS_CHECK(!heap_.empty());
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    Event e = std::move(heap_.back());
    heap_.pop_back();
    now_ = e.time;
    ++fired_;
    return e;
  }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  std::vector<Event> heap_;  // a binary heap under Later: the earliest event at the front
  TimeNs now_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t fired_ = 0;
};

}  // namespace qs
