// Sender: a node's sending buffer and its one sender across all its connections (Mercury
// IV-C "Sending Buffer" + "Worker Sender" / "PS Sender"; DESIGN.md "Transport and runtime").
//
// The sending buffer holds headers only (each entry points at payload memory owned by the
// caller). Under SendOrder::kPriority it is a qs::PriorityFifo keyed by the header's
// priority: the most urgent unit is found in O(1) and units of equal priority leave in
// the order they came. Under kFifo every unit goes to one FIFO (the baselines' ZeroMQ /
// ps-lite behaviour). Either way the order is strict: (priority, arrival) resp. arrival.
//
// A node's uplink is one resource, so one Sender chooses for all connections: it hands the
// head unit to its connection whenever that connection has no data frame in progress,
// then the next, and so on; it stops at the first head whose connection is still busy, so
// a unit is never overtaken by a less urgent one. Each connection holds at most one data
// frame beside the kernel's small unsent queue (TCP_NOTSENT_LOWAT), which bounds how far
// an urgent unit can be delayed by bytes already committed.
//
// Measured: per unit, the queueing delay from enqueue() until it is handed to its
// connection (the delay an urgent packet sees behind queued ones), given to the owner's
// SampleCallback as it happens (the Sender keeps none, so its memory does not grow with
// the run: issue 15), and the time the sender had backlog (units queued or a data frame
// unfinished), for "utilisation while pushing". Not thread-safe: loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "quicksilver/core/priority_fifo.h"
#include "quicksilver/core/status.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/connection.h"

namespace qs::transport {

enum class SendOrder { kFifo, kPriority };

struct QueueSample {
  int priority = 0;
  TimeNs delay = 0;  // enqueue -> handed to the connection
};

class Sender {
 public:
  // Called for every data frame fully handed to the kernel: (connection index, tag).
  using SentCallback = std::function<void(int conn, std::uint64_t tag)>;
  // Called for every unit handed to its connection, with its queueing delay.
  using SampleCallback = std::function<void(const QueueSample&)>;

  // Priorities 0..num_priorities-1. Precondition: num_priorities >= 1. The loop supplies
  // the clock and runs the continuation when one pump() call used its byte budget.
  Sender(SendOrder order, int num_priorities, EventLoop& loop);

  // The connections, by index (entries may be null until connected).
  void set_connections(std::vector<Connection*> conns) { conns_ = std::move(conns); }
  void set_sent_callback(SentCallback cb) { sent_ = std::move(cb); }
  // None set (the default): delays are not measured. The owner keeps what it needs in
  // bounded form (qs::Reservoir).
  void set_sample_callback(SampleCallback cb) { sample_ = std::move(cb); }
  // Up to this many bytes of consecutive units for one connection are committed together
  // and written with one sendmsg (fewer system calls and segments; bench/transport_bench).
  // They are taken in strict order within one pump, when no new unit can arrive, so the
  // order on the wire is the same as one frame per call; the cost is that an urgent unit
  // queued later may wait behind up to this much in user space, beside the kernel's
  // TCP_NOTSENT_LOWAT. 0 = one frame per call.
  void set_batch_bytes(std::uint64_t b) { batch_bytes_ = b; }
  SendOrder order() const { return order_; }

  // Queues a data frame for connection `conn`; payload valid until its SentCallback.
  // Precondition: h.priority < num_priorities.
  void enqueue(int conn, const Header& h, const std::byte* payload, std::uint64_t tag);
  // Hands units to free connections in order and writes what the sockets take. One call
  // hands over at most kPumpBudget bytes and then continues from a zero-delay timer, so a
  // fast peer cannot starve the loop's timers and reads. Errors: a connection failed or is
  // closed while units wait for it (also posted to the loop when it happens in a
  // continuation).
  Status pump();
  // A connection wrote (EPOLLOUT, or its owner flushed control frames): collect its
  // finished data frames (SentCallback) and pump.
  Status on_writable(int conn);

  // Nothing queued and no data frame unfinished.
  bool idle() const;
  std::size_t queued() const { return queue_.size(); }

  // Nanoseconds with backlog so far (closed intervals plus the open one).
  TimeNs busy_ns() const;
  std::uint64_t units_sent() const { return units_sent_; }

 private:
  struct Item {
    int conn;
    Header header;
    const std::byte* payload;
    std::uint64_t tag;
    TimeNs enqueued;
  };
  void collect(Connection& c);
  void update_busy();

  static constexpr std::uint64_t kPumpBudget = 1 << 20;

  SendOrder order_;
  EventLoop& loop_;
  const Clock& clock_;
  bool continuation_ = false;
  PriorityFifo<Item> queue_;
  std::vector<Connection*> conns_;
  SentCallback sent_;
  bool pumping_ = false, repump_ = false;
  SampleCallback sample_;
  bool busy_ = false;
  TimeNs busy_since_ = 0, busy_total_ = 0;
  std::uint64_t units_sent_ = 0;
  std::uint64_t batch_bytes_ = 256 * 1024;
};

// Percentile (0..100) of `v` by nearest rank; 0 for an empty vector. Sorts a copy.
TimeNs percentile(std::vector<TimeNs> v, double p);

}  // namespace qs::transport
