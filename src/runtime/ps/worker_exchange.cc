#include "worker_exchange.h"

#include <algorithm>

#include "quicksilver/core/check.h"

namespace qs::runtime {

using transport::FrameKind;
using transport::Header;
using transport::HeaderField;
using transport::PayloadTarget;

WorkerExchange::WorkerExchange(const WorkerOptions& opts, const JobLayout& jl,
                               QueueDiscipline discipline, transport::EventLoop& loop,
                               std::vector<TensorBuffer> buffers, WorkerRecord& record)
    : opts_(opts),
      jl_(jl),
      loop_(loop),
      record_(record),
      buffers_(std::move(buffers)),
      wire_scale_(4 / static_cast<std::uint64_t>(transport::wire_dtype_size(opts.job.wire_dtype))) {
  const int priorities = jl_.layout.num_tensors() + 1;
  sender_ = std::make_unique<transport::Sender>(send_order(discipline), priorities, loop_);
  sender_->set_batch_bytes(sender_batch_bytes(opts_.job));
  // Queueing delays after the warm-up (the last iteration counts when there is nothing
  // else), in reservoirs: a fixed memory whatever the run's length.
  sender_->set_sample_callback([this](const transport::QueueSample& q) {
    if (iteration_ < opts_.warmup && iteration_ + 1 < opts_.job.iterations) return;
    record_.queue_delay(q.delay, q.priority < urgent_end_);
  });
  sender_->set_sent_callback([this](int, std::uint64_t tag) {
    if (OutstandingUnits::Entry* e = outstanding_.find_tag(tag)) e->in_kernel = loop_.now();
  });
  for (const TensorInfo& t : jl_.layout.tensors()) {  // in wire bytes
    rules_.tensor_bytes.push_back(t.bytes / wire_scale_);
    rules_.element_size.push_back(t.element_size / wire_scale_);
    // Compression: each tensor's gradient in the wire's dtype as it is pushed; its
    // pulled sum lands there too (a range is pulled only after this worker's push of it
    // was sent whole), then widens into TensorBuffer::sum.
    if (wire_scale_ > 1) wire_buf_.emplace_back(static_cast<std::size_t>(t.bytes / wire_scale_));
  }
  rules_.num_priorities = static_cast<std::uint16_t>(priorities);
  urgent_end_ = jl_.layout.end_tensor(0);
}

void WorkerExchange::set_connections(std::vector<transport::Connection*> conns) {
  conns_ = conns;
  sender_->set_connections(std::move(conns));
}

void WorkerExchange::start(TrainingLoop* training) {
  training_ = training;
  last_progress_ = loop_.now();
  bytes_at_start_ = bytes_written();
}

std::uint64_t WorkerExchange::bytes_written() const {
  std::uint64_t b = 0;
  for (const auto& c : conns_) b += c->bytes_written();
  return b;
}

Status WorkerExchange::check(const PushUnit& u) const {
  QS_RETURN_IF_ERROR(check_push_unit(u, jl_.layout, jl_.placement));
  // What the wire adds: a 32-bit length, whole float32 elements.
  if (u.chunk.length > 0xffffffffll || u.chunk.length % 4 != 0 || u.chunk.offset % 4 != 0) {
    return internal_error("bad unit: tensor " + std::to_string(u.chunk.tensor) + " offset " +
                          std::to_string(u.chunk.offset) + " length " +
                          std::to_string(u.chunk.length));
  }
  return Status::ok();
}

void WorkerExchange::push(const PushUnit& u) {
  if (!outstanding_.add(u)) {
    loop_.fail(internal_error(name() + ": policy pushed tensor " + std::to_string(u.chunk.tensor) +
                              " offset " + std::to_string(u.chunk.offset) + " twice in iteration " +
                              std::to_string(iteration_)));
    return;
  }
  Header h;
  h.kind = FrameKind::kPush;
  h.sender = static_cast<std::uint16_t>(opts_.worker_id);
  h.tensor = static_cast<std::uint32_t>(u.chunk.tensor);
  h.iteration = static_cast<std::uint32_t>(iteration_);
  h.length = static_cast<std::uint32_t>(u.chunk.length);
  h.offset = static_cast<std::uint64_t>(u.chunk.offset);
  h.priority = static_cast<std::uint16_t>(u.priority);
  const auto ti = static_cast<std::size_t>(u.chunk.tensor);
  const auto* payload = reinterpret_cast<const std::byte*>(buffers_[ti].gradient) + u.chunk.offset;
  if (wire_scale_ > 1) {  // rounded into the wire's dtype as it goes
    std::byte* w = wire_buf_[ti].data() + u.chunk.offset / wire_scale_;
    encode_floats(buffers_[ti].gradient + u.chunk.offset / 4,
                  static_cast<std::size_t>(u.chunk.length / 4), opts_.job.wire_dtype, w);
    payload = w;
    h.offset /= static_cast<std::uint64_t>(wire_scale_);
    h.length /= static_cast<std::uint32_t>(wire_scale_);
  }
  if (transport_since_ < 0) transport_since_ = loop_.now();
  last_progress_ = loop_.now();  // a wait begins with what was pushed
  record_.pushed(u.chunk.tensor, buffers_.size(), loop_.now());
  sender_->enqueue(u.server, h, payload, OutstandingUnits::tag_of(u));
  bytes_pushed_ += u.chunk.length;
  ++units_pushed_;
}

void WorkerExchange::flush() {
  Status s = sender_->pump();
  if (!s.is_ok()) loop_.fail(s.with_context(name()));
  check_drained();
}

Traffic WorkerExchange::take_traffic(TimeNs now) {
  // The iteration ended (every pull is in).
  record_.transfers_ended(now, jl_, opts_.job.profile);
  if (transport_since_ >= 0) transport_total_ += now - transport_since_;
  transport_since_ = -1;
  if (drain_timer_ != 0) loop_.cancel(drain_timer_);
  drain_timer_ = 0;
  const std::uint64_t written = bytes_written();
  Traffic t{bytes_pushed_, units_pushed_, written - bytes_at_start_, transport_total_, 0};
  t.float32_per_wire_byte = static_cast<double>(wire_scale_);
  bytes_at_start_ = written;
  transport_total_ = 0;
  bytes_pushed_ = 0;
  units_pushed_ = 0;
  return t;
}

// "While pushing" (Mercury III-B, Fig. 6: the uplink's throughput averaged over the
// time push operations run), as the simulator counts it: from a layer's gradients being
// ready until every ready byte is on the wire (the loop keeps that period; this tells it
// when the wire has everything). Compute gaps in which every ready byte is on the wire
// do not count; a user-level scheduler's own waits (credit, stop-and-wait, startup
// time) do.
// "On the wire" is the transmit timestamp of the last byte written to each connection
// (taken by the driver, after the host's qdisc and any tc shaper queue). Where the kernel
// gives none, it is the servers' TCP acknowledgement instead (SIOCOUTQ = 0), one round
// trip later: on the emulated cluster that trip runs through two 2 ms shaper queues full
// of pulls, and cost 5-7 % of ResNet-50's push time.
// The transport's busy time (transport_since), which feeds the bandwidth monitor, ends
// at the acknowledgement in every case, as Prophet's monitor on BytePS times a push
// until the server answers (4.2). Either end is seen at most kDrainPoll late; the
// timestamp itself is exact.
void WorkerExchange::check_drained() {
  const bool pushing = training_->pushing();
  if (transport_since_ < 0 && !pushing) return;
  if (!sender_->idle()) return;
  const bool pushing_done = training_->all_ready_handed();
  if (transport_since_ < 0 && !pushing_done) return;  // only the policy holds bytes
  bool acked = true, out = true;
  TimeNs wire_end = -1;  // when the last byte left, where timestamps tell
  for (const auto& c : conns_) {
    if (c->closed()) continue;
    c->poll_wire();
    auto n = c->unconfirmed_bytes();
    const bool unacked = n.is_ok() && *n > 0;
    acked &= !unacked;
    if (c->wire_timestamps() && c->wire().bytes >= c->bytes_written()) {
      wire_end = std::max(wire_end, c->wire().at);
    } else {
      out &= !unacked;
    }
  }
  const TimeNs now = loop_.now();
  if (acked && transport_since_ >= 0) {
    transport_total_ += now - transport_since_;
    transport_since_ = -1;
  }
  if (out && pushing_done) training_->on_drained(wire_end < 0 ? now : std::min(wire_end, now));
  const bool wait = transport_since_ >= 0 || (training_->pushing() && pushing_done);
  if (wait && drain_timer_ == 0) {
    drain_timer_ = loop_.schedule_after(kDrainPoll, [this] {
      drain_timer_ = 0;
      check_drained();
    });
  }
}

Result<PayloadTarget> WorkerExchange::on_answer_header(const Header& h, int s) {
  rules_.kind = h.kind;
  rules_.expected_sender = static_cast<std::uint16_t>(s);
  rules_.min_iteration = rules_.max_iteration = static_cast<std::uint32_t>(iteration_);
  QS_RETURN_IF_ERROR(transport::validate_data_header(h, rules_));
  if (outstanding_.match(h.kind, s, static_cast<TensorId>(h.tensor), h.offset * wire_scale_,
                         static_cast<Bytes>(h.length * wire_scale_)) == nullptr) {
    return transport::header_error(
        HeaderField::kOffset,
        std::string(transport::frame_kind_name(h.kind)) + " of tensor " + std::to_string(h.tensor) +
            " bytes [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.length) +
            ") matches no unit this worker pushed to server " + std::to_string(s) + " and awaits");
  }
  last_progress_ = loop_.now();
  if (h.kind == FrameKind::kAck) return PayloadTarget::buffer();  // no payload
  record_.pull_began(s, loop_.now());
  if (wire_scale_ > 1) return PayloadTarget::to(wire_buf_[h.tensor].data() + h.offset);
  return PayloadTarget::to(reinterpret_cast<std::byte*>(buffers_[h.tensor].sum) + h.offset);
}

// The unit it answers is the one on_answer_header matched.
Status WorkerExchange::on_answer(const Header& h, int s) {
  OutstandingUnits::Entry* e =
      outstanding_.match(h.kind, s, static_cast<TensorId>(h.tensor), h.offset * wire_scale_,
                         static_cast<Bytes>(h.length * wire_scale_));
  if (h.kind == FrameKind::kAck) {
    if (e->in_kernel >= 0 &&
        (iteration_ >= opts_.warmup || iteration_ + 1 == opts_.job.iterations)) {
      record_.ack_rtt(loop_.now() - e->in_kernel);
    }
    const PushUnit u = outstanding_.answer(e, FrameKind::kAck);
    training_->on_push_acked(u);
    return Status::ok();
  }
  if (wire_scale_ > 1) {  // the sum, rounded by the server, widened into the model's buffer
    decode_floats(wire_buf_[h.tensor].data() + h.offset,
                  h.length / static_cast<std::size_t>(4 / wire_scale_), opts_.job.wire_dtype,
                  buffers_[h.tensor].sum + h.offset * wire_scale_ / 4);
  }
  const PushUnit u = outstanding_.answer(e, FrameKind::kPull);
  record_.pulled(s, static_cast<TensorId>(h.tensor), loop_.now());
  // The tensor constructor: the loop counts the layer's bytes and releases a
  // complete layer (after the tensor source checked it).
  training_->on_pulled(u, loop_.now());
  return Status::ok();
}

void WorkerExchange::on_writable(int index) {
  Status s = sender_->on_writable(index);
  if (!s.is_ok()) loop_.fail(s.with_context(name()));
  check_drained();
}

}  // namespace qs::runtime
