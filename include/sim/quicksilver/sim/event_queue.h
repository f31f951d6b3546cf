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
// (about 2 (N + M)), and an event costs one pass from its leaf to the root (log4 of the
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
#include "quicksilver/core/units.h"

namespace qs {

// A FIFO in a ring buffer (power-of-two capacity) that keeps its memory. pop() prefetches
// the element that will be the front after the next pop: a simulation keeps thousands of
// these (one per link), each touched again only thousands of events later, so the line it
// reads next is fetched while other work goes on.
template <typename T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  const T& front() const { return buf_[head_]; }
  const T& back() const { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
  void push(T v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  // Precondition: !empty().
  T pop() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
    if (size_ > 1) __builtin_prefetch(&buf_[(head_ + 1) & (buf_.size() - 1)]);
    // An emptied ring starts again at its first slot: a ring that holds one element at a
    // time (a link's next "free") keeps using one cache line.
    if (size_ == 0) head_ = 0;
    return v;
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
    keys_.push_back(kEmptyKey);
    tree_stale_ = true;
    return static_cast<int>(lanes_.size()) - 1;
  }
  // Schedules on `lane`: the same order as schedule(), cheaper when `at` is not earlier
  // than the lane's last event. Precondition: at >= now(), lane from add_lane().
  void schedule(TimeNs at, Payload p, int lane) {
    QS_CHECK_MSG(at >= now_, "event scheduled in the past");
    Lane& l = lanes_[static_cast<std::size_t>(lane)];
    if (l.empty()) {
      l.push(Event{at, next_seq_++, std::move(p)});
      ++size_;
      set_key(static_cast<std::size_t>(lane) + 1, key_of(l.front()));
    } else if (at >= l.back().time) {
      l.push(Event{at, next_seq_++, std::move(p)});
      ++size_;
    } else {
      heap_push(Event{at, next_seq_++, std::move(p)});
    }
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
      set_key(0, heap_.empty() ? kEmptyKey : key_of(heap_.front()));
    } else {
      Lane& l = lanes_[leaf - 1];
      e = l.pop();
      set_key(leaf, l.empty() ? kEmptyKey : key_of(l.front()));
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

  // The tournament tree over the leaves (0: the heap; 1 + i: lane i): a 4-ary winner
  // tree in heap layout (node 0 the root, node i's children 4i + 1 .. 4i + 4, the leaves
  // the last level, padded to a power of 4 with empty ones). Each node holds the leaf with
  // the smallest key below it and that key; a node's four children sit in one 64-byte
  // group, so a pass from a leaf to the root reads one cache line per level, half the
  // levels of a binary tree. Equal keys happen only between empty leaves (every event's
  // sequence is unique), which are never popped.
  struct alignas(64) Group {
    Key key[4];
  };
  struct Winners {
    std::uint32_t leaf[4];
  };
  void rebuild() {
    std::size_t padded = 4;
    while (padded < keys_.size()) padded *= 4;
    first_leaf_ = (padded - 1) / 3;
    // One group per internal node (nodes 0 .. first_leaf_ - 1): its children.
    keys_tree_.assign(first_leaf_, Group{{kEmptyKey, kEmptyKey, kEmptyKey, kEmptyKey}});
    leaves_tree_.assign(first_leaf_, Winners{{0, 0, 0, 0}});
    for (std::size_t j = 0; j < padded; ++j) {
      const std::size_t i = first_leaf_ + j;
      keys_tree_[(i - 1) / 4].key[(i - 1) % 4] = j < keys_.size() ? keys_[j] : kEmptyKey;
      leaves_tree_[(i - 1) / 4].leaf[(i - 1) % 4] =
          static_cast<std::uint32_t>(std::min(j, keys_.size() - 1));
    }
    for (std::size_t p = first_leaf_; p-- > 0;) {
      std::uint32_t w;
      const Key k = smallest(p, &w);
      if (p == 0) {
        root_ = w;
      } else {
        keys_tree_[(p - 1) / 4].key[(p - 1) % 4] = k;
        leaves_tree_[(p - 1) / 4].leaf[(p - 1) % 4] = w;
      }
    }
    tree_stale_ = false;
  }
  // The smallest key among node p's children, and its leaf.
  Key smallest(std::size_t p, std::uint32_t* leaf) const {
    const Key* k = keys_tree_[p].key;
    const std::uint32_t* w = leaves_tree_[p].leaf;
    const int a = k[1] < k[0] ? 1 : 0;
    const int b = k[3] < k[2] ? 3 : 2;
    const int c = k[b] < k[a] ? b : a;
    *leaf = w[c];
    return k[c];
  }
  // A leaf's new key, and the pass up from it. (Deferring the pass until the tree is
  // read, so that popping a lane and scheduling its next event make one pass, was
  // measured slower: the pass then delays the next pop instead of overlapping the handler.)
  void set_key(std::size_t leaf, Key key) {
    keys_[leaf] = key;
    if (tree_stale_) return;
    std::size_t i = first_leaf_ + leaf;
    keys_tree_[(i - 1) / 4].key[(i - 1) % 4] = key;
    while (true) {
      const std::size_t p = (i - 1) / 4;
      std::uint32_t w;
      const Key k = smallest(p, &w);
      if (p == 0) {
        root_ = w;
        return;
      }
      std::uint32_t& slot = leaves_tree_[(p - 1) / 4].leaf[(p - 1) % 4];
      // Above a node whose winner neither changed nor is this leaf, nothing changes.
      if (slot == w && w != leaf) return;
      slot = w;
      keys_tree_[(p - 1) / 4].key[(p - 1) % 4] = k;
      i = p;
    }
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
  using Lane = Ring<Event>;
  std::vector<Lane> lanes_;
  std::vector<Key> keys_ = {kEmptyKey};  // per leaf: its earliest event's key
  std::vector<Group> keys_tree_;         // by parent: its children's keys
  std::vector<Winners> leaves_tree_;     // by parent: its children's winning leaves
  std::size_t first_leaf_ = 0;
  std::uint32_t root_ = 0;
  bool tree_stale_ = true;
  std::size_t size_ = 0;
  TimeNs now_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t fired_ = 0;
};

}  // namespace qs
