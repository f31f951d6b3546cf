// FifoRing: a FIFO in a ring buffer (power-of-two capacity) that keeps its memory, 40 bytes
// beside its elements. The PS simulator keeps thousands of them (each simulated host's
// transport queue per priority, PriorityFifo; each link's events, EventQueue's lanes), each
// touched again only after every other host's events: a small header, no allocation in
// steady state (a std::deque was 80 bytes and a block allocation every 512 bytes), and
// prefetch_second() for a caller that pops again only much later. T must be
// default-constructible and movable.
// Not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace qs {

template <typename T>
class FifoRing {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  const T& front() const { return buf_[head_]; }
  const T& back() const { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
  void push(T v) { push_slot() = std::move(v); }
  // A new last element, to be assigned in place: a caller that sets its fields one by one
  // does not build it elsewhere first (a temporary of narrow stores read back whole is a
  // failed store-to-load forwarding, docs/benchmarks.md "advise").
  T& push_slot() {
    if (size_ == buf_.size()) grow();
    T& slot = buf_[(head_ + size_) & (buf_.size() - 1)];
    ++size_;
    return slot;
  }
  // Precondition: !empty().
  T pop() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
    // An emptied ring starts again at its first slot: a ring that holds one element at a
    // time (a link's next "free") keeps using one cache line.
    if (size_ == 0) head_ = 0;
    return v;
  }
  // Fetches the element after the front into the cache: the front after the next pop, read
  // while other work goes on.
  void prefetch_second() const {
    if (size_ > 1) __builtin_prefetch(&buf_[(head_ + 1) & (buf_.size() - 1)]);
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<std::size_t>(8, buf_.size() * 2));
    for (std::size_t i = 0; i < size_; ++i)
      bigger[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(bigger);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0, size_ = 0;
};

}  // namespace qs
