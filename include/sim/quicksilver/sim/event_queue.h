// EventQueue: the simulator's clock. Events fire in (time, sequence) order, where the
// sequence number is assigned at scheduling time and is unique: this is a strict weak
// ordering with a unique final tie-breaker (STYLE.md practice 4), so two events at the
// same nanosecond always fire in the order they were scheduled and runs repeat exactly.
//
// Lanes (issue 14, simulator scale). Most of a large simulation's events belong to one
// link, and a link delivers in the order it was given work: the times a lane's events
// are scheduled for never decrease. A lane keeps such events in a FIFO, and a tournament
// (winner) tree over the lanes' heads picks the earliest: with N workers and M servers
// about N x M messages may be in flight at once, but the tree has one leaf per lane
// (about 2 (N + M)), and an event costs one pass from its leaf to the root (log2 of the
// lanes), whatever the number in flight. Within a lane both time and sequence increase, so its
// head is its earliest event under the same (time, sequence) order: the firing order is
// exactly the one of a single heap. Events without a lane (callbacks), and an event
// scheduled on a lane earlier than the lane's last one (a schedule that is not
// monotone), go to a binary heap that is one more leaf of the tree; the order stays exact.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/core/fifo_ring.h"
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
  bool empty() const { return size_ == 0; }
  // Events pending (in the heap and in every lane).
  std::size_t size() const { return size_; }
  std::uint64_t fired() const { return fired_; }

  // Precondition: at >= now() (the past cannot be scheduled).
  void schedule(TimeNs at, Payload p) {
    QS_CHECK_MSG(at >= now_, "event scheduled in the past");
    heap_push(Event{at, next_seq_++, std::move(p)});
  }

  // A new lane (ids 0, 1, ...): a FIFO for events scheduled in non-decreasing time order.
  int add_lane() {
    lanes_.emplace_back();
    lane_last_.push_back(0);
    if (++leaves_ > keys_.size()) keys_.push_back(kEmptyKey);
    tree_stale_ = true;
    return static_cast<int>(lanes_.size()) - 1;
  }
  // Whether schedule(at, p, lane) puts the event on the lane (not the heap): the lane is
  // empty or its last event is not later than `at`.
  bool fits_lane(TimeNs at, int lane) const {
    const auto i = static_cast<std::size_t>(lane);
    return lanes_[i].empty() || at >= lane_last_[i];
  }
  // Schedules on `lane`: the same order as schedule(), cheaper when `at` is not earlier
  // than the lane's last event (fits_lane). Precondition: at >= now(), lane from add_lane().
  void schedule(TimeNs at, Payload p, int lane) {
    QS_CHECK_MSG(at >= now_, "event scheduled in the past");
    const auto i = static_cast<std::size_t>(lane);
    Lane& l = lanes_[i];
    const bool first = l.empty();
    if (!first && at < lane_last_[i]) return heap_push(Event{at, next_seq_++, std::move(p)});
    // Set in place (FifoRing::push_slot).
    Event& e = l.push_slot();
    e.time = at;
    e.seq = next_seq_++;
    e.payload = std::move(p);
    lane_last_[i] = at;
    ++size_;
    if (first) set_key(i + 1, key_of(e));
  }

  // Removes and returns the earliest event (moved out, not copied) and advances now() to
  // its time.
  Event pop() {
    QS_CHECK(!empty());
    if (tree_stale_) rebuild();
    const std::size_t leaf = root_;
    Event e;
    if (leaf == 0) {
      e = std::move(heap_.front());
      heap_.front() = std::move(heap_.back());
      heap_.pop_back();
      if (!heap_.empty()) sift_down(0);
      set_winner_key(0, heap_.empty() ? kEmptyKey : key_of(heap_.front()));
    } else {
      Lane& l = lanes_[leaf - 1];
      e = l.pop();
      l.prefetch_second();  // a link's lane is popped again only after the others' events
      set_winner_key(leaf, l.empty() ? kEmptyKey : key_of(l.front()));
    }
    --size_;
    now_ = e.time;
    ++fired_;
    return e;
  }

 private:
  // (time, sequence) as one unsigned 128-bit number: one comparison, no branch. Time is
  // never negative (it starts at 0 and the past cannot be scheduled).
  using Key = unsigned __int128;
  static constexpr Key kEmptyKey = ~Key{0};
  static Key key_of(const Event& e) {
    return (static_cast<Key>(static_cast<std::uint64_t>(e.time)) << 64) | e.seq;
  }

  // The tournament tree over the leaves (0: the heap; 1 + i: lane i): a binary winner
  // tree in heap layout (node 1 the root, node i's children 2i and 2i + 1, leaf j at node
  // padded + j, the leaves padded to a power of two with empty ones). Each node holds the
  // leaf with the smallest key below it, 4 bytes; the keys stay in keys_, one per leaf. A
  // pass from a leaf carries its winner and the winner's key up and compares them with the
  // sibling's winner's key at each level: one comparison a level. (Nodes that also held
  // their winner's 16-byte key took 2.5 times the memory, 80 KiB at 256 workers and 256
  // servers, more than a core's first-level cache: 4 to 10 % more time,
  // docs/benchmarks.md "advise". A 4-ary tree, each node's four children in one cache
  // line, has half the levels but three comparisons each: 9-11 % more instructions in
  // all, docs/benchmarks.md "The simulator's event queue".) Equal keys happen only
  // between empty leaves (every event's sequence is unique), which are never popped.
  void rebuild() {
    std::size_t padded = 1;
    while (padded < leaves_) padded *= 2;
    padded_ = padded;
    // Padding leaves are empty (kEmptyKey) leaves of their own, never popped.
    keys_.resize(padded, kEmptyKey);
    tree_leaf_.assign(2 * padded, 0);
    for (std::size_t j = 0; j < padded; ++j) tree_leaf_[padded + j] = static_cast<std::uint32_t>(j);
    for (std::size_t p = padded; p-- > 1;) {
      const std::uint32_t l = tree_leaf_[2 * p], r = tree_leaf_[2 * p + 1];
      tree_leaf_[p] = keys_[r] < keys_[l] ? r : l;
    }
    root_ = tree_leaf_[1];
    tree_stale_ = false;
  }
  // A leaf's new key, and the pass up from it. (Deferring the pass until the tree is
  // read, so that popping a lane and scheduling its next event make one pass, was
  // measured slower: the pass then delays the next pop instead of overlapping the handler.)
  void set_key(std::size_t leaf, Key key) { pass<false>(leaf, key); }
  // The popped leaf's new key: it won every match on its way up, so every node on the
  // path changes and there is nothing to stop early for (no branch on the keys).
  void set_winner_key(std::size_t leaf, Key key) { pass<true>(leaf, key); }
  template <bool kToTheRoot>
  void pass(std::size_t leaf, Key key) {
    keys_[leaf] = key;
    if (tree_stale_) return;
    std::size_t i = padded_ + leaf;
    auto winner = static_cast<std::uint32_t>(leaf);
    Key k = key;
    while (i > 1) {
      const std::uint32_t other = tree_leaf_[i ^ 1];
      const Key ok = keys_[other];
      if (ok < k) {
        winner = other;
        k = ok;
      }
      i >>= 1;
      if constexpr (!kToTheRoot) {
        // Above a node whose winner neither changed nor is this leaf, nothing changes.
        if (tree_leaf_[i] == winner && winner != leaf) return;
      }
      tree_leaf_[i] = winner;
    }
    root_ = tree_leaf_[1];
  }

  // The binary heap of events without a lane, earliest at the front.
  void heap_push(Event e) {
    ++size_;
    std::size_t i = heap_.size();
    const Key key = key_of(e);
    heap_.push_back(std::move(e));
    Event x = std::move(heap_[i]);
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (key_of(heap_[parent]) < key) break;
      heap_[i] = std::move(heap_[parent]);
      i = parent;
    }
    heap_[i] = std::move(x);
    if (i == 0) set_key(0, key);
  }
  void sift_down(std::size_t i) {
    const std::size_t n = heap_.size();
    Event x = std::move(heap_[i]);
    const Key key = key_of(x);
    while (true) {
      std::size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && key_of(heap_[child + 1]) < key_of(heap_[child])) ++child;
      if (key < key_of(heap_[child])) break;
      heap_[i] = std::move(heap_[child]);
      i = child;
    }
    heap_[i] = std::move(x);
  }

  std::vector<Event> heap_;
  using Lane = FifoRing<Event>;
  std::vector<Lane> lanes_;
  std::vector<TimeNs> lane_last_;  // per lane: its last event's time (when not empty)
  // Per leaf: its earliest event's key; past the leaves_ real ones, the tree's padding
  // (empty leaves, never popped).
  std::vector<Key> keys_ = {kEmptyKey};
  std::size_t leaves_ = 1;                // the heap and the lanes
  std::vector<std::uint32_t> tree_leaf_;  // per node: the leaf with the smallest key below it
  std::size_t padded_ = 0;
  std::uint32_t root_ = 0;
  bool tree_stale_ = true;
  std::size_t size_ = 0;
  TimeNs now_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t fired_ = 0;
};

}  // namespace qs
