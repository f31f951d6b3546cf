// The Mercury parameter server (Mercury IV-C "Mercury PS"): transport, aggregator, ready
// queue and PS sender, all on one event-loop thread.
#include <sys/epoll.h>

#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "../runtime_internal.h"
#include "aggregator.h"
#include "quicksilver/core/check.h"
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

struct Server::Impl final : transport::FrameHandler {
  struct Peer {  // per worker connection state
    std::unique_ptr<Connection> conn;
    std::int64_t last_iteration = -1;  // highest iteration pushed so far
    bool bye = false;
    std::int64_t bye_iteration = -1;  // the last iteration it trained, from its bye
    Aggregator::Stream push;          // the push being read
    // Its connection's liveness, watched from its first frame after the hello (the worker
    // heartbeats once its rendezvous with every server is done).
    Liveness liveness;
    bool watched = false;
  };

  explicit Impl(ServerOptions o)
      : opts(std::move(o)),
        jl(opts.job),
        aggregator(jl, opts.server_id, opts.job.workers, opts.job.wire_dtype, name()) {}

  Status init() {
    QS_RETURN_IF_ERROR(validate_job(opts.job));
    if (opts.server_id < 0 || opts.server_id >= opts.job.servers) {
      return invalid_argument("server id " + std::to_string(opts.server_id) + " not in [0, " +
                              std::to_string(opts.job.servers) + ")");
    }
    QS_ASSIGN_OR_RETURN(auto policy, make_ps_policy(opts.job.policy, opts.job.policy_options,
                                                    jl.context(opts.job, 1.0)));
    discipline = policy->server_discipline();
    QS_ASSIGN_OR_RETURN(loop, transport::EventLoop::create());
    transport::TcpAcceptSettings as;
    as.secret = opts.secret.get();
    as.auth_context = kPsAuthContext;
    as.socket = socket_options(opts.job);
    as.payload_checksums = opts.job.payload_checksums;
    as.limits = opts.limits;
    as.first_frame_bytes = transport::kHeaderSize + transport::kHelloBodySize;  // a hello
    as.owner = name();
    as.first = "say hello";
    as.log = opts.log;
    as.on_change = [this] { publish(); };
    QS_ASSIGN_OR_RETURN(acceptor, transport::make_tcp_acceptor(*loop, opts.listen.host,
                                                               opts.listen.port, std::move(as)));
    port = acceptor->port();
    peers.resize(static_cast<std::size_t>(opts.job.workers));
    sender = std::make_unique<transport::Sender>(send_order(discipline),
                                                 jl.layout.num_tensors() + 1, *loop);
    sender->set_batch_bytes(sender_batch_bytes(opts.job));
    sender->set_connections(std::vector<Connection*>(peers.size(), nullptr));
    sender->set_sent_callback([this](int, std::uint64_t tag) { on_pull_sent(tag); });
    rules.tensor_bytes.clear();
    for (const TensorInfo& t : jl.layout.tensors()) {  // in wire bytes
      rules.tensor_bytes.push_back(t.bytes / wire_scale);
      rules.element_size.push_back(t.element_size / wire_scale);
    }
    rules.kind = FrameKind::kPush;
    rules.num_priorities = static_cast<std::uint16_t>(jl.layout.num_tensors() + 1);
    return Status::ok();
  }

  std::string name() const { return "server " + std::to_string(opts.server_id); }

  Status run() {
    QS_RETURN_IF_ERROR(acceptor->start(*this));
    const TimeNs start = loop->now();
    last_push = start;
    loop->schedule_at(start + opts.job.connect_timeout, [this] {
      std::string missing;
      for (std::size_t w = 0; w < peers.size(); ++w) {
        if (!peers[w].conn) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
      }
      if (!missing.empty()) {
        loop->fail(unavailable(name() + ": workers {" + missing + "} did not connect within " +
                               format_time(opts.job.connect_timeout)));
      }
    });
    schedule_watchdog();
    Status s = loop->run([this] { return finished(); });
    note_repairs(aggregator.latest_iteration());
    // Closing every connection makes the remaining peers fail fast instead of waiting.
    for (Peer& p : peers) {
      if (p.conn && !p.conn->closed()) p.conn->close(s.is_ok() ? Status::ok() : s, !s.is_ok());
    }
    acceptor->stop();
    publish();
    return s;
  }

  // Attributes what the transport (TCP) repaired since the last call to `iteration` (< 0:
  // nothing yet).
  void note_repairs(std::int64_t iteration) {
    std::vector<const Connection*> open;
    for (const Peer& p : peers) {
      if (p.conn && !p.conn->closed()) open.push_back(p.conn.get());
    }
    const transport::TcpRepairs d = repairs_counter.take(open);
    if (iteration < 0) return;
    const auto k = static_cast<std::size_t>(iteration);
    if (repairs.retransmits.size() <= k) repairs.retransmits.resize(k + 1, 0);
    repairs.retransmits[k] += d.retransmitted_segments;
    if (d.timeouts >= 0) {
      if (repairs.timeouts.size() <= k) repairs.timeouts.resize(k + 1, 0);
      repairs.timeouts[k] += d.timeouts;
    }
  }

  bool finished() const {
    for (const Peer& p : peers) {
      if (!p.bye || !p.conn) return false;
    }
    return sender->idle() && aggregator.live() == 0;
  }

  // Every tick: a heartbeat to each worker this server wrote nothing to; a worker whose
  // connection carried nothing for peer_timeout is lost (it or its link stalled); and when
  // sums wait but no push came from any worker for 2 x peer_timeout, the workers they wait
  // for are named (alive, but making no progress).
  void schedule_watchdog() {
    loop->schedule_after(Liveness::period(opts.job), [this] {
      const TimeNs now = loop->now();
      std::vector<int> silent;
      int watched = 0;
      for (std::size_t w = 0; w < peers.size(); ++w) {
        Peer& p = peers[w];
        if (!p.conn || p.conn->closed() || p.bye) continue;
        const TimeNs quiet =
            p.liveness.tick(*p.conn, now, static_cast<std::uint16_t>(opts.server_id));
        if (!p.watched) continue;
        ++watched;
        if (quiet > opts.job.peer_timeout) silent.push_back(static_cast<int>(w));
      }
      if (!silent.empty()) {
        loop->fail(unavailable(silence_message(silent, watched)));
        return;
      }
      bool all_connected = true;
      for (const Peer& p : peers) all_connected = all_connected && p.conn;
      if (all_connected && aggregator.live() > 0 && now - last_push > 2 * opts.job.peer_timeout) {
        loop->fail(unavailable(
            name() + ": no push from any worker for " + format_time(now - last_push) + " while " +
            std::to_string(aggregator.live()) + " sums wait for workers {" + waited_for() +
            "}, whose connections are alive (heartbeats): stuck outside the transport?"));
        return;
      }
      schedule_watchdog();
    });
  }

  // "server 0: lost worker 2 (last iteration 7): nothing received for 3 s (...)", or, when
  // every watched worker is silent, "lost every worker (0, 1): ...".
  std::string silence_message(const std::vector<int>& silent, int watched) const {
    const std::string how = "nothing received for more than " + format_time(opts.job.peer_timeout);
    if (silent.size() > 1 && static_cast<int>(silent.size()) == watched) {
      std::string list;
      for (int w : silent) list += (list.empty() ? "" : ", ") + std::to_string(w);
      return name() + ": lost every worker (" + list + "): " + how +
             " from any (this host's link is down, or every worker stalled)";
    }
    const int w = silent.front();
    return name() + ": lost worker " + std::to_string(w) + " (last iteration " +
           std::to_string(peers[static_cast<std::size_t>(w)].last_iteration) + "): " + how +
           ", heartbeats included (the worker or its link stalled)";
  }

  // The workers some incomplete unit still lacks, "1, 2".
  std::string waited_for() const {
    const std::uint64_t missing = aggregator.missing();
    std::string list;
    for (std::size_t w = 0; w < peers.size(); ++w) {
      if (missing & (std::uint64_t{1} << w)) list += (list.empty() ? "" : ", ") + std::to_string(w);
    }
    return list;
  }

  void log(const std::string& line) const {
    if (opts.log) opts.log(line);
  }

  // The counters another thread may read (Server::counters()).
  void publish() {
    if (!acceptor) return;
    const transport::Acceptor::Counters a = acceptor->counters();
    int held = a.held;
    for (const Peer& p : peers) held += p.conn ? 1 : 0;
    counters.pending.store(a.pending);
    counters.held.store(held);
    counters.refused.store(a.refused);
    counters.accepted.store(a.accepted);
    counters.accept_failures.store(a.accept_failures);
  }

  // ---- FrameHandler ----
  Result<PayloadTarget> on_header(Connection& c, const Header& h) override {
    if (transport::Acceptor::is_pending(c)) {
      if (h.kind != FrameKind::kHello) {
        return transport::header_error(
            HeaderField::kKind,
            std::string("expected hello first, got ") + transport::frame_kind_name(h.kind));
      }
      return PayloadTarget::buffer();
    }
    Peer& p = peers[static_cast<std::size_t>(c.index())];
    p.watched = true;
    switch (h.kind) {
      case FrameKind::kPush:
        return on_push_header(c, p, h);
      case FrameKind::kBye:
      case FrameKind::kError:
      case FrameKind::kHeartbeat:
        return PayloadTarget::buffer();
      default:
        return transport::header_error(HeaderField::kKind, std::string("a worker may not send ") +
                                                               transport::frame_kind_name(h.kind));
    }
  }

  Result<PayloadTarget> on_push_header(Connection& c, Peer& p, const Header& on_wire) {
    const int w = c.index();
    rules.expected_sender = static_cast<std::uint16_t>(w);
    rules.min_iteration = static_cast<std::uint32_t>(std::max<std::int64_t>(p.last_iteration, 0));
    rules.max_iteration = static_cast<std::uint32_t>(p.last_iteration + 1);
    QS_RETURN_IF_ERROR(transport::validate_data_header(on_wire, rules));
    // From here on, offsets and lengths in the tensor's float32 bytes (the placement's).
    Header h = on_wire;
    h.offset *= static_cast<std::uint64_t>(wire_scale);
    h.length *= static_cast<std::uint32_t>(wire_scale);
    // An open-ended run (PyTorch: the user's loop decides) ends when each worker's loop
    // does; a push beyond a finished worker's last iteration would wait for it for ever.
    for (std::size_t b = 0; b < peers.size(); ++b) {
      if (peers[b].bye && peers[b].bye_iteration < static_cast<std::int64_t>(h.iteration)) {
        return transport::header_error(HeaderField::kIteration,
                                       ended_apart(w, h.iteration, static_cast<int>(b)));
      }
    }
    bool new_iteration = false;
    QS_ASSIGN_OR_RETURN(Aggregator::Unit * u, aggregator.begin_push(w, h, &new_iteration));
    if (new_iteration) note_repairs(static_cast<std::int64_t>(h.iteration) - 1);
    last_push = loop->now();
    p.push = Aggregator::Stream{u};
    p.last_iteration = std::max<std::int64_t>(p.last_iteration, h.iteration);
    return PayloadTarget::stream();
  }

  Status on_payload(Connection& c, const Header&, std::uint64_t at, const std::byte* data,
                    std::size_t n) override {
    last_push = loop->now();  // a long payload still streaming in is progress too
    aggregator.add(peers[static_cast<std::size_t>(c.index())].push, at, data, n);
    return Status::ok();
  }

  Status on_frame(Connection& c, const Header& h) override {
    if (transport::Acceptor::is_pending(c)) return on_hello(c, h);
    const int w = c.index();
    Peer& p = peers[static_cast<std::size_t>(w)];
    switch (h.kind) {
      case FrameKind::kPush: {
        Aggregator::Unit& u = *p.push.unit;
        p.push.unit = nullptr;
        const bool ready = aggregator.end_push(u, w);
        Header ack = h;
        ack.kind = FrameKind::kAck;
        ack.sender = static_cast<std::uint16_t>(opts.server_id);
        c.send_control(ack);
        QS_RETURN_IF_ERROR(c.flush());
        QS_RETURN_IF_ERROR(sender->on_writable(c.index()));  // the flush may finish a pull
        if (ready) {
          // Ready (Mercury IV-C "Ready Queue"): one pull per worker, in the server discipline.
          Header pull = h;  // in wire bytes, as the push came
          pull.kind = FrameKind::kPull;
          pull.sender = static_cast<std::uint16_t>(opts.server_id);
          const std::byte* payload = aggregator.pull_payload(u);
          for (int v = 0; v < opts.job.workers; ++v) {
            sender->enqueue(v, pull, payload, reinterpret_cast<std::uint64_t>(&u));
          }
          return sender->pump();
        }
        return Status::ok();
      }
      case FrameKind::kBye:
        p.bye = true;
        p.bye_iteration = h.iteration;
        // The same, when the others pushed a later iteration before this bye arrived.
        for (std::size_t b = 0; b < peers.size(); ++b) {
          if (peers[b].last_iteration > p.bye_iteration) {
            loop->fail(invalid_argument(
                name() + ": " + ended_apart(static_cast<int>(b), peers[b].last_iteration, w)));
            break;
          }
        }
        return Status::ok();
      case FrameKind::kError: {
        auto text = c.small_payload();
        return unavailable(name() + ": worker " + std::to_string(w) + " reported: " +
                           std::string(reinterpret_cast<const char*>(text.data()), text.size()));
      }
      case FrameKind::kHeartbeat:
        return Status::ok();
      default:
        return internal_error("unreachable frame kind");
    }
  }

  std::string ended_apart(int pusher, std::int64_t iteration, int finished) const {
    return qs::ended_apart("worker " + std::to_string(pusher) + " pushes", iteration,
                           "worker " + std::to_string(finished),
                           peers[static_cast<std::size_t>(finished)].bye_iteration);
  }

  Status on_hello(Connection& c, const Header& h) {
    auto body = c.small_payload();
    const transport::HelloBody theirs = transport::decode_hello(body.data());
    const transport::HelloBody mine = hello_body(opts.job);
    const std::string diff = hello_mismatch(mine, theirs);
    if (!diff.empty()) {
      return invalid_argument(name() + " refuses worker " + std::to_string(h.sender) + ": " + diff);
    }
    if (h.sender >= peers.size()) {
      return transport::header_error(HeaderField::kSender, "worker id " + std::to_string(h.sender) +
                                                               " not in [0, " +
                                                               std::to_string(peers.size()) + ")");
    }
    Peer& p = peers[h.sender];
    if (p.conn) {
      return invalid_argument(name() + " refuses a second connection from worker " +
                              std::to_string(h.sender));
    }
    p.conn = acceptor->admit(c);
    c.set_index(h.sender);
    c.set_peer("worker " + std::to_string(h.sender));
    publish();
    std::vector<Connection*> conns;
    for (Peer& q : peers) conns.push_back(q.conn.get());
    sender->set_connections(std::move(conns));
    Header reply;
    reply.kind = FrameKind::kHello;
    reply.sender = static_cast<std::uint16_t>(opts.server_id);
    reply.length = transport::kHelloBodySize;
    const auto hb = transport::encode_hello(mine);
    c.send_control(reply, hb);
    return c.flush();
  }

  void on_writable(Connection& c) override {
    if (transport::Acceptor::is_pending(c)) return;
    Status s = sender->on_writable(c.index());
    if (!s.is_ok()) loop->fail(s);
  }

  void on_closed(Connection& c, const Status& why) override {
    if (transport::Acceptor::is_pending(c)) {
      acceptor->closed(c, why);  // a refused or broken peer before its hello: it was told
      return;
    }
    Peer& p = peers[static_cast<std::size_t>(c.index())];
    if (p.bye && why.code() == StatusCode::kUnavailable) return;  // orderly end after bye
    if (why.is_ok()) return;
    loop->fail(unavailable(name() + ": lost worker " + std::to_string(c.index()) +
                           " (last iteration " + std::to_string(p.last_iteration) +
                           "): " + why.to_string()));
  }

  void on_pull_sent(std::uint64_t tag) {
    aggregator.pull_sent(*reinterpret_cast<Aggregator::Unit*>(tag));
  }

  ServerOptions opts;
  JobLayout jl;
  QueueDiscipline discipline = QueueDiscipline::kPriority;
  std::unique_ptr<transport::EventLoop> loop;
  std::unique_ptr<transport::Acceptor> acceptor;  // strangers until their hello
  int port = 0;
  std::unique_ptr<transport::Sender> sender;
  transport::DataRules rules;
  Aggregator aggregator;  // the sums (Mercury IV-C "Aggregator")
  // Compression (JobOptions::wire_dtype): float32 bytes per wire byte.
  int wire_scale = 4 / transport::wire_dtype_size(opts.job.wire_dtype);
  Server::Repairs repairs;                 // per iteration (note_repairs)
  transport::RepairTally repairs_counter;  // what the transport repaired since the last note
  std::vector<Peer> peers;                 // by worker id
  struct AtomicCounters {
    std::atomic<std::int64_t> accepted{0}, refused{0};
    std::atomic<int> pending{0}, held{0};
    std::atomic<std::int64_t> accept_failures{0};
  } counters;            // published copies of the above, for other threads
  TimeNs last_push = 0;  // when a push last began to arrive from any worker
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::create(ServerOptions options) {
  QS_RETURN_IF_ERROR(validate_job(options.job));
  auto impl = std::make_unique<Impl>(std::move(options));
  QS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

const Server::Repairs& Server::repairs() const { return impl_->repairs; }
Server::Counters Server::counters() const {
  const auto& c = impl_->counters;
  return Counters{c.accepted.load(), c.refused.load(), c.pending.load(), c.held.load(),
                  c.accept_failures.load()};
}
int Server::port() const { return impl_->port; }
Status Server::run() { return impl_->run(); }
void Server::request_stop(const std::string& why) { impl_->loop->request_stop(why); }

Status run_server(const ServerOptions& options) {
  QS_ASSIGN_OR_RETURN(auto server, Server::create(options));
  return server->run();
}

}  // namespace qs::runtime
