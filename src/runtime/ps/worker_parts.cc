#include "worker_parts.h"

#include <set>

namespace qs::runtime {

// ---- OutstandingUnits ----

std::uint64_t OutstandingUnits::tag_of(const PushUnit& u) {
  const TensorId t = u.chunk.tensor;
  const auto offset = static_cast<std::uint64_t>(u.chunk.offset);
  if (t < 0 || t >= (1 << 23) || offset >= (std::uint64_t{1} << 40)) return 0;
  return (static_cast<std::uint64_t>(t) + 1) << 40 | offset;
}

bool OutstandingUnits::add(const PushUnit& u) {
  const Key key{u.chunk.tensor, static_cast<std::uint64_t>(u.chunk.offset)};
  return units_.emplace(key, Entry{u}).second;
}

OutstandingUnits::Entry* OutstandingUnits::find_tag(std::uint64_t tag) {
  if (tag == 0) return nullptr;
  const Key key{static_cast<TensorId>((tag >> 40) - 1), tag & ((std::uint64_t{1} << 40) - 1)};
  auto it = units_.find(key);
  return it == units_.end() ? nullptr : &it->second;
}

OutstandingUnits::Entry* OutstandingUnits::match(transport::FrameKind kind, int server,
                                                 TensorId tensor, std::uint64_t offset,
                                                 Bytes length) {
  auto it = units_.find(Key{tensor, offset});
  if (it == units_.end()) return nullptr;
  Entry& e = it->second;
  const bool answered = kind == transport::FrameKind::kAck ? e.acked : e.pulled;
  if (e.unit.server != server || e.unit.chunk.length != length || answered) return nullptr;
  return &e;
}

PushUnit OutstandingUnits::answer(Entry* e, transport::FrameKind kind) {
  (kind == transport::FrameKind::kAck ? e->acked : e->pulled) = true;
  const PushUnit u = e->unit;
  if (e->acked && e->pulled)
    units_.erase(Key{u.chunk.tensor, static_cast<std::uint64_t>(u.chunk.offset)});
  return u;
}

std::string OutstandingUnits::owing() const {
  std::set<int> servers;
  for (const auto& [key, e] : units_) servers.insert(e.unit.server);
  std::string list;
  for (int s : servers) list += (list.empty() ? "" : ", ") + std::to_string(s);
  return list;
}

// ---- WorkerRecord ----

WorkerRecord::WorkerRecord(int worker_id, bool record_trace, int servers)
    : worker_id_(worker_id),
      record_trace_(record_trace),
      pull_header_at_(static_cast<std::size_t>(servers), 0) {}

void WorkerRecord::queue_delay(TimeNs delay, bool urgent) {
  delays_.add(delay);
  if (urgent) urgent_delays_.add(delay);
}

void WorkerRecord::repairs(std::int64_t retransmits, std::int64_t timeouts) {
  retransmits_.push_back(retransmits);
  if (timeouts >= 0) timeouts_.push_back(timeouts);
}

void WorkerRecord::pushed(TensorId t, std::size_t tensors, TimeNs now) {
  if (!record_trace_) return;
  if (first_push_.empty()) first_push_.assign(tensors, -1), last_pull_.assign(tensors, -1);
  TimeNs& f = first_push_[static_cast<std::size_t>(t)];
  if (f < 0) f = now;
}

void WorkerRecord::pull_began(int server, TimeNs now) {
  pull_header_at_[static_cast<std::size_t>(server)] = now;
}

void WorkerRecord::pulled(int server, TensorId t, TimeNs now) {
  if (!record_trace_) return;
  trace_.push_back(TraceSpan{worker_id_, 2, pull_header_at_[static_cast<std::size_t>(server)], now,
                             "pull " + std::to_string(t)});
  if (static_cast<std::size_t>(t) < last_pull_.size())
    last_pull_[static_cast<std::size_t>(t)] = now;
}

void WorkerRecord::transfers_ended(TimeNs now, const JobLayout& jl, const Profile& profile) {
  for (std::size_t t = 0; t < first_push_.size(); ++t) {
    if (first_push_[t] < 0) continue;
    const TensorInfo& info = jl.layout.tensor(static_cast<TensorId>(t));
    trace_.push_back(
        TraceSpan{worker_id_, 3, first_push_[t], last_pull_[t] < 0 ? now : last_pull_[t],
                  "grad " + std::to_string(t) + " " + std::to_string(info.bytes) + "B " +
                      profile.layers[static_cast<std::size_t>(info.layer)].name});
    first_push_[t] = last_pull_[t] = -1;
  }
}

void WorkerRecord::fill(WorkerReport& r, TimeNs first_backward_at) {
  r.queue_delay_p50 = delays_.percentile(50);
  r.queue_delay_p99 = delays_.percentile(99);
  r.queue_delay_max = delays_.percentile(100);
  r.urgent_delay_p50 = urgent_delays_.percentile(50);
  r.urgent_delay_p99 = urgent_delays_.percentile(99);
  r.urgent_delay_max = urgent_delays_.percentile(100);
  r.ack_rtt_p10 = ack_rtts_.percentile(10);
  r.ack_rtt_p50 = ack_rtts_.percentile(50);
  r.retransmits = retransmits_;
  r.timeouts = timeouts_;
  // The measured timeline, time 0 = the first backward pass (as in the simulator).
  for (TraceSpan& s : trace_) {
    s.start -= first_backward_at;
    s.end -= first_backward_at;
  }
  r.trace = std::move(trace_);
}

}  // namespace qs::runtime
