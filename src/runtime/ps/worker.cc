// The Mercury worker (Mercury IV-C "Mercury Worker"): the one training loop
// (engine/training_loop.h) over three runtime seams: the node's event loop as its Timer,
// the GPU emulated from the profile as its Compute, and the parameter-server transport as
// its Exchange (worker_exchange.h: the sending buffer and its one sender across all server
// connections, acknowledgements, and the tensor constructor that writes pulled sums into
// the caller's buffers). This file: the connections, the rendezvous, the watchdog and the
// report. One event-loop thread.
#include <algorithm>

#include "../runtime_internal.h"
#include "quicksilver/core/check.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/tcp_connection.h"
#include "worker_exchange.h"
#include "worker_parts.h"

namespace qs::runtime {

using transport::Connection;
using transport::FrameKind;
using transport::Header;
using transport::HeaderField;
using transport::PayloadTarget;

// The worker: its connections and their frames, the rendezvous, the watchdog and the
// report; its Exchange (worker_exchange.h) moves the units.
struct Worker::Impl final : transport::FrameHandler {
  explicit Impl(WorkerOptions o)
      : opts(std::move(o)),
        jl(opts.job),
        record(opts.worker_id, opts.record_trace, static_cast<int>(opts.servers.size())) {}

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
    // The tensors: the caller's, or synthetic ones with known content.
    source = opts.tensors;
    if (source == nullptr) {
      known = std::make_unique<KnownContent>(job.profile, opts.worker_id, job.workers, opts.verify,
                                             job.wire_dtype);
      source = known.get();
    }
    std::vector<TensorBuffer> buffers = source->tensors();
    QS_RETURN_IF_ERROR(check_registry(buffers, jl.layout));
    exchange = std::make_unique<WorkerExchange>(opts, jl, policy->discipline(), *loop,
                                                std::move(buffers), record);
    // The loop and its seams.
    timer = std::make_unique<LoopTimer>(*loop);
    QS_ASSIGN_OR_RETURN(gpu, make_compute(opts.compute, *timer, job.profile, opts.compute_factor,
                                          *source, record.trace(), opts.worker_id));
    LoopOptions lo;
    lo.iterations = job.iterations;
    if (opts.record_trace) lo.pushing = SpanRecorder(record.trace(), opts.worker_id, 1, false);
    lo.before_backward = [this](std::int64_t it) { return before_backward(it); };
    lo.iteration_ended = [this](std::int64_t it) { iteration_ended(it); };
    lo.finished = [this] { say_bye(); };
    lo.layer_ready = [this](int layer, std::int64_t it) {
      return source->on_layer_ready(layer, it);
    };
    lo.failed = [this](const Status& s) { loop->fail(s.with_context(name())); };
    training = std::make_unique<TrainingLoop>(job.profile, jl.layout, *policy, *timer, *gpu,
                                              *exchange, std::move(lo));
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
    exchange->set_connections(raw);
    liveness.assign(conns.size(), Liveness());
    auto hello_timer = loop->schedule_at(deadline, [this] {
      loop->fail(unavailable(name() + ": only " + std::to_string(hellos) + " of " +
                             std::to_string(opts.job.servers) +
                             " servers answered hello before the deadline"));
    });
    QS_RETURN_IF_ERROR(loop->run([this] { return hellos == opts.job.servers; }));
    loop->cancel(hello_timer);
    // Training.
    exchange->start(training.get());
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
      const OutstandingUnits& outstanding = exchange->outstanding();
      const TimeNs last_progress = exchange->last_progress();
      const bool waiting = started && (training->blocked() || !outstanding.empty());
      if (waiting && now - last_progress > 3 * opts.job.peer_timeout) {
        loop->fail(unavailable(
            name() + ": waited " + format_time(now - last_progress) + " in iteration " +
            std::to_string(training->iteration()) + " for " + std::to_string(outstanding.size()) +
            " units from servers {" + outstanding.owing() + "}" +
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
    exchange->set_iteration(it);
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
    record.repairs(r.retransmitted_segments, r.timeouts);
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
        return exchange->on_answer_header(h, s);
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
      case FrameKind::kAck:
      case FrameKind::kPull:
        return exchange->on_answer(h, s);
      case FrameKind::kPush:
        break;
    }
    return internal_error("unreachable");
  }

  void on_writable(Connection& c) override { exchange->on_writable(c.index()); }

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
    // A job of one pass has no whole iteration (a PyTorch loop of one step, or a session
    // policy="auto" closed after one).
    r.median_iteration =
        r.iteration_times.empty() ? 0 : steady_median(r.iteration_times, opts.warmup);
    if (!training->records().empty()) {
      r.bytes_pushed_per_iteration = training->records().back().traffic.bytes;
      r.units_per_iteration = training->records().back().traffic.messages;
    }
    r.uplink_gbps = steady_median(gbps, opts.warmup);
    if (opts.nic_rate.bits_per_second > 0)
      r.uplink_utilisation = r.uplink_gbps / opts.nic_rate.gbps_value();
    r.iterations_verified = known ? known->iterations_verified() : 0;
    r.notes = policy->report();
    r.first_backward_at = training->first_backward_at();
    record.fill(r, r.first_backward_at);
    return r;
  }

  WorkerOptions opts;
  JobLayout jl;
  std::unique_ptr<PsPolicy> policy;
  std::unique_ptr<transport::EventLoop> loop;
  std::vector<std::unique_ptr<Connection>> conns;  // by server id
  std::string congestion;
  int hellos = 0;
  // The tensors: the caller's registry (or the known-content source this worker owns).
  TensorSource* source = nullptr;
  std::unique_ptr<KnownContent> known;
  std::unique_ptr<WorkerExchange> exchange;  // the units onto the wire and back
  // The loop and its other seams.
  std::unique_ptr<LoopTimer> timer;
  std::unique_ptr<Compute> gpu;
  bool finish_requested = false;  // finish() came before training began
  bool started = false;           // training->start() ran (or bye was said instead)
  std::unique_ptr<TrainingLoop> training;
  std::int64_t iteration = 0;  // the loop's iteration, as stamped on the wire
  bool finished = false;
  std::vector<Liveness> liveness;          // by server
  transport::RepairTally repairs_counter;  // what the transport repaired since the last look
  WorkerRecord record;                     // delays, round trips, repairs, the trace
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
