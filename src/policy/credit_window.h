// The credit window of user-level tensor partitioning (Mercury III-A; ByteScheduler,
// SOSP'19), shared by the PS and the all-reduce forms of bytescheduler and by p3.
// Internal to the policy layer.
#pragma once

#include <cstdint>
#include <queue>
#include <utility>

#include "quicksilver/core/check.h"
#include "quicksilver/core/units.h"

namespace qs {

// Partitions wait in the scheduler's own priority queue (lowest priority value first,
// then first in, first out). The most urgent is released to the FIFO communication
// library while the released-but-unfinished bytes fit in the credit; one is always
// allowed, so a credit of one partition is stop-and-wait. finished() returns credit.
template <typename Unit>
class CreditWindow {
 public:
  explicit CreditWindow(Bytes credit) : credit_(credit) {}

  void add(Unit unit, std::int64_t priority, Bytes bytes) {
    pending_.push(Pending{std::move(unit), priority, bytes, seq_++});
  }

  void finished(Bytes bytes) {
    in_flight_ -= bytes;
    QS_CHECK(in_flight_ >= 0);
  }

  // Calls release(unit) for each unit the window lets go now, most urgent first.
  template <typename Release>
  void release(Release&& release) {
    while (!pending_.empty() && (in_flight_ == 0 || in_flight_ + pending_.top().bytes <= credit_)) {
      Pending p = pending_.top();
      pending_.pop();
      in_flight_ += p.bytes;
      release(std::move(p.unit));
    }
  }

 private:
  struct Pending {
    Unit unit;
    std::int64_t priority;
    Bytes bytes;
    std::uint64_t seq;
    // Max-heap order: the most urgent (lowest priority, then oldest) compares greatest;
    // seq is unique, so this is a strict weak ordering with no ties.
    bool operator<(const Pending& o) const {
      if (priority != o.priority) return priority > o.priority;
      return seq > o.seq;
    }
  };

  Bytes credit_;
  std::priority_queue<Pending> pending_;
  std::uint64_t seq_ = 0;
  Bytes in_flight_ = 0;
};

}  // namespace qs
