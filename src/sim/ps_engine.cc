// The parameter-server simulation engine (DESIGN.md "Network model", Mercury section V).
//
// Hosts: N workers and M servers, each NIC an uplink and a downlink. A message is
// modelled cut-through across its two links: it occupies the sender's uplink for
// size/rate and finishes on the receiver's downlink no earlier than that, queuing behind
// what the receiver's downlink already carries (incast serialises there). It then takes
// the one-way latency. Acknowledgements carry no payload and take the latency only.
//
// Compute: per worker a chain (Mercury V-A assumption 1): backward L..1, then for each
// layer l in 1..L: wait for its parameters, update, forward (eq. 4). The iteration runs
// from the start of bp^L to the end of the next fp^L (eq. 5).
#include <algorithm>
#include <deque>
#include <memory>
#include <variant>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/priority_fifo.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/sim/event_queue.h"

namespace qs {
namespace {

// A transport queue under a discipline: PriorityFifo or plain FIFO.
template <typename T>
class TxQueue {
 public:
  TxQueue(QueueDiscipline d, int priorities) {
    if (d == QueueDiscipline::kPriority) {
      q_.template emplace<PriorityFifo<T>>(priorities);
    }
  }
  bool empty() const {
    return std::visit([](const auto& q) { return q.empty(); }, q_);
  }
  void push(int priority, T v) {
    if (auto* f = std::get_if<std::deque<T>>(&q_)) {
      f->push_back(std::move(v));
    } else {
      std::get<PriorityFifo<T>>(q_).push(priority, std::move(v));
    }
  }
  T pop() {
    if (auto* f = std::get_if<std::deque<T>>(&q_)) {
      T v = std::move(f->front());
      f->pop_front();
      return v;
    }
    return std::get<PriorityFifo<T>>(q_).pop();
  }

 private:
  std::variant<std::deque<T>, PriorityFifo<T>> q_;
};

enum class Ev : std::uint8_t {
  kComputeDone,    // worker's current compute op ended
  kEnqueue,        // unit enters worker's transport queue (after startup)
  kUplinkFree,     // worker uplink finished serialising a unit
  kServerArrive,   // unit fully arrived at its server
  kAck,            // server's acknowledgement reached the worker
  kServerOutFree,  // server uplink finished serialising a pull
  kPullArrive,     // pulled (aggregated) unit fully arrived at the worker
};

struct Payload {
  Ev type;
  int worker = 0;
  PushUnit unit{};
};

struct Link {
  const BandwidthSchedule* schedule = nullptr;
  TimeNs busy_until = 0;
  TimeNs finish(TimeNs start, Bytes bytes) const { return schedule->finish_time(start, bytes); }
};

class PsEngine {
 public:
  PsEngine(const Profile& profile, const PolicyOptions& popts, const ClusterConfig& cluster,
           const SimOptions& opts)
      : profile_(profile), cluster_(cluster), opts_(opts), layout_(profile),
        placement_(layout_, cluster.servers, popts.split_threshold),
        schedule_(cluster.link_schedule()) {}

  Result<SimResult> run(const std::string& policy_name, const PolicyOptions& popts) {
    PsContext ctx{&profile_, &layout_, &placement_, cluster_.workers, cluster_.servers,
                  schedule_.rate_at(0), cluster_.latency};
    const int priorities = layout_.num_tensors() + 1;
    for (int w = 0; w < cluster_.workers; ++w) {
      auto p = make_ps_policy(policy_name, popts, ctx);
      if (!p) return p.status();
      auto wk = std::make_unique<Worker>(std::move(*p), priorities, &schedule_);
      wk->id = w;
      wk->engine = this;
      wk->factor = cluster_.compute_factor.empty() ? 1.0
                                                   : cluster_.compute_factor[static_cast<std::size_t>(w)];
      wk->layer_pulled.assign(static_cast<std::size_t>(layout_.num_layers()), 0);
      wk->layer_ready.assign(static_cast<std::size_t>(layout_.num_layers()), false);
      workers_.push_back(std::move(wk));
    }
    const QueueDiscipline sd = workers_[0]->policy->server_discipline();
    acks_ = workers_[0]->policy->wants_acks();
    for (int s = 0; s < cluster_.servers; ++s) {
      servers_.push_back(std::make_unique<Server>(sd, priorities, &schedule_));
    }
    result_.policy = policy_name;
    if (opts_.record_trace) {
      for (auto& w : workers_) {
        w->rec_compute = SpanRecorder(&result_.trace, w->id, 0, true);
        w->rec_up = SpanRecorder(&result_.trace, w->id, 1, true);
        w->rec_down = SpanRecorder(&result_.trace, w->id, 2, true);
      }
    }
    for (auto& w : workers_) start_backward(*w, 0);
    while (!q_.empty()) {
      auto e = q_.pop();
      if (e.time >= kSimHorizon) return horizon_error();
      dispatch(e.payload);
      if (!error_.is_ok()) return error_;
    }
    for (auto& w : workers_) {
      if (w->iteration < opts_.iterations) {
        return internal_error("simulation stalled: worker " + std::to_string(w->id) +
                              " finished " + std::to_string(w->iteration) + " of " +
                              std::to_string(opts_.iterations) +
                              " iterations (a policy never pushed some gradient?)");
      }
    }
    Worker& w0 = *workers_[0];
    // Iteration k of the cluster ends when its slowest worker's does (with an oracle or
    // unequal compute speeds, workers differ).
    result_.iteration_times = w0.iteration_times;
    for (const auto& w : workers_) {
      for (std::size_t k = 0; k < result_.iteration_times.size(); ++k) {
        result_.iteration_times[k] = std::max(result_.iteration_times[k], w->iteration_times[k]);
      }
    }
    result_.link_utilisation = steady_median(w0.utilisation, opts_.warmup);
    result_.bytes_pushed_per_iteration = w0.bytes_pushed_last;
    result_.messages_per_iteration = w0.units_pushed_last;
    result_.events = q_.fired();
    finish_result(profile_, cluster_, opts_, &result_);
    return std::move(result_);
  }

 private:
  struct Worker;

  struct Sink final : PushSink {
    Worker* w = nullptr;
    void push(const PushUnit& unit, TimeNs delay) override;
  };

  struct Worker {
    Worker(std::unique_ptr<PsPolicy> p, int priorities, const BandwidthSchedule* sched)
        : policy(std::move(p)), tx(policy->discipline(), priorities) {
      up.schedule = sched;
      down.schedule = sched;
      sink.w = this;
    }
    int id = 0;
    PsEngine* engine = nullptr;
    std::unique_ptr<PsPolicy> policy;
    Sink sink;
    TxQueue<PushUnit> tx;
    Link up, down;
    double factor = 1.0;
    // Compute chain.
    std::int64_t iteration = 0;  // current iteration (its backward, then the next forward)
    bool backward = true;
    int layer = 0;            // layer of the running or blocked op
    bool blocked = false;     // forward of `layer` waits for its parameters
    TimeNs iteration_start = 0;
    std::vector<Bytes> layer_pulled;
    std::vector<bool> layer_ready;
    // Metrics and verification.
    std::vector<TimeNs> iteration_times;
    std::vector<double> utilisation;
    TimeNs push_busy = 0;  // uplink busy this iteration
    // "While pushing": gradient bytes made ready this iteration, since when some are not
    // yet on the wire (-1: none), and the iteration's total of such time.
    Bytes ready_bytes = 0;
    TimeNs pending_since = -1, pending_time = 0;
    Bytes bytes_pushed = 0, bytes_pushed_last = 0;
    Rate rate_seen{0};  // bytes pushed / uplink busy time, previous iteration (0: none yet)
    std::int64_t units_pushed = 0, units_pushed_last = 0;
    std::vector<Chunk> pushed, pulled;
    SpanRecorder rec_compute, rec_up, rec_down;
  };

  // Open-addressing (linear probing, backward-shift deletion) map from a unit's key to
  // its aggregation state: the hot path of every push, without a node allocation each.
  class AggMap {
   public:
    struct Slot {
      std::uint64_t key = kEmpty;
      int count = 0;
      Bytes length = 0;
    };
    static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
    AggMap() : slots_(64) {}
    Slot& find_or_insert(std::uint64_t key) {
      if ((size_ + 1) * 2 > slots_.size()) grow();
      std::size_t i = index(key);
      while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, 0, 0};
        ++size_;
      }
      return slots_[i];
    }
    void erase(Slot& slot) {
      const std::size_t mask = slots_.size() - 1;
      std::size_t i = static_cast<std::size_t>(&slot - slots_.data());
      slots_[i].key = kEmpty;
      --size_;
      for (std::size_t j = (i + 1) & mask; slots_[j].key != kEmpty; j = (j + 1) & mask) {
        const std::size_t home = index(slots_[j].key);
        // Move j back to the hole at i unless its home lies cyclically in (i, j].
        if (((j - home) & mask) >= ((j - i) & mask)) {
          slots_[i] = slots_[j];
          slots_[j].key = kEmpty;
          i = j;
        }
      }
    }

   private:
    std::size_t index(std::uint64_t key) const {
      return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ULL) >> 20) & (slots_.size() - 1);
    }
    void grow() {
      std::vector<Slot> old(slots_.size() * 2);
      old.swap(slots_);
      size_ = 0;
      for (const Slot& s : old) {
        if (s.key != kEmpty) find_or_insert(s.key) = s;
      }
    }
    std::vector<Slot> slots_;
    std::size_t size_ = 0;
  };
  struct Server {
    Server(QueueDiscipline d, int priorities, const BandwidthSchedule* sched)
        : out_q(d, priorities) {
      in.schedule = sched;
      out.schedule = sched;
    }
    Link in, out;
    AggMap agg;
    TxQueue<std::pair<int, PushUnit>> out_q;
  };

  static std::uint64_t key(const Chunk& c) {
    return (static_cast<std::uint64_t>(c.tensor) << 40) ^ static_cast<std::uint64_t>(c.offset);
  }

  TimeNs scaled(TimeNs t, double f) const {
    return f == 1.0 ? t : static_cast<TimeNs>(static_cast<double>(t) * f + 0.5);
  }

  void fail(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
  }

  // ---- compute chain ----
  void start_backward(Worker& w, std::int64_t iteration) {
    const TimeNs now = q_.now();
    w.iteration = iteration;
    w.iteration_start = now;
    w.backward = true;
    w.blocked = false;
    std::fill(w.layer_pulled.begin(), w.layer_pulled.end(), 0);
    std::fill(w.layer_ready.begin(), w.layer_ready.end(), false);
    // Prophet's bandwidth monitor (Prophet 4.2): the rate the uplink achieved last iteration.
    if (w.rate_seen.bits_per_second > 0) w.policy->on_bandwidth_estimate(w.rate_seen, now);
    w.policy->on_iteration_start(iteration, now, w.sink);
    try_send(w);
    run_backward(w, layout_.num_layers() - 1);
  }

  void run_backward(Worker& w, int layer) {
    w.layer = layer;
    const TimeNs d = scaled(profile_.layers[static_cast<std::size_t>(layer)].backward, w.factor);
    if (w.rec_compute.enabled()) {
      w.rec_compute.add(q_.now(), q_.now() + d, "bp " + profile_.layers[static_cast<std::size_t>(layer)].name);
    }
    q_.schedule(q_.now() + d, Payload{Ev::kComputeDone, w.id, {}});
  }

  void try_forward(Worker& w, int layer) {
    w.layer = layer;
    w.backward = false;
    if (!w.layer_ready[static_cast<std::size_t>(layer)]) {
      w.blocked = true;
      return;
    }
    w.blocked = false;
    const TimeNs now = q_.now();
    w.policy->on_forward_start(layer, now, w.sink);
    try_send(w);
    const LayerSpec& spec = profile_.layers[static_cast<std::size_t>(layer)];
    const TimeNs d = scaled(spec.update + spec.forward, w.factor);
    if (w.rec_compute.enabled()) w.rec_compute.add(now, now + d, "fp " + spec.name);
    q_.schedule(now + d, Payload{Ev::kComputeDone, w.id, {}});
  }

  void on_compute_done(Worker& w) {
    const TimeNs now = q_.now();
    if (w.backward) {
      const int l = w.layer;
      if (!w.policy->communicates()) {
        w.layer_ready[static_cast<std::size_t>(l)] = true;
      } else {
        if (const Bytes b = layout_.layer_bytes(l); b > 0) {
          w.ready_bytes += b;
          if (w.pending_since < 0) w.pending_since = now;
        }
        w.policy->on_gradient_ready(l, now, w.sink);
        try_send(w);
      }
      if (l > 0) {
        run_backward(w, l - 1);
      } else {
        try_forward(w, 0);
      }
      return;
    }
    if (w.layer + 1 < layout_.num_layers()) {
      try_forward(w, w.layer + 1);
      return;
    }
    end_iteration(w);
  }

  void end_iteration(Worker& w) {
    const TimeNs now = q_.now();
    w.iteration_times.push_back(now - w.iteration_start);
    if (w.policy->communicates()) {
      end_pending(w);
      w.utilisation.push_back(w.pending_time > 0 ? static_cast<double>(w.push_busy) / static_cast<double>(w.pending_time)
                                                 : 1.0);
    } else {
      w.utilisation.push_back(0.0);
    }
    if (w.push_busy > 0) {
      w.rate_seen = Rate{static_cast<std::int64_t>(static_cast<double>(w.bytes_pushed) * 8e9 /
                                                   static_cast<double>(w.push_busy))};
    }
    w.push_busy = 0;
    w.ready_bytes = 0;
    w.pending_time = 0;
    w.bytes_pushed_last = w.bytes_pushed;
    w.units_pushed_last = w.units_pushed;
    w.bytes_pushed = 0;
    w.units_pushed = 0;
    if (opts_.verify_bytes && w.policy->communicates()) {
      const std::string where = "worker " + std::to_string(w.id) + " iteration " + std::to_string(w.iteration);
      Status s = check_exact_cover(std::move(w.pushed), layout_).with_context("push, " + where);
      if (s.is_ok()) s = check_exact_cover(std::move(w.pulled), layout_).with_context("pull, " + where);
      if (!s.is_ok()) fail(s);
      w.pushed.clear();
      w.pulled.clear();
    }
    if (w.iteration + 1 < opts_.iterations) {
      start_backward(w, w.iteration + 1);
    } else {
      w.iteration = opts_.iterations;
    }
  }

  // ---- worker transport ----
  // Queues without sending: the engine calls try_send() once the policy callback that
  // pushed returns, so that all units pushed in one callback compete by priority.
  void enqueue(Worker& w, const PushUnit& u) { w.tx.push(u.priority, u); }

  // The uplink finished a unit: if every ready byte is now on the wire, pushing pauses.
  void on_uplink_free(Worker& w) {
    if (w.bytes_pushed == w.ready_bytes && w.tx.empty()) end_pending(w);
    try_send(w);
  }

  void end_pending(Worker& w) {
    if (w.pending_since < 0) return;
    w.pending_time += q_.now() - w.pending_since;
    w.pending_since = -1;
  }

  void try_send(Worker& w) {
    const TimeNs now = q_.now();
    if (w.up.busy_until > now || w.tx.empty()) return;
    PushUnit u = w.tx.pop();
    Server& s = *servers_[static_cast<std::size_t>(u.server)];
    const Bytes len = u.chunk.length;
    const TimeNs fin1 = w.up.finish(now, len);
    const TimeNs start2 = std::max(now, s.in.busy_until);
    const TimeNs fin2 = std::max(fin1, s.in.finish(start2, len));
    s.in.busy_until = fin2;
    w.up.busy_until = fin1;
    w.push_busy += fin1 - now;
    w.bytes_pushed += len;
    ++w.units_pushed;
    if (opts_.verify_bytes) w.pushed.push_back(u.chunk);
    if (w.rec_up.enabled()) w.rec_up.add(now, fin1, "push " + std::to_string(u.chunk.tensor));
    q_.schedule(fin1, Payload{Ev::kUplinkFree, w.id, {}});
    q_.schedule(add_saturated(fin2, cluster_.latency), Payload{Ev::kServerArrive, w.id, u});
  }

  // ---- server ----
  void on_server_arrive(int worker, const PushUnit& u) {
    if (acks_) q_.schedule(add_saturated(q_.now(), cluster_.latency), Payload{Ev::kAck, worker, u});
    Server& s = *servers_[static_cast<std::size_t>(u.server)];
    auto& a = s.agg.find_or_insert(key(u.chunk));
    if (a.count == 0) {
      a.length = u.chunk.length;
    } else if (a.length != u.chunk.length) {
      fail(internal_error("workers cut different units: tensor " + std::to_string(u.chunk.tensor) +
                          " offset " + std::to_string(u.chunk.offset)));
      return;
    }
    if (++a.count < cluster_.workers) return;
    s.agg.erase(a);
    // Sum complete: one pull per worker (Mercury IV-C "PS Sender").
    for (int w = 0; w < cluster_.workers; ++w) s.out_q.push(u.priority, {w, u});
    try_send_server(u.server);
  }

  void try_send_server(int server) {
    Server& s = *servers_[static_cast<std::size_t>(server)];
    const TimeNs now = q_.now();
    if (s.out.busy_until > now || s.out_q.empty()) return;
    auto [wid, u] = s.out_q.pop();
    Worker& w = *workers_[static_cast<std::size_t>(wid)];
    const Bytes len = u.chunk.length;
    const TimeNs fin1 = s.out.finish(now, len);
    const TimeNs start2 = std::max(now, w.down.busy_until);
    const TimeNs fin2 = std::max(fin1, w.down.finish(start2, len));
    w.down.busy_until = fin2;
    s.out.busy_until = fin1;
    if (w.rec_down.enabled()) w.rec_down.add(start2, fin2, "pull " + std::to_string(u.chunk.tensor));
    q_.schedule(fin1, Payload{Ev::kServerOutFree, u.server, {}});
    q_.schedule(add_saturated(fin2, cluster_.latency), Payload{Ev::kPullArrive, wid, u});
  }

  void on_pull_arrive(Worker& w, const PushUnit& u) {
    if (opts_.verify_bytes) w.pulled.push_back(u.chunk);
    const int l = layout_.tensor(u.chunk.tensor).layer;
    Bytes& got = w.layer_pulled[static_cast<std::size_t>(l)];
    got += u.chunk.length;
    if (got > layout_.layer_bytes(l)) {
      fail(internal_error("layer " + std::to_string(l) + " pulled more bytes than it has"));
      return;
    }
    if (got == layout_.layer_bytes(l)) {
      w.layer_ready[static_cast<std::size_t>(l)] = true;
      if (w.blocked && w.layer == l) try_forward(w, l);
    }
  }

  void dispatch(const Payload& p) {
    switch (p.type) {
      case Ev::kComputeDone: on_compute_done(*workers_[static_cast<std::size_t>(p.worker)]); break;
      case Ev::kEnqueue: {
        Worker& w = *workers_[static_cast<std::size_t>(p.worker)];
        enqueue(w, p.unit);
        try_send(w);
        break;
      }
      case Ev::kUplinkFree: on_uplink_free(*workers_[static_cast<std::size_t>(p.worker)]); break;
      case Ev::kServerArrive: on_server_arrive(p.worker, p.unit); break;
      case Ev::kAck: {
        Worker& w = *workers_[static_cast<std::size_t>(p.worker)];
        w.policy->on_push_acked(p.unit, q_.now(), w.sink);
        try_send(w);
        break;
      }
      case Ev::kServerOutFree: try_send_server(p.worker); break;
      case Ev::kPullArrive: on_pull_arrive(*workers_[static_cast<std::size_t>(p.worker)], p.unit); break;
    }
  }

  // Validates a policy's unit before it enters the engine.
  Status check_unit(const PushUnit& u) const { return check_push_unit(u, layout_, placement_); }

  const Profile& profile_;
  const ClusterConfig& cluster_;
  const SimOptions& opts_;
  TensorLayout layout_;
  Placement placement_;
  BandwidthSchedule schedule_;
  EventQueue<Payload> q_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Server>> servers_;
  SimResult result_;
  Status error_;
  bool acks_ = true;

  friend struct Sink;
};

void PsEngine::Sink::push(const PushUnit& unit, TimeNs delay) {
  PsEngine& e = *w->engine;
  Status s = e.check_unit(unit);
  if (!s.is_ok()) {
    e.fail(s.with_context(std::string(w->policy->name())));
    return;
  }
  if (delay <= 0) {
    e.enqueue(*w, unit);
  } else {
    e.q_.schedule(e.q_.now() + delay, Payload{Ev::kEnqueue, w->id, unit});
  }
}

}  // namespace

Result<SimResult> simulate_ps(const Profile& profile, const std::string& policy,
                              const PolicyOptions& policy_options, const ClusterConfig& cluster,
                              const SimOptions& options) {
  PsEngine engine(profile, policy_options, cluster, options);
  return engine.run(policy, policy_options);
}

}  // namespace qs
