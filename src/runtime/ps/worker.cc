// The Mercury worker (Mercury IV-C "Mercury Worker"): the one training loop
// (engine/training_loop.h) over three runtime seams: the node's event loop as its Timer,
// the GPU emulated from the profile as its Compute, and the TCP parameter-server transport
// as its Exchange (the sending buffer and its one sender across all server connections,
// acknowledgements, and the tensor constructor that writes pulled sums into the caller's
// buffers). One event-loop thread.
#include <algorithm>
#include <map>
#include <set>

#include "../runtime_internal.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/reservoir.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/tcp_connection.h"

namespace qs::runtime {

using transport::Connection;
using transport::FrameKind;
using transport::Header;
using transport::HeaderField;
using transport::PayloadTarget;

// The worker's Exchange is the TCP transport: Impl implements it, and the frame handler
// that feeds its acknowledgements and pulls back to the loop.
struct Worker::Impl final : transport::FrameHandler, PsExchange {
  struct Outstanding {
    PushUnit unit;
    bool acked = false;
    bool pulled = false;
    TimeNs in_kernel = -1;  // when its last byte was handed to the kernel
  };
  using Key = std::pair<TensorId, std::uint64_t>;
  // A unit's key as the Sender's tag (0: too large to pack; not measured).
  static std::uint64_t tag_of(TensorId t, std::uint64_t offset) {
    if (t < 0 || t >= (1 << 23) || offset >= (std::uint64_t{1} << 40)) return 0;
    return (static_cast<std::uint64_t>(t) + 1) << 40 | offset;
  }
  static Key key_of(std::uint64_t tag) {
    return Key{static_cast<TensorId>((tag >> 40) - 1), tag & ((std::uint64_t{1} << 40) - 1)};
  }

  explicit Impl(WorkerOptions o) : opts(std::move(o)), jl(opts.job) {}

  Status init() {
    const JobOptions& job = opts.job;
    if (opts.worker_id < 0 || opts.worker_id >= job.workers) {
      return invalid_argument("worker id " + std::to_string(opts.worker_id) + " not in [0, " +
                              std::to_string(job.workers) + ")");
    }
    if (static_cast<int>(opts.servers.size()) != job.servers) {
      return invalid_argument(std::to_string(opts.servers.size()) + " server addresses for " +
                              std::to_string(job.servers) + " servers");
    }
    if (!(opts.compute_factor >= 0)) return invalid_argument("compute factor must be >= 0");
    QS_ASSIGN_OR_RETURN(policy, make_ps_policy(job.policy, job.policy_options,
                                               jl.context(job, opts.compute_factor)));
    QS_ASSIGN_OR_RETURN(loop, transport::EventLoop::create());
    const int priorities = jl.layout.num_tensors() + 1;
    sender =
        std::make_unique<transport::Sender>(send_order(policy->discipline()), priorities, *loop);
    sender->set_batch_bytes(sender_batch_bytes(job));
    // Queueing delays after the warm-up (the last iteration counts when there is nothing
    // else), in reservoirs: a fixed memory whatever the run's length.
    sender->set_sample_callback([this](const transport::QueueSample& q) {
      if (iteration < opts.warmup && iteration + 1 < opts.job.iterations) return;
      delays.add(q.delay);
      if (q.priority < urgent_end) urgent_delays.add(q.delay);
    });
    sender->set_sent_callback([this](int, std::uint64_t tag) {
      if (tag == 0) return;
      auto it = outstanding.find(key_of(tag));
      if (it != outstanding.end()) it->second.in_kernel = loop->now();
    });
    // The tensors: the caller's, or synthetic ones with known content.
    source = opts.tensors;
    if (source == nullptr) {
      known = std::make_unique<KnownContent>(job.profile, opts.worker_id, job.workers, opts.verify,
                                             job.wire_dtype);
      source = known.get();
    }
    buffers = source->tensors();
    QS_RETURN_IF_ERROR(check_registry(buffers, jl.layout));
    pull_header_at.assign(static_cast<std::size_t>(job.servers), 0);
    for (const TensorInfo& t : jl.layout.tensors()) {  // in wire bytes
      rules.tensor_bytes.push_back(t.bytes / wire_scale);
      rules.element_size.push_back(t.element_size / wire_scale);
      // Compression: each tensor's gradient in the wire's dtype as it is pushed; its
      // pulled sum lands there too (a range is pulled only after this worker's push of it
      // was sent whole), then widens into TensorBuffer::sum.
      if (wire_scale > 1) wire_buf.emplace_back(static_cast<std::size_t>(t.bytes / wire_scale));
    }
    rules.num_priorities = static_cast<std::uint16_t>(priorities);
    urgent_end = jl.layout.end_tensor(0);
    // The loop and its seams.
    timer = std::make_unique<LoopTimer>(*loop);
    QS_ASSIGN_OR_RETURN(
        gpu, make_compute(opts.compute, *timer, job.profile, opts.compute_factor, *source,
                          opts.record_trace ? &trace : nullptr, opts.worker_id));
    LoopOptions lo;
    lo.iterations = job.iterations;
    if (opts.record_trace) lo.pushing = SpanRecorder(&trace, opts.worker_id, 1, false);
    lo.before_backward = [this](std::int64_t it) { return before_backward(it); };
    lo.iteration_ended = [this](std::int64_t it) { iteration_ended(it); };
    lo.finished = [this] { say_bye(); };
    lo.layer_ready = [this](int layer, std::int64_t it) {
      return source->on_layer_ready(layer, it);
    };
    lo.failed = [this](const Status& s) { loop->fail(s.with_context(name())); };
    training = std::make_unique<TrainingLoop>(job.profile, jl.layout, *policy, *timer, *gpu, *this,
                                              std::move(lo));
    return Status::ok();
  }

  std::string name() const { return "worker " + std::to_string(opts.worker_id); }
  std::string server_name(int s) const {
    const Endpoint& e = opts.servers[static_cast<std::size_t>(s)];
    return "server " + std::to_string(s) + " (" + e.host + ":" + std::to_string(e.port) + ")";
  }

  Result<WorkerReport> run() {
    Status s = run_inner();
    for (auto& c : conns) {
      if (c && !c->closed()) c->close(s.is_ok() ? Status::ok() : s, !s.is_ok());
    }
    if (!s.is_ok()) return s;
    return make_report();
  }

  Status run_inner() {
    const JobOptions& job = opts.job;
    const TimeNs deadline = loop->now() + job.connect_timeout;
    // Rendezvous: connect to every server (retrying until the deadline), then hello.
    for (int s = 0; s < job.servers; ++s) {
      const Endpoint& e = opts.servers[static_cast<std::size_t>(s)];
      auto conn = transport::connect_tcp_connection(*loop, e.host, e.port, deadline,
                                                    opts.secret.get(), kPsAuthContext,
                                                    socket_options(job), *this, server_name(s), s);
      if (!conn.is_ok()) return conn.status().with_context(name() + " -> " + server_name(s));
      if (congestion.empty()) congestion = (*conn)->congestion_control();
      conns.push_back(std::move(*conn));
      conns.back()->set_payload_checksums(job.payload_checksums);
      // Where the kernel offers them, transmit timestamps date when a push left the host
      // (check_drained; without them it falls back on acknowledgements).
      (void)conns.back()->enable_wire_timestamps();
      QS_RETURN_IF_ERROR(conns.back()->start());
      Header h;
      h.kind = FrameKind::kHello;
      h.sender = static_cast<std::uint16_t>(opts.worker_id);
      h.length = transport::kHelloBodySize;
      conns.back()->send_control(h, transport::encode_hello(hello_body(job)));
      QS_RETURN_IF_ERROR(conns.back()->flush());
    }
    std::vector<Connection*> raw;
    for (auto& c : conns) raw.push_back(c.get());
    sender->set_connections(raw);
    liveness.assign(conns.size(), Liveness());
    auto hello_timer = loop->schedule_at(deadline, [this] {
      loop->fail(unavailable(name() + ": only " + std::to_string(hellos) + " of " +
                             std::to_string(opts.job.servers) +
                             " servers answered hello before the deadline"));
    });
    QS_RETURN_IF_ERROR(loop->run([this] { return hellos == opts.job.servers; }));
    loop->cancel(hello_timer);
    // Training.
    last_progress = loop->now();
    bytes_at_start = bytes_written();
    (void)take_repairs();  // the baseline: what the rendezvous needed does not count
    schedule_watchdog();
    started = true;
    // finish() before training began (an open-ended run that trained nothing): say bye.
    if (finish_requested) {
      say_bye();
    } else {
      if (opts.on_training_start) opts.on_training_start();
      training->start();
    }
    QS_RETURN_IF_ERROR(loop->run([this] { return finished && all_flushed(); }));
    return Status::ok();
  }

  bool all_flushed() const {
    for (const auto& c : conns) {
      if (!c->closed() && !c->output_idle()) return false;
    }
    return true;
  }

  // Every tick: a heartbeat to each server this worker wrote nothing to; a server whose
  // connection carried nothing for peer_timeout is lost (it or the link stalled); and a
  // worker that waits (a forward gated, units not yet acknowledged or pulled) without a
  // pull or ack for 3 x peer_timeout names the servers it waits for.
  void schedule_watchdog() {
    loop->schedule_after(Liveness::period(opts.job), [this] {
      if (finished) return;
      const TimeNs now = loop->now();
      std::vector<int> silent, quiet_too;
      for (std::size_t s = 0; s < conns.size(); ++s) {
        const TimeNs quiet =
            liveness[s].tick(*conns[s], now, static_cast<std::uint16_t>(opts.worker_id));
        if (started && quiet > opts.job.peer_timeout) silent.push_back(static_cast<int>(s));
        // Two heartbeats missed: once one server is lost, this one is taken as lost too
        // (a link that went down silences every server within one heartbeat period of
        // each other, and the message should then name the link).
        if (started && quiet > opts.job.peer_timeout / 2) quiet_too.push_back(static_cast<int>(s));
      }
      if (!silent.empty()) {
        loop->fail(
            unavailable(silence_message(quiet_too.size() == conns.size() ? quiet_too : silent)));
        return;
      }
      const bool waiting = started && (training->blocked() || !outstanding.empty());
      if (waiting && now - last_progress > 3 * opts.job.peer_timeout) {
        std::set<int> owing;
        for (const auto& [key, o] : outstanding) owing.insert(o.unit.server);
        std::string list;
        for (int s : owing) list += (list.empty() ? "" : ", ") + std::to_string(s);
        loop->fail(unavailable(
            name() + ": waited " + format_time(now - last_progress) + " in iteration " +
            std::to_string(training->iteration()) + " for " + std::to_string(outstanding.size()) +
            " units from servers {" + list + "}" +
            (training->blocked()
                 ? " (forward of layer " + std::to_string(training->layer() + 1) + " waits)"
                 : "") +
            ", whose connections are alive (heartbeats): stuck?"));
        return;
      }
      schedule_watchdog();
    });
  }

  // "worker 1: lost server 0 (HOST:PORT) in iteration 5: nothing received for 3 s ...", or,
  // when every server is silent (M > 1), "lost every server (0, 1): ...".
  std::string silence_message(const std::vector<int>& silent) const {
    const std::string how = "nothing received for more than " + format_time(opts.job.peer_timeout);
    const std::string it = " in iteration " + std::to_string(iteration);
    if (silent.size() > 1 && silent.size() == conns.size()) {
      std::string list;
      for (int s : silent) list += (list.empty() ? "" : ", ") + std::to_string(s);
      return name() + ": lost every server (" + list + ")" + it + ": " + how +
             " from any (this host's link is down, or every server stalled)";
    }
    return name() + ": lost " + server_name(silent.front()) + it + ": " + how +
           ", heartbeats included (the server or the link stalled)";
  }

  // ---- the loop's runtime hooks ----
  bool before_backward(std::int64_t it) {
    iteration = it;
    if (it != opts.die_at_iteration) return true;
    loop->fail(
        unavailable(name() + " died at iteration " + std::to_string(it) + " (fault injection)"));
    for (auto& c : conns) c->close(unavailable("fault injection"), false, /*abort=*/true);
    return false;
  }

  // What the transport (TCP) repaired on this worker's connections since the last call.
  transport::TcpRepairs take_repairs() {
    std::vector<const Connection*> open;
    for (const auto& c : conns) {
      if (!c->closed()) open.push_back(c.get());
    }
    return repairs_counter.take(open);
  }

  void iteration_ended(std::int64_t it) {
    const transport::TcpRepairs r = take_repairs();
    retransmits.push_back(r.retransmitted_segments);
    if (r.timeouts >= 0) timeouts.push_back(r.timeouts);
  }

  void say_bye() {
    finished = true;
    for (auto& c : conns) {
      Header bye;
      bye.kind = FrameKind::kBye;
      bye.sender = static_cast<std::uint16_t>(opts.worker_id);
      bye.iteration =
          static_cast<std::uint32_t>(std::max<std::int64_t>(training->iterations_done() - 1, 0));
      c->send_control(bye);
      c->shutdown_when_flushed();
      Status s = c->flush();
      if (!s.is_ok()) loop->fail(s);
    }
  }

  std::uint64_t bytes_written() const {
    std::uint64_t b = 0;
    for (const auto& c : conns) b += c->bytes_written();
    return b;
  }

  // ---- Exchange: the policy's units onto the wire ----
  Status check(const PushUnit& u) const override {
    QS_RETURN_IF_ERROR(check_push_unit(u, jl.layout, jl.placement));
    // What the wire adds: a 32-bit length, whole float32 elements.
    if (u.chunk.length > 0xffffffffll || u.chunk.length % 4 != 0 || u.chunk.offset % 4 != 0) {
      return internal_error("bad unit: tensor " + std::to_string(u.chunk.tensor) + " offset " +
                            std::to_string(u.chunk.offset) + " length " +
                            std::to_string(u.chunk.length));
    }
    return Status::ok();
  }

  void push(const PushUnit& u) override {
    const Key key{u.chunk.tensor, static_cast<std::uint64_t>(u.chunk.offset)};
    if (!outstanding.emplace(key, Outstanding{u}).second) {
      loop->fail(internal_error(
          name() + ": policy pushed tensor " + std::to_string(u.chunk.tensor) + " offset " +
          std::to_string(u.chunk.offset) + " twice in iteration " + std::to_string(iteration)));
      return;
    }
    Header h;
    h.kind = FrameKind::kPush;
    h.sender = static_cast<std::uint16_t>(opts.worker_id);
    h.tensor = static_cast<std::uint32_t>(u.chunk.tensor);
    h.iteration = static_cast<std::uint32_t>(iteration);
    h.length = static_cast<std::uint32_t>(u.chunk.length);
    h.offset = static_cast<std::uint64_t>(u.chunk.offset);
    h.priority = static_cast<std::uint16_t>(u.priority);
    const auto ti = static_cast<std::size_t>(u.chunk.tensor);
    const auto* payload = reinterpret_cast<const std::byte*>(buffers[ti].gradient) + u.chunk.offset;
    if (wire_scale > 1) {  // rounded into the wire's dtype as it goes
      std::byte* w = wire_buf[ti].data() + u.chunk.offset / wire_scale;
      encode_floats(buffers[ti].gradient + u.chunk.offset / 4,
                    static_cast<std::size_t>(u.chunk.length / 4), opts.job.wire_dtype, w);
      payload = w;
      h.offset /= static_cast<std::uint64_t>(wire_scale);
      h.length /= static_cast<std::uint32_t>(wire_scale);
    }
    if (transport_since < 0) transport_since = loop->now();
    last_progress = loop->now();  // a wait begins with what was pushed
    if (opts.record_trace) {
      if (first_push.empty())
        first_push.assign(buffers.size(), -1), last_pull.assign(buffers.size(), -1);
      TimeNs& f = first_push[static_cast<std::size_t>(u.chunk.tensor)];
      if (f < 0) f = loop->now();
    }
    sender->enqueue(u.server, h, payload,
                    tag_of(u.chunk.tensor, static_cast<std::uint64_t>(u.chunk.offset)));
    bytes_pushed += u.chunk.length;
    ++units_pushed;
  }

  void flush() override {
    Status s = sender->pump();
    if (!s.is_ok()) loop->fail(s.with_context(name()));
    check_drained();
  }

  Traffic take_traffic(TimeNs now) override {
    // The iteration ended (every pull is in): each tensor's transfer, first push to last
    // pull (Prophet Fig. 11's start and end of a gradient's transfer).
    for (std::size_t t = 0; t < first_push.size(); ++t) {
      if (first_push[t] < 0) continue;
      const TensorInfo& info = jl.layout.tensor(static_cast<TensorId>(t));
      trace.push_back(
          TraceSpan{opts.worker_id, 3, first_push[t], last_pull[t] < 0 ? now : last_pull[t],
                    "grad " + std::to_string(t) + " " + std::to_string(info.bytes) + "B " +
                        opts.job.profile.layers[static_cast<std::size_t>(info.layer)].name});
      first_push[t] = last_pull[t] = -1;
    }
    if (transport_since >= 0) transport_total += now - transport_since;
    transport_since = -1;
    if (drain_timer != 0) loop->cancel(drain_timer);
    drain_timer = 0;
    const std::uint64_t written = bytes_written();
    Traffic t{bytes_pushed, units_pushed, written - bytes_at_start, transport_total, 0};
    t.float32_per_wire_byte = static_cast<double>(wire_scale);
    bytes_at_start = written;
    transport_total = 0;
    bytes_pushed = 0;
    units_pushed = 0;
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
  void check_drained() {
    const bool pushing = training->pushing();
    if (transport_since < 0 && !pushing) return;
    if (!sender->idle()) return;
    const bool pushing_done = training->all_ready_handed();
    if (transport_since < 0 && !pushing_done) return;  // only the policy holds bytes
    bool acked = true, out = true;
    TimeNs wire_end = -1;  // when the last byte left, where timestamps tell
    for (const auto& c : conns) {
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
    const TimeNs now = loop->now();
    if (acked && transport_since >= 0) {
      transport_total += now - transport_since;
      transport_since = -1;
    }
    if (out && pushing_done) training->on_drained(wire_end < 0 ? now : std::min(wire_end, now));
    const bool wait = transport_since >= 0 || (training->pushing() && pushing_done);
    if (wait && drain_timer == 0) {
      drain_timer = loop->schedule_after(kDrainPoll, [this] {
        drain_timer = 0;
        check_drained();
      });
    }
  }

  // ---- FrameHandler: hello, acks and pulls from servers ----
  Result<PayloadTarget> on_header(Connection& c, const Header& h) override {
    const int s = c.index();
    switch (h.kind) {
      case FrameKind::kHello:
      case FrameKind::kError:
      case FrameKind::kBye:
      case FrameKind::kHeartbeat:
        return PayloadTarget::buffer();
      case FrameKind::kAck:
      case FrameKind::kPull: {
        rules.kind = h.kind;
        rules.expected_sender = static_cast<std::uint16_t>(s);
        rules.min_iteration = rules.max_iteration = static_cast<std::uint32_t>(iteration);
        QS_RETURN_IF_ERROR(transport::validate_data_header(h, rules));
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset * wire_scale});
        if (it == outstanding.end() || it->second.unit.server != s ||
            it->second.unit.chunk.length != static_cast<Bytes>(h.length * wire_scale) ||
            (h.kind == FrameKind::kAck ? it->second.acked : it->second.pulled)) {
          return transport::header_error(HeaderField::kOffset,
                                         std::string(transport::frame_kind_name(h.kind)) +
                                             " of tensor " + std::to_string(h.tensor) + " bytes [" +
                                             std::to_string(h.offset) + ", " +
                                             std::to_string(h.offset + h.length) +
                                             ") matches no unit this worker pushed to server " +
                                             std::to_string(s) + " and awaits");
        }
        last_progress = loop->now();
        if (h.kind == FrameKind::kAck) return PayloadTarget::buffer();  // no payload
        pull_header_at[static_cast<std::size_t>(s)] = loop->now();
        if (wire_scale > 1) return PayloadTarget::to(wire_buf[h.tensor].data() + h.offset);
        return PayloadTarget::to(reinterpret_cast<std::byte*>(buffers[h.tensor].sum) + h.offset);
      }
      case FrameKind::kPush:
        break;
    }
    return transport::header_error(HeaderField::kKind, "a server may not send a push");
  }

  Status on_frame(Connection& c, const Header& h) override {
    const int s = c.index();
    switch (h.kind) {
      case FrameKind::kHello: {
        auto body = c.small_payload();
        const std::string diff =
            hello_mismatch(hello_body(opts.job), transport::decode_hello(body.data()));
        if (!diff.empty())
          return invalid_argument(name() + ": " + server_name(s) + " disagrees: " + diff);
        if (h.sender != s) {
          return transport::header_error(
              HeaderField::kSender,
              server_name(s) + " says it is server " + std::to_string(h.sender));
        }
        ++hellos;
        return Status::ok();
      }
      case FrameKind::kError: {
        auto text = c.small_payload();
        return unavailable(name() + ": " + server_name(s) + " reported: " +
                           std::string(reinterpret_cast<const char*>(text.data()), text.size()));
      }
      case FrameKind::kBye:
      case FrameKind::kHeartbeat:
        return Status::ok();
      case FrameKind::kAck: {
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset * wire_scale});
        it->second.acked = true;
        if (it->second.in_kernel >= 0 &&
            (iteration >= opts.warmup || iteration + 1 == opts.job.iterations)) {
          ack_rtts.add(loop->now() - it->second.in_kernel);
        }
        const PushUnit u = it->second.unit;
        if (it->second.pulled) outstanding.erase(it);
        training->on_push_acked(u);
        return Status::ok();
      }
      case FrameKind::kPull: {
        if (wire_scale > 1) {  // the sum, rounded by the server, widened into the model's buffer
          decode_floats(wire_buf[h.tensor].data() + h.offset,
                        h.length / static_cast<std::size_t>(4 / wire_scale), opts.job.wire_dtype,
                        buffers[h.tensor].sum + h.offset * wire_scale / 4);
        }
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset * wire_scale});
        it->second.pulled = true;
        const PushUnit u = it->second.unit;
        if (it->second.acked) outstanding.erase(it);
        if (opts.record_trace) {
          trace.push_back(TraceSpan{opts.worker_id, 2, pull_header_at[static_cast<std::size_t>(s)],
                                    loop->now(), "pull " + std::to_string(h.tensor)});
          if (h.tensor < last_pull.size()) last_pull[h.tensor] = loop->now();
        }
        // The tensor constructor: the loop counts the layer's bytes and releases a
        // complete layer (after the tensor source checked it).
        training->on_pulled(u, loop->now());
        return Status::ok();
      }
      case FrameKind::kPush:
        break;
    }
    return internal_error("unreachable");
  }

  void on_writable(Connection& c) override {
    Status s = sender->on_writable(c.index());
    if (!s.is_ok()) loop->fail(s.with_context(name()));
    check_drained();
  }

  void on_closed(Connection& c, const Status& why) override {
    if (finished || why.is_ok()) return;
    loop->fail(unavailable(name() + ": lost " + c.peer() + " in iteration " +
                           std::to_string(iteration) + ": " + why.to_string()));
  }

  WorkerReport make_report() {
    WorkerReport r;
    r.worker_id = opts.worker_id;
    r.policy = opts.job.policy;
    r.congestion_control = congestion;
    const bool timestamps =
        std::all_of(conns.begin(), conns.end(), [](const auto& c) { return c->wire_timestamps(); });
    r.push_end = timestamps ? "transmit timestamps" : "acknowledgements";
    std::vector<double> gbps;
    for (const IterationRecord& rec : training->records()) {
      r.iteration_times.push_back(rec.time);
      gbps.push_back(rec.gbps);
    }
    r.median_iteration = steady_median(r.iteration_times, opts.warmup);
    if (!training->records().empty()) {
      r.bytes_pushed_per_iteration = training->records().back().traffic.bytes;
      r.units_per_iteration = training->records().back().traffic.messages;
    }
    r.uplink_gbps = steady_median(gbps, opts.warmup);
    if (opts.nic_rate.bits_per_second > 0)
      r.uplink_utilisation = r.uplink_gbps / opts.nic_rate.gbps_value();
    r.queue_delay_p50 = delays.percentile(50);
    r.queue_delay_p99 = delays.percentile(99);
    r.queue_delay_max = delays.percentile(100);
    r.urgent_delay_p50 = urgent_delays.percentile(50);
    r.urgent_delay_p99 = urgent_delays.percentile(99);
    r.urgent_delay_max = urgent_delays.percentile(100);
    r.ack_rtt_p10 = ack_rtts.percentile(10);
    r.ack_rtt_p50 = ack_rtts.percentile(50);
    r.iterations_verified = known ? known->iterations_verified() : 0;
    r.retransmits = retransmits;
    r.timeouts = timeouts;
    r.notes = policy->report();
    // The measured timeline, time 0 = the first backward pass (as in the simulator).
    r.first_backward_at = training->first_backward_at();
    for (TraceSpan& s : trace) {
      s.start -= r.first_backward_at;
      s.end -= r.first_backward_at;
    }
    r.trace = std::move(trace);
    return r;
  }

  WorkerOptions opts;
  JobLayout jl;
  std::unique_ptr<PsPolicy> policy;
  std::unique_ptr<transport::EventLoop> loop;
  std::unique_ptr<transport::Sender> sender;
  std::vector<std::unique_ptr<Connection>> conns;  // by server id
  transport::DataRules rules;
  std::string congestion;
  int hellos = 0;
  // The tensors: the caller's registry (or the known-content source this worker owns).
  TensorSource* source = nullptr;
  std::unique_ptr<KnownContent> known;
  std::vector<TensorBuffer> buffers;  // by tensor id
  // Compression (JobOptions::wire_dtype): float32 bytes per wire byte (1: none), and each
  // tensor's bytes on the wire.
  std::uint64_t wire_scale =
      4 / static_cast<std::uint64_t>(transport::wire_dtype_size(opts.job.wire_dtype));
  std::vector<std::vector<std::byte>> wire_buf;
  // The loop and its seams (the exchange is this Impl).
  std::unique_ptr<LoopTimer> timer;
  std::unique_ptr<Compute> gpu;
  bool finish_requested = false;  // finish() came before training began
  bool started = false;           // training->start() ran (or bye was said instead)
  std::unique_ptr<TrainingLoop> training;
  std::int64_t iteration = 0;  // the loop's iteration, as stamped on the wire
  bool finished = false;
  std::vector<Liveness> liveness;             // by server
  TimeNs last_progress = 0;                   // the last push, ack or pull header
  std::vector<TimeNs> pull_header_at;         // by server: when the pull being read began
  std::vector<TraceSpan> trace;               // absolute times until make_report()
  std::vector<TimeNs> first_push, last_pull;  // per tensor, this iteration (record_trace)
  static constexpr TimeNs kDrainPoll = 100 * kNsPerUs;
  // Since when the transport holds undelivered bytes (-1: none), and this iteration's
  // total of such time (the bandwidth monitor's busy time).
  TimeNs transport_since = -1, transport_total = 0;
  transport::EventLoop::TimerId drain_timer = 0;
  std::map<Key, Outstanding> outstanding;  // pushed this iteration, not yet acked and pulled
  TensorId urgent_end = 0;
  // This iteration's traffic, and the queueing delays.
  std::uint64_t bytes_at_start = 0;
  Bytes bytes_pushed = 0;
  std::int64_t units_pushed = 0;
  Reservoir delays, urgent_delays;         // sending-buffer queueing delays (bounded)
  Reservoir ack_rtts;                      // acknowledgement round trips (bounded)
  transport::RepairTally repairs_counter;  // what the transport repaired since the last look
  std::vector<std::int64_t> retransmits, timeouts;  // per iteration
};

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

Result<std::unique_ptr<Worker>> Worker::create(WorkerOptions options) {
  QS_RETURN_IF_ERROR(validate_job(options.job));
  auto impl = std::make_unique<Impl>(std::move(options));
  QS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

Result<WorkerReport> Worker::run() { return impl_->run(); }
void Worker::request_stop(const std::string& why) { impl_->loop->request_stop(why); }
void Worker::post(std::function<void()> fn) { impl_->loop->post(std::move(fn)); }
void Worker::finish(std::int64_t iterations) {
  impl_->loop->post([impl = impl_.get(), iterations] {
    if (!impl->started) {
      impl->finish_requested = true;
      return;
    }
    impl->training->finish_early(iterations);
  });
}

Result<WorkerReport> run_worker(const WorkerOptions& options) {
  QS_ASSIGN_OR_RETURN(auto worker, Worker::create(options));
  return worker->run();
}

}  // namespace qs::runtime
