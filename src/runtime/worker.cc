// The Mercury worker (Mercury IV-C "Mercury Worker"): compute emulation, the policy, the
// sending buffer and its one sender across all server connections, and the tensor
// constructor that writes pulled sums into the parameter buffer. One event-loop thread.
#include <algorithm>
#include <map>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/event_loop.h"
#include "runtime_internal.h"

namespace qs::runtime {

using transport::Connection;
using transport::FrameKind;
using transport::Header;
using transport::HeaderField;
using transport::PayloadTarget;

struct Worker::Impl final : transport::FrameHandler, PushSink {
  struct Outstanding {
    PushUnit unit;
    bool acked = false;
    bool pulled = false;
  };
  using Key = std::pair<TensorId, std::uint64_t>;

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
    QS_ASSIGN_OR_RETURN(policy, make_ps_policy(job.policy, job.policy_options, jl.context(job)));
    QS_ASSIGN_OR_RETURN(loop, transport::EventLoop::create());
    const int priorities = jl.layout.num_tensors() + 1;
    sender = std::make_unique<transport::Sender>(send_order(policy->discipline()), priorities, *loop);
    sender->set_batch_bytes(sender_batch_bytes(job));
    tensor_base.resize(static_cast<std::size_t>(jl.layout.num_tensors()));
    std::size_t floats = 0;
    for (const TensorInfo& t : jl.layout.tensors()) {
      tensor_base[static_cast<std::size_t>(t.id)] = floats;
      floats += static_cast<std::size_t>(t.bytes / 4);
    }
    grads.assign(floats, 0.0f);
    params.assign(floats, 0.0f);
    layer_pulled.assign(static_cast<std::size_t>(jl.layout.num_layers()), 0);
    layer_ready.assign(static_cast<std::size_t>(jl.layout.num_layers()), false);
    ready_at.assign(static_cast<std::size_t>(jl.layout.num_layers()), 0);
    pull_header_at.assign(static_cast<std::size_t>(job.servers), 0);
    for (const TensorInfo& t : jl.layout.tensors()) {
      rules.tensor_bytes.push_back(t.bytes);
      rules.element_size.push_back(t.element_size);
    }
    rules.num_priorities = static_cast<std::uint16_t>(priorities);
    urgent_end = jl.layout.end_tensor(0);
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
      auto fd = transport::connect_tcp(e.host, e.port, deadline);
      if (!fd.is_ok()) return fd.status().with_context(name() + " -> " + server_name(s));
      QS_RETURN_IF_ERROR(transport::configure_socket(fd->get(), socket_options(job)).with_context(name()));
      if (congestion.empty()) {
        auto cc = transport::congestion_of(fd->get());
        if (cc.is_ok()) congestion = *cc;
      }
      conns.push_back(std::make_unique<Connection>(*loop, std::move(*fd), *this, server_name(s), s));
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
    auto hello_timer = loop->schedule_at(deadline, [this] {
      loop->fail(unavailable(name() + ": only " + std::to_string(hellos) + " of " +
                             std::to_string(opts.job.servers) + " servers answered hello before the deadline"));
    });
    QS_RETURN_IF_ERROR(loop->run([this] { return hellos == opts.job.servers; }));
    loop->cancel(hello_timer);
    // Training.
    last_rx = loop->now();
    schedule_watchdog();
    start_backward(0);
    QS_RETURN_IF_ERROR(loop->run([this] { return finished && all_flushed(); }));
    return Status::ok();
  }

  bool all_flushed() const {
    for (const auto& c : conns) {
      if (!c->closed() && !c->output_idle()) return false;
    }
    return true;
  }

  void schedule_watchdog() {
    loop->schedule_after(std::max<TimeNs>(opts.job.peer_timeout / 4, kNsPerMs), [this] {
      if (finished) return;
      // Bytes still streaming in (a long payload) count as life, not only headers.
      std::uint64_t read = 0;
      for (const auto& c : conns) read += c ? c->bytes_read() : 0;
      if (read != rx_bytes_seen) {
        rx_bytes_seen = read;
        last_rx = loop->now();
      }
      const bool waiting = blocked || !outstanding.empty();
      if (waiting && loop->now() - last_rx > opts.job.peer_timeout) {
        loop->fail(unavailable(name() + ": no frame from any server for " +
                               format_time(opts.job.peer_timeout) + " in iteration " +
                               std::to_string(iteration) + " (" + std::to_string(outstanding.size()) +
                               " units not yet pulled" +
                               (blocked ? "; forward of layer " + std::to_string(layer + 1) + " waits" : "") +
                               ")"));
        return;
      }
      schedule_watchdog();
    });
  }

  // ---- compute chain (Mercury V-A; as sim/ps_engine.cc) ----
  TimeNs scaled(TimeNs t) const {
    return static_cast<TimeNs>(static_cast<double>(t) * opts.compute_factor + 0.5);
  }

  void start_backward(std::int64_t it) {
    if (it == opts.die_at_iteration) {
      loop->fail(unavailable(name() + " died at iteration " + std::to_string(it) + " (fault injection)"));
      for (auto& c : conns) c->close(unavailable("fault injection"), false, /*abort=*/true);
      return;
    }
    const TimeNs now = loop->now();
    iteration = it;
    // The emulated GPU runs back to back: each op starts when the previous one was due
    // to end (or when its parameters arrived), never late by the loop's wake-up latency.
    if (compute_free == 0) compute_free = now;
    iteration_start = compute_free;
    if (it == 0) trace_origin = iteration_start;
    blocked = false;
    std::fill(layer_pulled.begin(), layer_pulled.end(), 0);
    std::fill(layer_ready.begin(), layer_ready.end(), false);
    bytes_at_start = bytes_written();
    transport_total = 0;
    bytes_pushed = 0;
    units_pushed = 0;
    ready_bytes = 0;
    pending_total = 0;
    // The bandwidth monitor (Prophet 4.2: "the available network bandwidth of workers"):
    // the previous iteration's bytes over the time the transport held undelivered bytes
    // (check_drained). As in the simulator (bytes over uplink busy time), the policy's
    // own waits do not count: a monitor that saw Prophet's waits as a slower network
    // would make it wait longer still.
    if (monitor_bps > 0) policy->on_bandwidth_estimate(Rate{static_cast<std::int64_t>(monitor_bps)}, now);
    policy->on_iteration_start(it, now, *this);
    pump();
    run_backward(jl.layout.num_layers() - 1);
  }

  void run_backward(int l) {
    layer = l;
    const TimeNs start = compute_free;
    if (opts.verify) {
      // The backward "produces" this layer's gradients; filling overlaps the emulated wait.
      for (TensorId t = jl.layout.first_tensor(l); t < jl.layout.end_tensor(l); ++t) {
        const TensorInfo& ti = jl.layout.tensor(t);
        fill_gradient(grads.data() + tensor_base[static_cast<std::size_t>(t)], ti.bytes / 4, 0,
                      opts.worker_id, iteration, t);
      }
    }
    const TimeNs d = scaled(job_layer(l).backward);
    compute_free = start + d;
    record(0, start, compute_free, "bp " + job_layer(l).name);
    loop->schedule_at(compute_free, [this] { on_backward_done(); });
  }

  const LayerSpec& job_layer(int l) const { return opts.job.profile.layers[static_cast<std::size_t>(l)]; }

  void on_backward_done() {
    const int l = layer;
    if (const Bytes b = jl.layout.layer_bytes(l); b > 0) {
      ready_bytes += b;
      if (pending_since < 0) pending_since = loop->now();
    }
    policy->on_gradient_ready(l, loop->now(), *this);
    pump();
    if (l > 0) {
      run_backward(l - 1);
    } else {
      try_forward(0);
    }
  }

  void try_forward(int l) {
    layer = l;
    if (!layer_ready[static_cast<std::size_t>(l)]) {
      blocked = true;
      return;
    }
    blocked = false;
    const TimeNs start = std::max(compute_free, ready_at[static_cast<std::size_t>(l)]);
    policy->on_forward_start(l, loop->now(), *this);
    pump();
    const LayerSpec& spec = job_layer(l);
    compute_free = start + scaled(spec.update + spec.forward);
    record(0, start, compute_free, "fp " + spec.name);
    loop->schedule_at(compute_free, [this] { on_forward_done(); });
  }

  void on_forward_done() {
    if (layer + 1 < jl.layout.num_layers()) {
      try_forward(layer + 1);
      return;
    }
    end_iteration();
  }

  void end_iteration() {
    iteration_times.push_back(compute_free - iteration_start);
    end_spans();
    // The uplink rate while pushing: bytes on the wire over the time some ready gradient
    // was not yet delivered (check_drained).
    const auto bytes = static_cast<double>(bytes_written() - bytes_at_start);
    const auto pending = static_cast<double>(pending_total);
    gbps.push_back(pending > 0 ? 8.0 * bytes / pending : 0.0);
    const auto busy = static_cast<double>(transport_total);
    monitor_bps = busy > 0 ? 8e9 * bytes / busy : 0.0;
    bytes_per_iteration = bytes_pushed;
    units_per_iteration = units_pushed;
    for (const transport::QueueSample& q : sender->take_samples()) {
      if (iteration < opts.warmup && iteration + 1 < opts.job.iterations) continue;
      delays.push_back(q.delay);
      if (q.priority < urgent_end) urgent_delays.push_back(q.delay);
    }
    if (opts.verify) ++verified;
    if (iteration + 1 < opts.job.iterations) {
      start_backward(iteration + 1);
      return;
    }
    finished = true;
    for (auto& c : conns) {
      Header bye;
      bye.kind = FrameKind::kBye;
      bye.sender = static_cast<std::uint16_t>(opts.worker_id);
      bye.iteration = static_cast<std::uint32_t>(iteration);
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

  // The measured timeline (WorkerReport::trace), relative to the first backward pass.
  void record(int track, TimeNs start, TimeNs end, std::string what) {
    if (!opts.record_trace) return;
    trace.push_back(TraceSpan{opts.worker_id, track, start - trace_origin, end - trace_origin, std::move(what)});
  }

  // ---- PushSink: the policy's decisions ----
  void push(const PushUnit& u, TimeNs delay) override {
    Status s = check_unit(u);
    if (!s.is_ok()) {
      loop->fail(s.with_context(name() + " policy " + std::string(policy->name())));
      return;
    }
    if (delay <= 0) {
      enqueue(u);  // pumped once the policy callback returns (units compete by priority)
    } else {
      loop->schedule_after(delay, [this, u] {
        enqueue(u);
        pump();
      });
    }
  }

  Status check_unit(const PushUnit& u) const {
    QS_RETURN_IF_ERROR(check_push_unit(u, jl.layout, jl.placement));
    // What the wire adds: a 32-bit length, whole float32 elements.
    if (u.chunk.length > 0xffffffffll || u.chunk.length % 4 != 0 || u.chunk.offset % 4 != 0) {
      return internal_error("bad unit: tensor " + std::to_string(u.chunk.tensor) + " offset " +
                            std::to_string(u.chunk.offset) + " length " + std::to_string(u.chunk.length));
    }
    return Status::ok();
  }

  void enqueue(const PushUnit& u) {
    const Key key{u.chunk.tensor, static_cast<std::uint64_t>(u.chunk.offset)};
    if (!outstanding.emplace(key, Outstanding{u}).second) {
      loop->fail(internal_error(name() + ": policy pushed tensor " + std::to_string(u.chunk.tensor) +
                                " offset " + std::to_string(u.chunk.offset) + " twice in iteration " +
                                std::to_string(iteration)));
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
    const auto* payload = reinterpret_cast<const std::byte*>(grads.data() + tensor_base[static_cast<std::size_t>(u.chunk.tensor)]) + u.chunk.offset;
    if (transport_since < 0) transport_since = loop->now();
    sender->enqueue(u.server, h, payload, 0);
    bytes_pushed += u.chunk.length;
    ++units_pushed;
  }

  void pump() {
    Status s = sender->pump();
    if (!s.is_ok()) loop->fail(s.with_context(name()));
    check_drained();
  }

  // "While pushing" (Mercury III-B, Fig. 6: the uplink's throughput averaged over the
  // time push operations run), as the simulator counts it: from a layer's gradients being
  // ready until every ready byte is on the wire. Compute gaps in which every ready byte is
  // on the wire do not count; a user-level scheduler's own waits (credit, stop-and-wait,
  // startup time) do.
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
    if (transport_since < 0 && pending_since < 0) return;
    if (!sender->idle()) return;
    if (transport_since < 0 && bytes_pushed < ready_bytes) return;  // only the policy holds bytes
    bool acked = true, out = true;
    TimeNs wire_end = -1;  // when the last byte left, where timestamps tell
    for (const auto& c : conns) {
      if (c->closed()) continue;
      c->poll_wire();
      auto n = transport::unacknowledged_bytes(c->fd());
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
    const bool pushing_done = bytes_pushed >= ready_bytes;
    if (out && pushing_done) end_pending(wire_end < 0 ? now : std::min(wire_end, now));
    const bool wait = transport_since >= 0 || (pending_since >= 0 && pushing_done);
    if (wait && drain_timer == 0) {
      drain_timer = loop->schedule_after(kDrainPoll, [this] {
        drain_timer = 0;
        check_drained();
      });
    }
  }

  // Ends the push period at `end` (default: now), never before it began.
  void end_pending(TimeNs end = -1) {
    if (pending_since < 0) return;
    end = std::max(end < 0 ? loop->now() : end, pending_since);
    record(1, pending_since, end, "pushing");
    pending_total += end - pending_since;
    pending_since = -1;
  }

  // The iteration is over: whatever is still open ends now.
  void end_spans() {
    end_pending();
    if (transport_since >= 0) transport_total += loop->now() - transport_since;
    transport_since = -1;
    if (drain_timer != 0) loop->cancel(drain_timer);
    drain_timer = 0;
  }

  // ---- FrameHandler: hello, acks and pulls from servers ----
  Result<PayloadTarget> on_header(Connection& c, const Header& h) override {
    last_rx = loop->now();
    const int s = c.index();
    switch (h.kind) {
      case FrameKind::kHello:
      case FrameKind::kError:
      case FrameKind::kBye: return PayloadTarget::buffer();
      case FrameKind::kAck:
      case FrameKind::kPull: {
        rules.kind = h.kind;
        rules.expected_sender = static_cast<std::uint16_t>(s);
        rules.min_iteration = rules.max_iteration = static_cast<std::uint32_t>(iteration);
        QS_RETURN_IF_ERROR(transport::validate_data_header(h, rules));
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset});
        if (it == outstanding.end() || it->second.unit.server != s ||
            it->second.unit.chunk.length != h.length ||
            (h.kind == FrameKind::kAck ? it->second.acked : it->second.pulled)) {
          return transport::header_error(
              HeaderField::kOffset, std::string(transport::frame_kind_name(h.kind)) + " of tensor " +
                                        std::to_string(h.tensor) + " bytes [" + std::to_string(h.offset) +
                                        ", " + std::to_string(h.offset + h.length) +
                                        ") matches no unit this worker pushed to server " + std::to_string(s) +
                                        " and awaits");
        }
        if (h.kind == FrameKind::kAck) return PayloadTarget::buffer();  // no payload
        pull_header_at[static_cast<std::size_t>(s)] = loop->now();
        return PayloadTarget::to(reinterpret_cast<std::byte*>(params.data() + tensor_base[h.tensor]) + h.offset);
      }
      case FrameKind::kPush: break;
    }
    return transport::header_error(HeaderField::kKind, "a server may not send a push");
  }

  Status on_frame(Connection& c, const Header& h) override {
    const int s = c.index();
    switch (h.kind) {
      case FrameKind::kHello: {
        auto body = c.small_payload();
        const std::string diff = hello_mismatch(hello_body(opts.job), transport::decode_hello(body.data()));
        if (!diff.empty()) return invalid_argument(name() + ": " + server_name(s) + " disagrees: " + diff);
        if (h.sender != s) {
          return transport::header_error(HeaderField::kSender, server_name(s) + " says it is server " +
                                                                   std::to_string(h.sender));
        }
        ++hellos;
        return Status::ok();
      }
      case FrameKind::kError: {
        auto text = c.small_payload();
        return unavailable(name() + ": " + server_name(s) + " reported: " +
                           std::string(reinterpret_cast<const char*>(text.data()), text.size()));
      }
      case FrameKind::kBye: return Status::ok();
      case FrameKind::kAck: {
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset});
        it->second.acked = true;
        const PushUnit u = it->second.unit;
        if (it->second.pulled) outstanding.erase(it);
        policy->on_push_acked(u, loop->now(), *this);
        pump();
        return Status::ok();
      }
      case FrameKind::kPull: {
        auto it = outstanding.find(Key{static_cast<TensorId>(h.tensor), h.offset});
        it->second.pulled = true;
        if (it->second.acked) outstanding.erase(it);
        record(2, pull_header_at[static_cast<std::size_t>(s)], loop->now(), "pull " + std::to_string(h.tensor));
        return on_pulled(h);
      }
      case FrameKind::kPush: break;
    }
    return internal_error("unreachable");
  }

  // Tensor constructor: count the layer's bytes; a complete layer is checked and released.
  Status on_pulled(const Header& h) {
    const int l = jl.layout.tensor(static_cast<TensorId>(h.tensor)).layer;
    Bytes& got = layer_pulled[static_cast<std::size_t>(l)];
    got += h.length;
    if (got < jl.layout.layer_bytes(l)) return Status::ok();
    QS_CHECK(got == jl.layout.layer_bytes(l));
    ready_at[static_cast<std::size_t>(l)] = loop->now();  // before the (CPU-side) check
    if (opts.verify) {
      for (TensorId t = jl.layout.first_tensor(l); t < jl.layout.end_tensor(l); ++t) {
        QS_RETURN_IF_ERROR(check_sum(params.data() + tensor_base[static_cast<std::size_t>(t)],
                                     jl.layout.tensor(t).bytes / 4, 0, opts.job.workers, iteration, t)
                               .with_context(name()));
      }
    }
    layer_ready[static_cast<std::size_t>(l)] = true;
    if (blocked && layer == l) try_forward(l);
    return Status::ok();
  }

  void on_writable(Connection& c) override {
    Status s = sender->on_writable(c.index());
    if (!s.is_ok()) loop->fail(s.with_context(name()));
    check_drained();
  }

  void on_closed(Connection& c, const Status& why) override {
    if (finished || why.is_ok()) return;
    loop->fail(unavailable(name() + ": lost " + c.peer() + " in iteration " + std::to_string(iteration) +
                           ": " + why.to_string()));
  }

  WorkerReport make_report() const {
    WorkerReport r;
    r.worker_id = opts.worker_id;
    r.policy = opts.job.policy;
    r.congestion_control = congestion;
    const bool timestamps = std::all_of(conns.begin(), conns.end(), [](const auto& c) { return c->wire_timestamps(); });
    r.push_end = timestamps ? "transmit timestamps" : "acknowledgements";
    r.iteration_times = iteration_times;
    auto steady = [&](auto v) {
      using T = typename decltype(v)::value_type;
      if (static_cast<int>(v.size()) > opts.warmup) v.erase(v.begin(), v.begin() + opts.warmup);
      if (v.empty()) return T{};
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    r.median_iteration = steady(iteration_times);
    r.bytes_pushed_per_iteration = bytes_per_iteration;
    r.units_per_iteration = units_per_iteration;
    r.uplink_gbps = steady(gbps);
    if (opts.nic_rate.bits_per_second > 0) r.uplink_utilisation = r.uplink_gbps / opts.nic_rate.gbps_value();
    r.queue_delay_p50 = transport::percentile(delays, 50);
    r.queue_delay_p99 = transport::percentile(delays, 99);
    r.queue_delay_max = transport::percentile(delays, 100);
    r.urgent_delay_p50 = transport::percentile(urgent_delays, 50);
    r.urgent_delay_p99 = transport::percentile(urgent_delays, 99);
    r.urgent_delay_max = transport::percentile(urgent_delays, 100);
    r.iterations_verified = verified;
    r.trace = std::move(trace);
    r.first_backward_at = trace_origin;
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
  // Buffers: one float per element, tensors back to back.
  std::vector<std::size_t> tensor_base;
  std::vector<float> grads, params;
  // Compute chain.
  std::int64_t iteration = 0;
  int layer = 0;
  bool blocked = false;
  bool finished = false;
  TimeNs iteration_start = 0, last_rx = 0;
  std::uint64_t rx_bytes_seen = 0;  // bytes read by the last watchdog check
  std::vector<Bytes> layer_pulled;
  std::vector<bool> layer_ready;
  std::vector<TimeNs> ready_at;  // when each layer's last pulled byte arrived
  TimeNs compute_free = 0;       // when the emulated GPU's current op is due to end
  TimeNs trace_origin = 0;       // the first backward pass
  std::vector<TimeNs> pull_header_at;  // by server: when the pull being read began
  std::vector<TraceSpan> trace;
  // "While pushing" (check_drained): gradient bytes made ready this iteration, since when
  // some are undelivered (-1: none), and the iteration's total of such time.
  static constexpr TimeNs kDrainPoll = 100 * kNsPerUs;
  // Since when the transport holds undelivered bytes (-1: none), this iteration's total of
  // such time, and the rate the bandwidth monitor reports (start_backward).
  TimeNs transport_since = -1, transport_total = 0;
  double monitor_bps = 0;
  Bytes ready_bytes = 0;
  TimeNs pending_since = -1, pending_total = 0;
  transport::EventLoop::TimerId drain_timer = 0;
  std::map<Key, Outstanding> outstanding;  // pushed this iteration, not yet acked and pulled
  TensorId urgent_end = 0;
  // Metrics.
  std::vector<TimeNs> iteration_times, delays, urgent_delays;
  std::vector<double> gbps;
  std::uint64_t bytes_at_start = 0;
  Bytes bytes_pushed = 0, bytes_per_iteration = 0;
  std::int64_t units_pushed = 0, units_per_iteration = 0;
  int verified = 0;
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

Result<WorkerReport> run_worker(const WorkerOptions& options) {
  QS_ASSIGN_OR_RETURN(auto worker, Worker::create(options));
  return worker->run();
}

}  // namespace qs::runtime
