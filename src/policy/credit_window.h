// The credit window of user-level tensor partitioning (Mercury III-A; ByteScheduler,
// SOSP'19), shared by the PS and the all-reduce forms of bytescheduler and by p3.
// Internal to the policy layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/core/fifo_ring.h"
#include "quicksilver/core/units.h"

namespace qs {

// Partitions wait in the scheduler's own priority queue (lowest priority value first,
// then first in, first out). The most urgent is released to the FIFO communication
// library while the released-but-unfinished bytes fit in the credit; one is always
// allowed, so a credit of one partition is stop-and-wait. finished() returns credit.
//
// The queue is a bucket queue: priorities are tensor indices (small and dense), so each
// has a FIFO of its own, and the most urgent is the first non-empty one from the lowest
// that may hold any. The same order as a heap on (priority, arrival), in O(1) a unit
// amortised (the backward hands tensors over from the last to the first, so the lowest
// non-empty priority mostly only falls): a heap of VGG-16's 8,000 partitions of 64 KiB
// was a tenth of bytescheduler's simulation (callgrind).
template <typename Unit>
class CreditWindow {
 public:
  explicit CreditWindow(Bytes credit) : credit_(credit) {}

  // Precondition: 0 <= priority < kMaxPriority (a tensor index).
  void add(Unit unit, std::int64_t priority, Bytes bytes) {
    QS_CHECK(priority >= 0 && priority < kMaxPriority);
    const auto p = static_cast<std::size_t>(priority);
    if (p >= queues_.size()) queues_.resize(p + 1);
    queues_[p].push(Pending{std::move(unit), bytes});
    first_ = std::min(first_, p);
    ++pending_;
  }

  void finished(Bytes bytes) {
    in_flight_ -= bytes;
    QS_CHECK(in_flight_ >= 0);
  }

  // Calls release(unit) for each unit the window lets go now, most urgent first.
  template <typename Release>
  void release(Release&& release) {
    while (pending_ > 0) {
      while (queues_[first_].empty()) ++first_;
      FifoRing<Pending>& q = queues_[first_];
      if (in_flight_ != 0 && in_flight_ + q.front().bytes > credit_) return;
      // The next front is read at the next acknowledgement, after every other worker's
      // events in a simulation: fetched now.
      q.prefetch_second();
      Pending p = q.pop();
      --pending_;
      in_flight_ += p.bytes;
      release(std::move(p.unit));
    }
  }

 private:
  static constexpr std::int64_t kMaxPriority = std::int64_t{1} << 24;
  struct Pending {
    Unit unit;
    Bytes bytes;
  };

  Bytes credit_;
  std::vector<FifoRing<Pending>> queues_;  // by priority, each in arrival order
  std::size_t first_ = SIZE_MAX;           // no queue below it holds a unit
  std::size_t pending_ = 0;
  Bytes in_flight_ = 0;
};

}  // namespace qs
