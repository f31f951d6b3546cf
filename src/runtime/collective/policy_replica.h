// Replicating worker 0's all-reduce policy on the other workers, over any engine
// (quicksilver/runtime/communicator.h): what is recorded, how it is replayed, and the
// channel that carries it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "quicksilver/core/mutex.h"
#include "quicksilver/core/status.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/communicator.h"

namespace qs::runtime {

// ---- replicating a policy whose decisions depend on timing ----
//
// DeFT decides its knapsacks from the links' backlog at the moment, so two workers may
// cut different buckets (one merges iteration i into i+1, the other does not), and
// ByteScheduler fuses whatever was handed over since its last cycle; no agreement on
// order can reconcile different buckets. Worker 0's policy therefore decides for all:
// it records every input it receives (the callback, its arguments and worker 0's time),
// and every other worker feeds the same inputs, in the same order and with the same
// times, to a replica of the policy, each input once the worker has reached the same
// point itself (its own backward of that layer, its own completion of that bucket). The
// replicas make exactly worker 0's decisions (the policies are deterministic state
// machines), and each worker's gates follow worker 0's schedule.

enum RecordKind : std::int32_t {
  kIterationStart = 1,
  kGradientReady,
  kForwardStart,
  kCollectiveDone,
  kTrainingEnd,
  kEndOfStream,
  kFeedback
};
struct PolicyRecord {
  std::int32_t kind = 0;
  std::int32_t layer = 0;
  std::int64_t iteration = 0;
  std::int64_t now = 0;
  std::uint64_t id = 0;  // kCollectiveDone: the bucket's id (the same on every replica)
  // kFeedback: TrainingFeedback's loss, grad_sq, noise, lr, batch (iteration above).
  double values[5] = {0, 0, 0, 0, 0};
};

PolicyRecord feedback_record(const TrainingFeedback& f, TimeNs now);
TrainingFeedback feedback_of(const PolicyRecord& r);

// A batch of worker 0's inputs; `crc`: the CRC32C of `count` and the records it counts,
// when the job has checksums. On the wire only the first `count` records follow the header
// (batch_bytes).
constexpr std::int64_t kBatchRecords = 64;
struct RecordBatch {
  std::uint32_t crc = 0;
  std::uint32_t reserved = 0;
  std::int64_t count = 0;
  PolicyRecord records[kBatchRecords];
};
// The bytes of a batch of `count` records on the wire: its header and those records.
constexpr std::size_t batch_bytes(std::int64_t count) {
  return offsetof(RecordBatch, records) + static_cast<std::size_t>(count) * sizeof(PolicyRecord);
}
static_assert(sizeof(PolicyRecord) == 72, "a record has no padding (its bytes are checksummed)");
// The CRC32C of `count` and the records it counts.
std::uint32_t batch_crc(const RecordBatch& b);
constexpr std::uint64_t kReplicaSlot = 8;

// Worker 0: its policy, every input recorded.
class RecordingPolicy final : public AllReducePolicy {
 public:
  RecordingPolicy(std::unique_ptr<AllReducePolicy> real,
                  std::function<void(const PolicyRecord&)> emit)
      : real_(std::move(real)), emit_(std::move(emit)) {}
  std::string_view name() const override { return real_->name(); }
  bool communicates() const override { return real_->communicates(); }
  ForwardGate forward_gate() const override { return real_->forward_gate(); }
  LinkDiscipline discipline() const override { return real_->discipline(); }
  bool fixed_order() const override { return real_->fixed_order(); }
  void on_iteration_start(std::int64_t it, TimeNs now, CollectiveSink& out) override {
    iteration_ = it;
    emit_({kIterationStart, 0, it, now, 0});
    real_->on_iteration_start(it, now, out);
  }
  void on_gradient_ready(int layer, TimeNs now, CollectiveSink& out) override {
    emit_({kGradientReady, layer, iteration_, now, 0});
    real_->on_gradient_ready(layer, now, out);
  }
  void on_forward_start(int layer, TimeNs now, CollectiveSink& out) override {
    emit_({kForwardStart, layer, iteration_, now, 0});
    real_->on_forward_start(layer, now, out);
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs now, CollectiveSink& out) override {
    emit_({kCollectiveDone, 0, 0, now, b.id});
    real_->on_collective_done(b, now, out);
  }
  void on_feedback(const TrainingFeedback& f, TimeNs now, CollectiveSink& out) override {
    emit_(feedback_record(f, now));
    real_->on_feedback(f, now, out);
  }
  bool forward_ready(int layer) const override { return real_->forward_ready(layer); }
  bool backward_ready() const override { return real_->backward_ready(); }
  std::int64_t merged_from(std::int64_t iteration) const override {
    return real_->merged_from(iteration);
  }
  void on_training_end(TimeNs now, CollectiveSink& out) override {
    emit_({kTrainingEnd, 0, -1, now, 0});
    real_->on_training_end(now, out);
  }
  std::vector<std::string> report() const override { return real_->report(); }

 private:
  std::unique_ptr<AllReducePolicy> real_;
  std::function<void(const PolicyRecord&)> emit_;
  std::int64_t iteration_ = 0;
};

// Workers 1..N-1: a replica fed worker 0's inputs. `observe` sees each input as it is
// applied (in worker 0's order, as worker 0's RecordingPolicy emitted it). `apart`: told
// once when this worker begins an iteration that worker 0, whose stream ended, never did.
class ReplicaPolicy final : public AllReducePolicy, CollectiveSink {
 public:
  ReplicaPolicy(std::unique_ptr<AllReducePolicy> real, std::function<void()> changed,
                std::function<void(const PolicyRecord&)> observe,
                std::function<void(const Status&)> apart)
      : real_(std::move(real)),
        changed_(std::move(changed)),
        observe_(std::move(observe)),
        apart_(std::move(apart)) {}
  std::string_view name() const override { return real_->name(); }
  bool communicates() const override { return real_->communicates(); }
  ForwardGate forward_gate() const override { return real_->forward_gate(); }
  LinkDiscipline discipline() const override { return real_->discipline(); }
  // This worker's own inputs only say how far it has come.
  void on_iteration_start(std::int64_t it, TimeNs, CollectiveSink& out) override {
    sink_ = &out;
    iteration_ = it;
    started_ = true;
    reached({kIterationStart, 0, it, 0, 0});
    check_apart();
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink&) override {
    reached({kGradientReady, layer, iteration_, 0, 0});
  }
  void on_forward_start(int layer, TimeNs, CollectiveSink&) override {
    reached({kForwardStart, layer, iteration_, 0, 0});
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs, CollectiveSink&) override {
    reached({kCollectiveDone, 0, 0, 0, b.id});
  }
  void on_training_end(TimeNs, CollectiveSink&) override { reached({kTrainingEnd, 0, -1, 0, 0}); }
  bool forward_ready(int layer) const override { return real_->forward_ready(layer); }
  // The range of an iteration whose start (worker 0's) was applied; -1 before. Asked in
  // increasing order of iterations (the staging's), so an answer forgets older ones.
  std::int64_t merged_from(std::int64_t iteration) const override {
    auto r = ranges_.find(iteration);
    if (r == ranges_.end()) return -1;
    const std::int64_t first = r->second;
    ranges_.erase(ranges_.begin(), r);
    return first;
  }
  // The replica's state is worker 0's at the last input both have reached. When this
  // worker is ahead of worker 0, that state is behind this worker's own, and its gate let
  // this worker start backward pass after backward pass, each staging a copy of its
  // gradients, with nothing to stop it (the soak grew a replica to 421 MB so:
  // docs/reliability.md). So this worker starts an iteration only once worker 0 has
  // started it (or ended its stream), and then asks the gate worker 0 asked; inputs the
  // two saw in another order (a completion before or after an iteration start) wait for
  // each other as before. deliver() reports a new iteration start of worker 0's.
  bool backward_ready() const override {
    const std::int64_t next = started_ ? iteration_ + 1 : 0;
    return (ended_ || worker0_started_ >= next) && real_->backward_ready();
  }
  std::vector<std::string> report() const override { return real_->report(); }

  // Worker 0's inputs, in its order (loop thread).
  void deliver(const PolicyRecord& r);
  // Worker 0 ended its stream and every input of it was applied.
  bool complete() const { return ended_ && pending_.empty(); }

 private:
  using Key = std::tuple<std::int32_t, std::int32_t, std::int64_t, std::uint64_t>;
  static Key key(const PolicyRecord& r) { return {r.kind, r.layer, r.iteration, r.id}; }

  // The replica's decisions go to the loop, remembered by id for their completion.
  void all_reduce(const CollectiveBucket& b, TimeNs delay) override {
    issued_[b.id] = b;
    sink_->all_reduce(b, delay);
  }

  // Worker 0's training ended before an iteration this worker began: the loops ended
  // apart, and this worker would wait on worker 0 for ever (its record of the end waits,
  // pending, for this worker's own end).
  void check_apart() {
    if (!worker0_ended_ || !started_ || iteration_ <= worker0_started_ || told_apart_) return;
    told_apart_ = true;
    apart_(invalid_argument(
        ended_apart("this worker trains", iteration_, "worker 0", worker0_started_)));
  }

  void reached(const PolicyRecord& r) {
    reached_.insert(key(r));
    if (r.kind == kTrainingEnd) ended_locally_ = true;
    drain();
  }

  // Applies what it can; true when it applied something (and told the loop).
  bool drain();

  void apply(const PolicyRecord& r);

  std::unique_ptr<AllReducePolicy> real_;
  std::function<void()> changed_;
  std::function<void(const PolicyRecord&)> observe_;
  std::function<void(const Status&)> apart_;
  bool told_apart_ = false;
  bool worker0_ended_ = false;      // worker 0's training ended (its kTrainingEnd delivered)
  CollectiveSink* sink_ = nullptr;  // the loop's (set by the first iteration start)
  std::int64_t iteration_ = 0;
  bool started_ = false;               // this worker began its first iteration
  std::int64_t worker0_started_ = -1;  // the latest iteration worker 0 began (its stream)
  std::deque<PolicyRecord> pending_;
  std::multiset<Key> reached_;
  std::unordered_map<std::uint64_t, CollectiveBucket> issued_;
  // merged_from of the iterations started since the staging last asked (a few).
  mutable std::map<std::int64_t, std::int64_t> ranges_;
  bool ended_ = false;          // worker 0's stream ended
  bool ended_locally_ = false;  // this worker's training ended
};

// Workers 1..N-1 of a policy whose buckets the job fixes (AllReducePolicy::fixed_order):
// each worker's own policy decides, and worker 0's stream carries only its iteration starts
// and its end (a record a pass, not every input), so that loops that end apart fail at once
// instead of waiting on each other: this worker going on after worker 0 ended, or worker 0
// going on after this worker ended. Loop thread only.
class EndWatch {
 public:
  explicit EndWatch(std::function<void(const Status&)> apart) : apart_(std::move(apart)) {}
  // This worker's own loop: it began iteration `it`; its training ended.
  void started(std::int64_t it);
  void ended();
  // Worker 0's records, in its order.
  void deliver(const PolicyRecord& r);
  // Worker 0's stream ended.
  bool complete() const { return stream_ended_; }

 private:
  void check();

  std::function<void(const Status&)> apart_;
  bool told_ = false;
  std::int64_t iteration_ = -1;        // the latest iteration this worker began
  bool ended_ = false;                 // this worker's training ended
  std::int64_t worker0_started_ = -1;  // the latest iteration worker 0 began
  bool worker0_ended_ = false;         // worker 0's training ended
  bool stream_ended_ = false;
};

// Own order (AllReducePolicy::fixed_order): `real`, deciding for this worker, with only its
// iteration starts and its end told: worker 0's to `record` (its stream to the others), a
// follower's to `watch` (non-null there).
std::unique_ptr<AllReducePolicy> own_order_policy(std::unique_ptr<AllReducePolicy> real,
                                                  std::function<void(const PolicyRecord&)> record,
                                                  EndWatch* watch);

// Carries worker 0's records to the other workers, in batches of up to 64, on the control
// channel, in order. Worker 0 sends (record, then end_stream), the others receive
// (`deliver`, called on the channel's thread with each batch). Failures go to `fail`
// (from the channel's thread); none once stop() began.
class ReplicationChannel {
 public:
  ReplicationChannel(Communicator& comm, bool checksums, TimeNs peer_timeout,
                     std::function<void(std::vector<PolicyRecord>)> deliver,
                     std::function<void(const Status&)> fail);
  ~ReplicationChannel() { stop(); }
  void start();
  // Worker 0: queues `r` for the others (any thread).
  void record(const PolicyRecord& r);
  // Worker 0: the end of the stream, and waits until it was sent.
  void end_stream();
  // Ends the thread (aborting a blocked send or receive).
  void stop();

 private:
  void send_loop();
  void receive_loop();

  Communicator& comm_;
  const bool checksums_;
  const TimeNs peer_timeout_;
  std::function<void(std::vector<PolicyRecord>)> deliver_;
  std::function<void(const Status&)> fail_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ QS_GUARDED_BY(mu_) = false;
  std::deque<PolicyRecord> records_ QS_GUARDED_BY(mu_);  // worker 0
  // The send or receive buffer: the channel's thread fills (sender: under mu_) and reads it.
  RecordBatch batch_;
  std::unique_ptr<ControlBuffer> buf_;
  std::thread thread_;
};

}  // namespace qs::runtime
