// PriorityFifo: one FIFO per priority plus a hierarchical bitmap of the non-empty ones,
// so that push, pop and "most urgent" are O(levels) = O(1) for a fixed priority range
// (DESIGN.md "Transport and runtime"; Mercury IV-C's sending buffer). Priority 0 is the
// most urgent; among equal priorities, first in, first out. Each priority's FIFO is a
// FifoRing, and the most urgent priority is kept as a member (the bitmap is read only when
// a priority empties): in the PS simulator the bitmap word, a std::deque's 80-byte header
// and the element were three cache misses in a row (docs/benchmarks.md).
//
// The ordering it implements is the strict order (priority, insertion sequence): no two
// elements compare equal, so the pop order is fully determined.
// Not thread-safe.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/core/fifo_ring.h"

namespace qs {

template <typename T>
class PriorityFifo {
 public:
  // Priorities 0..num_priorities-1. Precondition: num_priorities >= 1.
  explicit PriorityFifo(int num_priorities)
      : queues_(static_cast<std::size_t>(num_priorities)), top_(queues_.size()) {
    QS_CHECK(num_priorities >= 1);
    std::size_t n = static_cast<std::size_t>(num_priorities);
    do {
      n = (n + 63) / 64;
      levels_.emplace_back(n, 0);
    } while (n > 1);
  }

  int num_priorities() const { return static_cast<int>(queues_.size()); }
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }

  void push(int priority, T value) {
    QS_CHECK(priority >= 0 && priority < num_priorities());
    const auto p = static_cast<std::size_t>(priority);
    auto& q = queues_[p];
    if (q.empty()) mark(p);
    q.push(std::move(value));
    ++size_;
    top_ = std::min(top_, p);
  }
  // Most urgent priority present (kept up to date by push and pop: the bitmap is read only
  // when a priority empties). Precondition: !empty().
  int top_priority() const {
    QS_CHECK(!empty());
    return static_cast<int>(top_);
  }
  const T& top() const { return queues_[static_cast<std::size_t>(top_priority())].front(); }
  // The most urgent element, to update in place (its priority stays). Precondition: !empty().
  T& top() { return queues_[static_cast<std::size_t>(top_priority())].front(); }
  T pop() {
    const auto p = static_cast<std::size_t>(top_priority());
    auto& q = queues_[p];
    T v = q.pop();
    --size_;
    if (q.empty()) {
      unmark(p);
      top_ = size_ == 0 ? queues_.size() : lowest_marked();
    } else {
      // The next element of this priority, and the line after it: a simulation keeps one
      // queue per worker and touches it again only after every other worker's events
      // (VGG-16's mercury at 256 workers: 9 % faster, docs/benchmarks.md "advise").
      __builtin_prefetch(&q.front());
      __builtin_prefetch(reinterpret_cast<const char*>(&q.front()) + 64);
    }
    return v;
  }

 private:
  std::size_t lowest_marked() const {
    std::size_t idx = 0;
    for (std::size_t lv = levels_.size(); lv-- > 0;) {
      idx = idx * 64 + static_cast<std::size_t>(std::countr_zero(levels_[lv][idx]));
    }
    return idx;
  }
  void mark(std::size_t i) {
    for (auto& level : levels_) {
      const std::uint64_t bit = std::uint64_t{1} << (i % 64);
      const bool was_empty = level[i / 64] == 0;
      level[i / 64] |= bit;
      if (!was_empty) return;
      i /= 64;
    }
  }
  void unmark(std::size_t i) {
    for (auto& level : levels_) {
      level[i / 64] &= ~(std::uint64_t{1} << (i % 64));
      if (level[i / 64] != 0) return;
      i /= 64;
    }
  }

  std::vector<FifoRing<T>> queues_;
  std::vector<std::vector<std::uint64_t>> levels_;  // levels_[0]: one bit per priority
  std::size_t size_ = 0;
  std::size_t top_;  // the most urgent non-empty priority (queues_.size(): none)
};

}  // namespace qs
