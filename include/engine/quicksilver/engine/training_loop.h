// TrainingLoop: the one training loop of a worker, written once and driven by the
// simulator and the runtime alike (DESIGN.md "engine"). It owns
//   - the compute chain (Mercury V-A): backward of layers L..1, then for each layer 1..L
//     its update and forward, each forward waiting for its gate;
//   - the forward gate: PS and kPerLayer, a layer's forward waits for its own parameters;
//     kAfterAll, for every collective of the iteration (MG-WFBP Algorithm 2 line 12);
//     kPolicy, for the policy's word (DeFT's delayed updates), which also holds the next
//     backward;
//   - the policy: every callback, and the checks of every decision it makes (a faulty
//     policy is an error naming what is wrong, never a corrupt run);
//   - the metrics: iteration times, link utilisation "while pushing" (Mercury III-B), the
//     bandwidth monitor fed back to the policy (Prophet 4.2), byte accounting.
// It talks to the world through three seams: Timer (now, callbacks), Compute (run a step,
// say when it ended) and Exchange (move gradient units, report their sums). It never reads
// a clock, a socket or an environment variable itself.
//
// One loop per worker. The simulator's PS engine runs N of them over one event queue; its
// all-reduce engine one (workers are symmetric in a collective); a runtime worker one over
// its event loop. Single-threaded: every call on the Timer's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quicksilver/core/fifo_ring.h"
#include "quicksilver/core/status.h"
#include "quicksilver/engine/compute.h"
#include "quicksilver/engine/exchange.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/engine/trace.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/policy/ps_policy.h"

namespace qs {

struct LoopOptions {
  int iterations = 1;  // iterations to train (warm-up included)
  // Check that every gradient byte of every iteration was pushed and pulled (reduced)
  // exactly once (the simulator's verify_bytes; costs time).
  bool verify_bytes = false;
  // All-reduce only: tell the policy an iteration started (on_iteration_start) when its
  // first gradient is ready rather than when its backward may begin. For real compute in
  // an open-ended run (PyTorch), where the user's loop may end instead of computing
  // another backward (finish_early): the policy must not plan for an iteration that never
  // comes (DeFT would merge it into a range that is never complete).
  bool start_on_first_gradient = false;
  // Where the "pushing" periods go (track 1 of the runtime's measured timeline); none by default.
  SpanRecorder pushing;
  // Runtime hooks (all optional): before an iteration's backward (false: stop here, as a
  // crashed worker would; fault injection); after an iteration ended; after the last one;
  // when a layer's parameters are complete (the tensor source checks the sums; an error
  // stops the loop): PS, when its last unit of this iteration is pulled; all-reduce, when
  // its last byte of this iteration is reduced (not for buckets that merged iterations
  // already past: DeFT's delayed updates).
  std::function<bool(std::int64_t iteration)> before_backward;
  std::function<void(std::int64_t iteration)> iteration_ended;
  std::function<void()> finished;
  std::function<Status(int layer, std::int64_t iteration)> layer_ready;
  // Called with the first error (after which the loop does nothing more).
  std::function<void(const Status&)> failed;
};

// What the loop measured of one iteration.
struct IterationRecord {
  TimeNs time = 0;     // from the start of bp^L to the end of the next fp^L (Mercury V)
  TimeNs pushing = 0;  // PS: time some ready gradient was not yet on the wire
  Traffic traffic;     // what the exchange sent
  // Link utilisation: PS, traffic.busy / pushing (1 when nothing was pending; 0 for the
  // oracle); all-reduce, traffic.busy / traffic.window.
  double utilisation = 0;
  double gbps = 0;  // PS: 8 * traffic.wire_bytes / pushing, in Gbit/s (0: no pushing)
};

// Workers whose loops ended apart, as every runtime says it: "<going_on> iteration
// <iteration> but <ended> ended after iteration <last>: every worker must train the same
// number of iterations" (going_on "worker 1 pushes", ended "worker 0").
std::string ended_apart(const std::string& going_on, std::int64_t iteration,
                        const std::string& ended, std::int64_t last);

class TrainingLoop final : public ExchangeListener {
 public:
  // A parameter-server worker. The references must outlive the loop.
  TrainingLoop(const Profile& profile, const TensorLayout& layout, PsPolicy& policy, Timer& timer,
               Compute& compute, PsExchange& exchange, LoopOptions options);
  // The all-reduce loop (one stands for every worker).
  TrainingLoop(const Profile& profile, const TensorLayout& layout, AllReducePolicy& policy,
               Timer& timer, Compute& compute, CollectiveExchange& exchange, LoopOptions options);
  ~TrainingLoop() override;
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  // Begins iteration 0 (its backward, or its backward gate).
  void start();
  // Ends training early, at an iteration boundary, for a loop whose length its driver
  // does not know in advance (PyTorch: the user's loop decides; LoopOptions::iterations is
  // then a bound, not a plan). If the current iteration has begun computing (a backward
  // step ended), it is the last one: the run finishes when its forward pass ends. If not
  // (its first backward step has not ended: the Compute will never end it), the run
  // finishes now, without it; the Compute must then drop that pending step. No effect once
  // finished. Every worker of a job must end after the same iteration.
  // `iterations` >= 0: the driver knows how many iterations its compute produced gradients
  // for (PyTorch: the backward passes the model ran), and the run trains exactly those,
  // whatever the loop has begun yet (a backward held at its gate, a step whose end is
  // still queued).
  void finish_early(std::int64_t iterations = -1);
  // Iterations completed so far (== options.iterations once finished).
  std::int64_t iterations_done() const { return static_cast<std::int64_t>(records_.size()); }
  bool finished() const { return iterations_done() >= options_.iterations; }
  // The current iteration and the layer of the running or blocked step.
  std::int64_t iteration() const { return iteration_; }
  int layer() const { return layer_; }
  // Whether the forward of layer() waits for its gate.
  bool blocked() const { return blocked_; }
  const Status& error() const { return error_; }
  const std::vector<IterationRecord>& records() const { return records_; }
  // records()'s times: how long each completed iteration took.
  std::vector<TimeNs> durations() const;
  // When the first backward pass began (time 0 of a measured timeline).
  TimeNs first_backward_at() const { return first_backward_at_; }

  // Asks the forward and backward gates again: for a policy whose state changed outside
  // the loop's callbacks (the runtime's replicated DeFT, which learns of worker 0's
  // decisions asynchronously). Loop thread only; not from inside a policy callback.
  void recheck_gates();
  // Real training's measurements (AllReducePolicy::on_feedback); ignored by the PS
  // architecture and after training ended.
  void feedback(const TrainingFeedback& f);

  // After the run (the event queue drained): the all-reduce byte accounting (every byte of
  // every iteration reduced exactly once, with verify_bytes exactly once per range).
  Status check_complete() const;

  // ExchangeListener.
  void on_push_acked(const PushUnit& unit) override;
  void on_pulled(const PushUnit& unit, TimeNs at) override;
  void on_collective_done(const CollectiveBucket& bucket) override;
  void on_drained(TimeNs at) override;
  bool pushing() const override { return pending_since_ >= 0; }
  bool all_ready_handed() const override { return handed_bytes_ >= ready_bytes_; }
  void on_error(Status why) override { fail(std::move(why)); }

 private:
  class PsSink;
  class CollectiveSinkImpl;

  TrainingLoop(const Profile& profile, const TensorLayout& layout, Timer& timer, Compute& compute,
               Exchange& exchange, LoopOptions options);
  bool communicates() const;
  void begin_iteration(std::int64_t it);
  void try_backward();
  void run_backward(int layer, TimeNs earliest);
  void on_backward_done(TimeNs end);
  bool gate_open(int layer) const;
  void try_forward(int layer, bool was_blocked);
  void on_forward_done(TimeNs end);
  void end_iteration(TimeNs end);
  void end_training(TimeNs now);
  void layer_complete(int layer, TimeNs at);
  void end_pending(TimeNs end);
  void hand_over(const PushUnit& unit);
  void hand_over(const CollectiveBucket& bucket);
  void push_decision(const PushUnit& unit, TimeNs delay);
  void all_reduce_decision(const CollectiveBucket& bucket, TimeNs delay);
  Status check_bucket(const CollectiveBucket& b) const;
  void fail(Status s);

  const Profile& profile_;
  const TensorLayout& layout_;
  PsPolicy* ps_ = nullptr;  // exactly one of ps_ and ar_ is set
  AllReducePolicy* ar_ = nullptr;
  Timer& timer_;
  Compute& compute_;
  Exchange& exchange_;
  PsExchange* ps_exchange_ = nullptr;          // PS: exchange_
  CollectiveExchange* ar_exchange_ = nullptr;  // all-reduce: exchange_
  LoopOptions options_;
  std::unique_ptr<PsSink> ps_sink_;
  std::unique_ptr<CollectiveSinkImpl> ar_sink_;
  Status error_;

  // The chain.
  std::int64_t iteration_ = 0;
  int layer_ = 0;
  bool backward_ = true;
  bool blocked_ = false;           // the forward of layer_ waits for its gate
  bool waiting_backward_ = false;  // the backward of iteration_ waits for its gate
  bool backward_held_ = false;     // ... and the gate was closed when first asked
  bool start_pending_ = false;     // start_on_first_gradient: on_iteration_start not yet called
  TimeNs iteration_start_ = 0, last_end_ = 0, first_backward_at_ = 0;
  std::vector<Bytes> layer_got_;  // this iteration's bytes summed, per layer
  std::vector<TimeNs> ready_at_;  // when each layer's parameters were complete (-1: not yet)
  Bytes got_total_ = 0;

  // "While pushing" (PS): gradient bytes made ready this iteration, handed to the exchange,
  // since when some are not yet on the wire (-1: none), and the iteration's total.
  Bytes ready_bytes_ = 0, handed_bytes_ = 0;
  TimeNs pending_since_ = -1, pending_total_ = 0;
  Rate monitor_{0};  // the bandwidth monitor's last estimate (0: none yet)
  // A policy's delayed pushes (its startup time) until they are due (Prophet at 64 KiB
  // partitions delays thousands of units an iteration). Those due no earlier than the last
  // one queued wait in a FIFO, and each of their callbacks hands over its front: the timer
  // fires no callback before its time, so the front, due no later than the callback's own
  // unit, is due too, and a timer that fires in (time, scheduling) order, as the
  // simulator's does, hands each unit over at its own callback. Read in sequence: no cache
  // miss a unit where thousands are pending. The others wait by slot, the callback
  // carrying the slot (small enough for std::function to keep without allocating).
  FifoRing<PushUnit> delayed_fifo_;
  TimeNs delayed_fifo_last_ = 0;  // the due time of the last unit queued in the FIFO
  std::vector<PushUnit> delayed_;
  std::vector<std::uint32_t> delayed_free_;

  // Accounting and verification.
  std::vector<Bytes> reduced_per_iteration_;  // all-reduce
  std::vector<std::vector<Chunk>> covered_;   // all-reduce, with verify_bytes
  std::vector<Chunk> pushed_, pulled_;        // PS, with verify_bytes
  std::vector<IterationRecord> records_;
};

}  // namespace qs
