// A second collective engine, for tests: every rank a thread of one process, an
// all-reduce a rendezvous in memory (quicksilver/runtime/communicator.h). It shows that an
// engine is one class: CollectiveWorker runs on it unchanged (collective_engine_test.cc).
// Sums are taken in rank order (a chain, not gloo's ring: with two ranks the same
// rounding); nothing crosses a wire, so checksums and tampering do not apply.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "quicksilver/runtime/communicator.h"
#include "runtime/runtime_internal.h"  // reduce_bf16, reduce_fp16

namespace qs::runtime::testing {

class InProcessWorld {
 public:
  InProcessWorld(int ranks, int links, TimeNs timeout = 60 * kNsPerSec)
      : ranks_(ranks), links_(links), timeout_(timeout), channels_(links + 1) {
    for (Channel& c : channels_) c.data.resize(static_cast<std::size_t>(ranks));
  }
  std::unique_ptr<Communicator> communicator(int rank);

  // A channel's collective: the last rank to arrive reduces into every rank's buffer.
  void all_reduce(int rank, int link, void* data, std::size_t count, ReduceOp op) {
    Channel& c = channels_[static_cast<std::size_t>(link + 1)];
    std::unique_lock lock(c.mu);
    if (c.arrived == 0) {
      c.count = count, c.op = op;
    } else if (c.count != count || c.op != op) {
      throw std::runtime_error("ranks called different all-reduces on link " +
                               std::to_string(link));
    }
    if (c.closed >= 0) throw closed_error(c.closed);
    c.data[static_cast<std::size_t>(rank)] = data;
    if (++c.arrived == ranks_) {
      reduce_all(c);
      c.arrived = 0;
      ++c.generation;
      c.cv.notify_all();
      return;
    }
    const std::uint64_t gen = c.generation;
    if (!c.cv.wait_for(lock, std::chrono::nanoseconds(timeout_),
                       [&] { return c.generation != gen || c.closed >= 0; })) {
      throw std::runtime_error("in-process all-reduce on link " + std::to_string(link) +
                               ": not every rank came");
    }
    if (c.generation == gen) throw closed_error(c.closed);
  }

  // Communicator::close: a rank waiting in a collective, or for a control message from
  // `rank`, fails now naming it (as a reset connection does on gloo).
  void close(int rank) {
    for (Channel& c : channels_) {
      {
        std::lock_guard lock(c.mu);
        if (c.closed < 0) c.closed = rank;
      }
      c.cv.notify_all();
    }
    {
      std::lock_guard lock(mail_mu_);
      closed_.push_back(rank);
    }
    mail_cv_.notify_all();
  }

  // Control messages: copied at send, queued per (receiver, slot), taken in order.
  struct Message {
    int from;
    std::vector<char> bytes;
  };
  void post(int to, std::uint64_t slot, int from, const void* data, std::size_t n) {
    {
      std::lock_guard lock(mail_mu_);
      const char* p = static_cast<const char*>(data);
      mail_[{to, slot}].push_back(Message{from, std::vector<char>(p, p + n)});
      sent_.push_back({slot, n});
    }
    mail_cv_.notify_all();
  }
  // Waits for a message to `to` under `slot` from one of `from`; false when `aborted`
  // (reset). Throws after the world's timeout.
  bool take(int to, std::uint64_t slot, const std::vector<int>& from, void* data, std::size_t n,
            int* sender, bool* aborted, TimeNs timeout) {
    std::unique_lock lock(mail_mu_);
    std::deque<Message>& q = mail_[{to, slot}];
    std::deque<Message>::iterator it;
    int gone = -1;  // a rank of `from` that closed
    const bool got = mail_cv_.wait_for(lock, std::chrono::nanoseconds(timeout), [&] {
      if (*aborted) return true;
      it = std::find_if(q.begin(), q.end(), [&](const Message& m) {
        return std::find(from.begin(), from.end(), m.from) != from.end();
      });
      if (it != q.end()) return true;
      for (int r : closed_) {
        if (std::find(from.begin(), from.end(), r) != from.end()) gone = r;
      }
      return gone >= 0;
    });
    if (*aborted) {
      *aborted = false;
      return false;
    }
    if (!got) throw std::runtime_error("in-process control message: timed out");
    if (it == q.end()) throw closed_error(gone);
    std::memcpy(data, it->bytes.data(), std::min(n, it->bytes.size()));
    if (sender != nullptr) *sender = it->from;
    q.erase(it);
    return true;
  }
  void wake() {
    { std::lock_guard lock(mail_mu_); }
    mail_cv_.notify_all();
  }
  std::mutex& mail_mu() { return mail_mu_; }
  // Every control message posted so far: its slot and its bytes.
  std::vector<std::pair<std::uint64_t, std::size_t>> sent() {
    std::lock_guard lock(mail_mu_);
    return sent_;
  }
  int ranks() const { return ranks_; }
  int links() const { return links_; }
  TimeNs timeout() const { return timeout_; }

 private:
  static PeerError closed_error(int rank) {
    return PeerError(rank, "worker " + std::to_string(rank) + " closed its connections");
  }

  struct Channel {
    int closed = -1;  // the first rank that closed
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    std::uint64_t generation = 0;
    std::size_t count = 0;
    ReduceOp op = ReduceOp::kSumFloat32;
    std::vector<void*> data;
  };
  template <typename T, typename F>
  void chain(Channel& c, F f) {
    std::vector<T> acc(static_cast<const T*>(c.data[0]),
                       static_cast<const T*>(c.data[0]) + c.count);
    for (std::size_t r = 1; r < c.data.size(); ++r) {
      const T* x = static_cast<const T*>(c.data[r]);
      for (std::size_t i = 0; i < c.count; ++i) acc[i] = f(acc[i], x[i]);
    }
    for (void* d : c.data) std::memcpy(d, acc.data(), c.count * sizeof(T));
  }
  void reduce_all(Channel& c) {
    if (c.count == 0) return;  // a barrier
    switch (c.op) {
      case ReduceOp::kSumFloat32:
        return chain<float>(c, [](float a, float b) { return a + b; });
      case ReduceOp::kSumFloat64:
        return chain<double>(c, [](double a, double b) { return a + b; });
      case ReduceOp::kMaxFloat64:
        return chain<double>(c, [](double a, double b) { return std::max(a, b); });
      case ReduceOp::kSumBFloat16:
      case ReduceOp::kSumFloat16: {
        auto fn = c.op == ReduceOp::kSumBFloat16 ? &reduce_bf16 : &reduce_fp16;
        std::vector<std::uint16_t> acc(static_cast<const std::uint16_t*>(c.data[0]),
                                       static_cast<const std::uint16_t*>(c.data[0]) + c.count);
        for (std::size_t r = 1; r < c.data.size(); ++r)
          fn(acc.data(), acc.data(), c.data[r], c.count);
        for (void* d : c.data) std::memcpy(d, acc.data(), c.count * 2);
        return;
      }
    }
  }

  const int ranks_, links_;
  const TimeNs timeout_;
  std::vector<Channel> channels_;  // kControl first, then the links
  std::mutex mail_mu_;
  std::condition_variable mail_cv_;
  std::map<std::pair<int, std::uint64_t>, std::deque<Message>> mail_;
  std::vector<std::pair<std::uint64_t, std::size_t>> sent_;
  std::vector<int> closed_;  // ranks that closed, guarded by mail_mu_
};

class InProcessControlBuffer final : public ControlBuffer {
 public:
  InProcessControlBuffer(InProcessWorld& w, int rank, void* data, std::size_t n)
      : w_(w), rank_(rank), data_(data), n_(n) {}
  void send(int to, std::uint64_t slot, std::size_t bytes) override {
    if (bytes > n_) throw std::logic_error("in-process control message: longer than its buffer");
    w_.post(to, slot, rank_, data_, bytes);
  }
  bool wait_send(TimeNs) override {
    std::lock_guard lock(w_.mail_mu());
    if (abort_send_) {
      abort_send_ = false;
      return false;
    }
    return true;  // delivered at send
  }
  void recv(const std::vector<int>& from, std::uint64_t slot) override {
    from_ = from, slot_ = slot;
  }
  bool wait_recv(int* from, TimeNs timeout) override {
    return w_.take(rank_, slot_, from_, data_, n_, from, &abort_recv_, timeout);
  }
  void abort_send() override {
    std::lock_guard lock(w_.mail_mu());
    abort_send_ = true;
  }
  void abort_recv() override {
    {
      std::lock_guard lock(w_.mail_mu());
      abort_recv_ = true;
    }
    w_.wake();
  }

 private:
  InProcessWorld& w_;
  const int rank_;
  void* data_;
  const std::size_t n_;
  std::vector<int> from_;
  std::uint64_t slot_ = 0;
  bool abort_send_ = false, abort_recv_ = false;  // guarded by the world's mail_mu
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessWorld& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_.ranks(); }
  int links() const override { return w_.links(); }
  void all_reduce(int link, void* data, std::size_t count, ReduceOp op,
                  const AllReduceCall&) override {
    w_.all_reduce(rank_, link, data, count, op);
  }
  std::unique_ptr<ControlBuffer> control_buffer(void* data, std::size_t bytes) override {
    return std::make_unique<InProcessControlBuffer>(w_, rank_, data, bytes);
  }
  void barrier() override { w_.all_reduce(rank_, kControl, nullptr, 0, ReduceOp::kSumFloat32); }
  void close() override { w_.close(rank_); }

 private:
  InProcessWorld& w_;
  const int rank_;
};

inline std::unique_ptr<Communicator> InProcessWorld::communicator(int rank) {
  return std::make_unique<InProcessCommunicator>(*this, rank);
}

}  // namespace qs::runtime::testing
