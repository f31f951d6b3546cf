#include "policy_replica.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "quicksilver/core/check.h"
#include "quicksilver/core/thread_name.h"
#include "quicksilver/transport/crc32c.h"

namespace qs::runtime {

PolicyRecord feedback_record(const TrainingFeedback& f, TimeNs now) {
  PolicyRecord r{kFeedback, 0, f.iteration, now, 0};
  r.values[0] = f.loss, r.values[1] = f.grad_sq, r.values[2] = f.noise, r.values[3] = f.lr,
  r.values[4] = f.batch;
  return r;
}

TrainingFeedback feedback_of(const PolicyRecord& r) {
  TrainingFeedback f;
  f.iteration = r.iteration;
  f.loss = r.values[0], f.grad_sq = r.values[1], f.noise = r.values[2], f.lr = r.values[3],
  f.batch = r.values[4];
  return f;
}
std::uint32_t batch_crc(const RecordBatch& b) {
  const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(b.count, 0, kBatchRecords));
  return transport::crc32c(transport::crc32c(0, &b.count, sizeof b.count), b.records,
                           n * sizeof(PolicyRecord));
}
void ReplicaPolicy::deliver(const PolicyRecord& r) {
  pending_.push_back(r);
  worker0_ended_ |= r.kind == kTrainingEnd;
  const bool news =
      (r.kind == kIterationStart && r.iteration > worker0_started_) || r.kind == kEndOfStream;
  if (r.kind == kIterationStart) worker0_started_ = std::max(worker0_started_, r.iteration);
  if (!drain() && news) changed_();  // a held backward pass may go now
  check_apart();
}
bool ReplicaPolicy::drain() {
  bool applied = false;
  while (!pending_.empty()) {
    const PolicyRecord r = pending_.front();
    if (r.kind == kEndOfStream) {
      ended_ = true;
      pending_.pop_front();
      continue;
    }
    if (r.kind == kFeedback) {  // worker 0's measurements: no point of this worker's to wait for
      pending_.pop_front();
      apply(r);
      applied = true;
      continue;
    }
    auto at = reached_.find(key(r));
    // A run ended early (PyTorch: the user's loop decides) may have let worker 0 begin an
    // iteration this worker never will: once this worker's training ended, worker 0's
    // compute-chain inputs are applied as they come (the replica's state stays worker
    // 0's); completions still wait for this worker's own.
    const bool moot = ended_locally_ && r.kind != kCollectiveDone && r.kind != kTrainingEnd;
    if (at == reached_.end() && !moot) break;  // this worker is not there yet
    if (at != reached_.end()) reached_.erase(at);
    pending_.pop_front();
    apply(r);
    applied = true;
  }
  if (applied) changed_();
  return applied;
}

void ReplicaPolicy::apply(const PolicyRecord& r) {
  // Seen before it is applied, as worker 0's RecordingPolicy emits before its policy
  // acts: a bucket the input makes the policy issue comes after the input in both.
  if (observe_) observe_(r);
  switch (r.kind) {
    case kIterationStart:
      real_->on_iteration_start(r.iteration, r.now, *this);
      ranges_[r.iteration] = real_->merged_from(r.iteration);
      break;
    case kGradientReady:
      real_->on_gradient_ready(r.layer, r.now, *this);
      break;
    case kForwardStart:
      real_->on_forward_start(r.layer, r.now, *this);
      break;
    case kCollectiveDone: {
      auto b = issued_.find(r.id);
      QS_CHECK(b != issued_.end());  // this worker completed it, so its replica issued it
      real_->on_collective_done(b->second, r.now, *this);
      issued_.erase(b);
      break;
    }
    case kTrainingEnd:
      real_->on_training_end(r.now, *this);
      break;
    case kFeedback:
      real_->on_feedback(feedback_of(r), r.now, *this);
      break;
    default:
      break;
  }
}

void EndWatch::started(std::int64_t it) {
  iteration_ = it;
  check();
}

void EndWatch::ended() {
  ended_ = true;
  check();
}

void EndWatch::deliver(const PolicyRecord& r) {
  if (r.kind == kIterationStart) worker0_started_ = std::max(worker0_started_, r.iteration);
  worker0_ended_ |= r.kind == kTrainingEnd;
  stream_ended_ |= r.kind == kEndOfStream;
  check();
}

void EndWatch::check() {
  if (told_) return;
  if (worker0_ended_ && iteration_ > worker0_started_) {
    told_ = true;
    apart_(invalid_argument(
        ended_apart("this worker trains", iteration_, "worker 0", worker0_started_)));
  } else if (ended_ && worker0_started_ > iteration_) {
    told_ = true;
    apart_(invalid_argument(
        ended_apart("worker 0 trains", worker0_started_, "this worker", iteration_)));
  }
}

std::unique_ptr<AllReducePolicy> own_order_policy(std::unique_ptr<AllReducePolicy> real,
                                                  std::function<void(const PolicyRecord&)> record,
                                                  EndWatch* watch) {
  return std::make_unique<RecordingPolicy>(
      std::move(real), [record = std::move(record), watch](const PolicyRecord& r) {
        if (r.kind != kIterationStart && r.kind != kTrainingEnd) return;
        if (watch == nullptr) {
          record(r);
        } else if (r.kind == kIterationStart) {
          watch->started(r.iteration);
        } else {
          watch->ended();
        }
      });
}

ReplicationChannel::ReplicationChannel(Communicator& comm, bool checksums, TimeNs peer_timeout,
                                       std::function<void(std::vector<PolicyRecord>)> deliver,
                                       std::function<void(const Status&)> fail)
    : comm_(comm),
      checksums_(checksums),
      peer_timeout_(peer_timeout),
      deliver_(std::move(deliver)),
      fail_(std::move(fail)) {}

void ReplicationChannel::start() {
  // The buffer exists before its thread starts, so that stop can abort it.
  buf_ = comm_.control_buffer(&batch_, sizeof batch_);
  thread_ = std::thread([this] {
    name_this_thread("qs-replica");
    comm_.rank() == 0 ? send_loop() : receive_loop();
  });
}

void ReplicationChannel::record(const PolicyRecord& r) {
  {
    MutexLock lock(mu_);
    records_.push_back(r);
  }
  cv_.notify_all();
}

void ReplicationChannel::end_stream() {
  record(PolicyRecord{kEndOfStream, 0, 0, 0, 0});
  if (thread_.joinable()) thread_.join();  // the sender leaves once the end is sent
}

void ReplicationChannel::stop() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  // An abort before the wait began is kept for the next wait.
  while (thread_.joinable()) {
    if (comm_.rank() != 0) {
      buf_->abort_recv();
    } else {
      buf_->abort_send();
    }
    thread_.join();
  }
}

void ReplicationChannel::send_loop() {
  try {
    while (true) {
      bool end = false;
      {
        MutexLock lock(mu_);
        while (!stopping_ && records_.empty()) cv_.wait(mu_);
        if (records_.empty()) return;  // stopping
        batch_.count = 0;
        while (!records_.empty() && batch_.count < kBatchRecords) {
          end |= records_.front().kind == kEndOfStream;
          batch_.records[batch_.count++] = records_.front();
          records_.pop_front();
        }
        batch_.crc = checksums_ ? batch_crc(batch_) : 0;
      }
      // The batch's records only: a batch of one record is 88 bytes, not the buffer's 4.6 KB
      // (the control channel shares the hosts' links with the gradients).
      const std::size_t bytes = batch_bytes(batch_.count);
      for (int r = 1; r < comm_.size(); ++r) {
        try {
          buf_->send(r, kReplicaSlot, bytes);
          if (!buf_->wait_send(peer_timeout_)) return;  // aborted: stopping
        } catch (const std::exception& e) {
          throw std::runtime_error("lost worker " + std::to_string(r) + ": " + e.what());
        }
      }
      if (end) return;
    }
  } catch (const std::exception& ex) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    fail_(unavailable(std::string("replicating the policy: ") + ex.what()));
  }
}

void ReplicationChannel::receive_loop() {
  try {
    while (true) {
      // A batch is as long as its records: none of the last one's may pass for this one's.
      batch_.count = 0;
      std::memset(static_cast<void*>(batch_.records), 0, sizeof batch_.records);
      buf_->recv({0}, kReplicaSlot);
      if (!buf_->wait_recv(nullptr, 24 * 3600 * kNsPerSec)) return;  // aborted: stopping
      if (checksums_ && batch_crc(batch_) != batch_.crc) {
        throw PeerError(0,
                        "corrupted data from worker 0: a batch of its policy's inputs failed its "
                        "CRC32C check; not applied");
      }
      const std::int64_t n = batch_.count;
      const bool malformed =
          n < 1 || n > kBatchRecords ||
          std::any_of(batch_.records, batch_.records + n, [](const PolicyRecord& r) {
            return r.kind < kIterationStart || r.kind > kFeedback;
          });
      if (malformed) {
        throw PeerError(0, "malformed data from worker 0: a batch of its policy's inputs counts " +
                               std::to_string(n) +
                               " records, or one of an unknown kind; not applied (does worker 0 "
                               "run another version of Quicksilver?)");
      }
      std::vector<PolicyRecord> got(batch_.records, batch_.records + n);
      bool end = false;
      for (const PolicyRecord& r : got) end |= r.kind == kEndOfStream;
      deliver_(std::move(got));
      if (end) return;
    }
  } catch (const std::exception& ex) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    const bool named = dynamic_cast<const PeerError*>(&ex) != nullptr;
    fail_(unavailable(std::string(named ? "" : "lost worker 0 (its policy's decisions): ") +
                      ex.what()));
  }
}

}  // namespace qs::runtime
