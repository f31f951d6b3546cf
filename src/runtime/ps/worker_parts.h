// Two parts of the PS worker (worker.cc) that know nothing of its connections: the units
// it pushed and still awaits (OutstandingUnits), and what it measures for its report
// (WorkerRecord). One thread (the worker's event loop).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../runtime_internal.h"
#include "quicksilver/core/reservoir.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

// The units pushed this iteration, until each is both acknowledged and pulled.
class OutstandingUnits {
 public:
  struct Entry {
    PushUnit unit;
    bool acked = false;
    bool pulled = false;
    TimeNs in_kernel = -1;  // when its last byte was handed to the kernel
  };
  // A unit's key as the Sender's tag (0: too large to pack; not measured).
  static std::uint64_t tag_of(const PushUnit& u);

  // False: the unit is outstanding already (a policy that pushed it twice).
  bool add(const PushUnit& u);
  // The unit of a Sender tag, or nullptr.
  Entry* find_tag(std::uint64_t tag);
  // The unit an acknowledgement or pull from `server` of (tensor, offset, length) in
  // float32 bytes answers, or nullptr: none pushed there, another cut, or answered already.
  Entry* match(transport::FrameKind kind, int server, TensorId tensor, std::uint64_t offset,
               Bytes length);
  // Marks `e` acknowledged or pulled; gone once it is both. Returns its unit.
  PushUnit answer(Entry* e, transport::FrameKind kind);

  bool empty() const { return units_.empty(); }
  std::size_t size() const { return units_.size(); }
  // The servers some unit waits for, "0, 2".
  std::string owing() const;

 private:
  using Key = std::pair<TensorId, std::uint64_t>;
  std::map<Key, Entry> units_;
};

// What a worker measures beyond the loop's own records: queueing delays in the sending
// buffer, acknowledgement round trips, what the transport repaired, and (record_trace) the
// timeline's transfer and pull spans.
class WorkerRecord {
 public:
  WorkerRecord(int worker_id, bool record_trace, int servers);

  void queue_delay(TimeNs delay, bool urgent);
  void ack_rtt(TimeNs rtt) { ack_rtts_.add(rtt); }
  void repairs(std::int64_t retransmits, std::int64_t timeouts);  // timeouts < 0: unknown
  // Trace: tensor t's first push this iteration; server s's pull header and its end.
  void pushed(TensorId t, std::size_t tensors, TimeNs now);
  void pull_began(int server, TimeNs now);
  void pulled(int server, TensorId t, TimeNs now);
  // Trace: the iteration's transfers, each tensor's first push to last pull (Prophet Fig.
  // 11's start and end of a gradient's transfer), as spans; `now` closes those unfinished.
  void transfers_ended(TimeNs now, const JobLayout& jl, const Profile& profile);

  // The spans the compute emulation adds to (null: no trace).
  std::vector<TraceSpan>* trace() { return record_trace_ ? &trace_ : nullptr; }
  // Fills the report's delays, round trips, repairs and trace, the trace's times from the
  // first backward pass.
  void fill(WorkerReport& r, TimeNs first_backward_at);

 private:
  const int worker_id_;
  const bool record_trace_;
  Reservoir delays_, urgent_delays_;                  // sending-buffer queueing delays (bounded)
  Reservoir ack_rtts_;                                // acknowledgement round trips (bounded)
  std::vector<std::int64_t> retransmits_, timeouts_;  // per iteration
  std::vector<TraceSpan> trace_;                      // absolute times until fill()
  std::vector<TimeNs> pull_header_at_;                // by server: the pull being read began
  std::vector<TimeNs> first_push_, last_pull_;        // per tensor, this iteration
};

}  // namespace qs::runtime
