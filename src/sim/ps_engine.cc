// The parameter-server simulation engine (DESIGN.md "Network model", Mercury section V):
// N training loops (engine/training_loop.h), one per worker, over one event queue, with
// the simulated parameter-server network as their Exchange.
//
// Hosts: N workers and M servers, each NIC an uplink and a downlink. A message is
// modelled cut-through across its two links: it occupies the sender's uplink for
// size/rate and finishes on the receiver's downlink no earlier than that, queuing behind
// what the receiver's downlink already carries (incast serialises there). It then takes
// the one-way latency. Acknowledgements carry no payload and take the latency only.
//
// Per-frame cost (ClusterConfig::frame_header, frame_cpu; docs/simulator.md): every unit
// is one frame of the transport; it carries frame_header bytes beside its payload on both
// links, and holds each link frame_cpu longer than its bytes take (the CPU a frame costs,
// measured by bench/transport_bench, is not hidden behind the wire: the transport keeps
// the kernel's queue short on purpose, DESIGN.md "Transport").
// Pulls queue on the server's uplink and the worker's downlink unless
// ClusterConfig::overlapping_pulls (the Mercury paper's eq. 7: each pull takes its own
// time from the moment its sum is complete, overlapping every other pull).
//
// ClusterConfig::ack_queue (default 0, off): an acknowledgement waits behind the pull the
// server's uplink is sending and behind what the worker's downlink still carries, up to
// this long (the standing queue of a shaper that TCP keeps full), instead of taking the
// latency only; it does not wait for pulls the server has not started, as the runtime's
// control frames go ahead of those (issue 14 point 7; docs/simulator.md).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <variant>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/priority_fifo.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/policy/ps_policy.h"
#include "sim_clock.h"

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
  // The element pop() would return, to update in place.
  T& front() {
    if (auto* f = std::get_if<std::deque<T>>(&q_)) return f->front();
    return std::get<PriorityFifo<T>>(q_).top();
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

struct Link {
  const BandwidthSchedule* schedule = nullptr;
  TimeNs busy_until = 0;
  TimeNs frame_cpu = 0;  // added to every frame's time on this link

  // Cut-through transfer of one frame of `bytes` (header included) from this link (free
  // from `now`) to `to`: this link is busy until it serialised them; they arrive once `to`
  // carried them too, behind what it already carries. Returns (this link's end, the
  // arrival at the far end).
  std::pair<TimeNs, TimeNs> transfer(TimeNs now, Bytes bytes, Link& to) {
    const TimeNs fin1 = finish_time(now, bytes) + frame_cpu;
    const TimeNs start2 = std::max(now, to.busy_until);
    const TimeNs fin2 = std::max(fin1, to.finish_time(start2, bytes) + to.frame_cpu);
    to.busy_until = fin2;
    busy_until = fin1;
    return {fin1, fin2};
  }
  // schedule->finish_time(), remembering the last size's time at a constant rate (a link
  // mostly carries units of one size, and the division is a good part of a transfer).
  TimeNs finish_time(TimeNs start, Bytes bytes) {
    if (!schedule->is_constant()) return schedule->finish_time(start, bytes);
    if (bytes != memo_bytes_) {
      memo_bytes_ = bytes;
      memo_time_ = transfer_time(bytes, schedule->segments().front().rate);
    }
    return add_saturated(start, memo_time_);
  }

 private:
  Bytes memo_bytes_ = -1;
  TimeNs memo_time_ = 0;
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
// Units in flight, by reference: an event carries a 4-byte slot instead of a 32-byte unit
// (a simulation of N workers and M servers may have millions of events pending). A
// pull's unit lives until it arrived, an acknowledged unit until its acknowledgement did.
class UnitPool {
 public:
  std::uint32_t add(const PushUnit& u, int refs) {
    std::uint32_t slot;
    if (free_.empty()) {
      QS_CHECK(units_.size() < UINT32_MAX);
      slot = static_cast<std::uint32_t>(units_.size());
      units_.push_back(Entry{u, refs});
    } else {
      slot = free_.back();
      free_.pop_back();
      units_[slot] = Entry{u, refs};
    }
    return slot;
  }
  // A copy: the slot may be reused and the storage moved once released.
  PushUnit get(std::uint32_t slot) const { return units_[slot].unit; }
  void release(std::uint32_t slot) {
    if (--units_[slot].refs == 0) free_.push_back(slot);
  }

 private:
  struct Entry {
    PushUnit unit;
    int refs;
  };
  std::vector<Entry> units_;
  std::vector<std::uint32_t> free_;
};

enum Ev : std::uint8_t {
  kUplinkFree,     // a worker's uplink finished serialising a unit
  kServerArrive,   // a unit fully arrived at its server
  kAck,            // a server's acknowledgement reached the worker
  kServerOutFree,  // a server's uplink finished serialising a pull
  kPullArrive,     // a pulled (aggregated) unit fully arrived at the worker
};

// The simulated parameter-server network: every worker's Exchange (its Port) and the
// servers that sum and answer.
class PsNetwork {
 public:
  // One worker's side of the network: its transport queue (under its policy's discipline),
  // its NIC, and what it sent this iteration.
  class Port final : public Exchange {
   public:
    Port(PsNetwork& net, int id, QueueDiscipline d, int priorities)
        : net_(net), id_(id), tx_(d, priorities), up_lane_(net.clock_.add_lane()),
          ack_lane_(net.acks_ ? net.clock_.add_lane() : -1) {
      up_.schedule = down_.schedule = net.host_schedule(net.cluster_.worker_bandwidth, id);
      up_.frame_cpu = down_.frame_cpu = net.cluster_.frame_cpu;
      pulls_sent_.assign(static_cast<std::size_t>(net.layout_.num_layers()), 0);
    }
    void set_listener(ExchangeListener* l) { listener_ = l; }
    void record(std::vector<TraceSpan>* trace) {
      rec_up_ = SpanRecorder(trace, id_, 1, true);
      rec_down_ = SpanRecorder(trace, id_, 2, true);
    }

    // Queues without sending: the loop flushes once the policy callback that pushed
    // returns, so that all units pushed in one callback compete by priority.
    void push(const PushUnit& u) override { tx_.push(u.priority, u); }
    void flush() override { net_.try_send(*this); }
    Status check(const PushUnit& u) const override { return check_push_unit(u, net_.layout_, net_.placement_); }
    Traffic take_traffic(TimeNs) override {
      Traffic t{bytes_, units_, static_cast<std::uint64_t>(bytes_), busy_, 0};
      bytes_ = busy_ = 0;
      units_ = 0;
      return t;
    }

   private:
    friend class PsNetwork;
    PsNetwork& net_;
    int id_;
    ExchangeListener* listener_ = nullptr;
    TxQueue<PushUnit> tx_;
    Link up_, down_;
    int up_lane_;    // up_'s end of serialisation (one at a time)
    int ack_lane_;   // acknowledgements for this worker (mostly in time order), if any
    std::vector<Bytes> pulls_sent_;  // per layer, this iteration's pulls sent so far (try_send_server)
    Bytes bytes_ = 0;
    std::int64_t units_ = 0;
    TimeNs busy_ = 0;  // uplink serialisation time this iteration
    SpanRecorder rec_up_, rec_down_;
  };

  PsNetwork(SimClock& clock, const ClusterConfig& cluster, const TensorLayout& layout,
            const Placement& placement, QueueDiscipline server_discipline, bool acks)
      : clock_(clock), cluster_(cluster), layout_(layout), placement_(placement),
        schedule_(cluster.link_schedule()), acks_(acks) {
    const int priorities = layout.num_tensors() + 1;
    for (int s = 0; s < cluster.servers; ++s) {
      // Without acknowledgements only an arrival that completes a sum is an event (try_send):
      // few, and the heap takes them; with them every arrival is, on the server's lane.
      const int in_lane = acks ? clock.add_lane() : -1;
      auto& srv = servers_.emplace_back(std::make_unique<Server>(server_discipline, priorities, in_lane, clock.add_lane()));
      srv->in.schedule = srv->out.schedule = host_schedule(cluster.server_bandwidth, s);
      srv->in.frame_cpu = srv->out.frame_cpu = cluster.frame_cpu;
    }
  }

  Port& add_port(QueueDiscipline d) {
    ports_.push_back(std::make_unique<Port>(*this, static_cast<int>(ports_.size()), d, layout_.num_tensors() + 1));
    return *ports_.back();
  }
  // Host i's NIC: its own rate from `rates` (ClusterConfig::worker_bandwidth,
  // server_bandwidth; Mercury Fig. 21(b)), or the one schedule every host follows.
  const BandwidthSchedule* host_schedule(const std::vector<Rate>& rates, int i) {
    if (rates.empty()) return &schedule_;
    return &host_schedules_.emplace_back(rates[static_cast<std::size_t>(i)]);
  }
  const Status& error() const { return error_; }
  // Arrivals the model has but the event queue did not need (try_send, try_send_server):
  // the events reported are the queue's and these, the same count as with one event each.
  std::uint64_t silent_events() const { return silent_; }

  void dispatch(const SimEvent& e) {
    switch (e.kind) {
      case kUplinkFree: on_uplink_free(port(e.index)); break;
      case kServerArrive: on_server_arrive(e.index, e.ref); break;
      case kAck: {
        const PushUnit u = units_.get(e.ref);
        units_.release(e.ref);
        port(e.index).listener_->on_push_acked(u);
        break;
      }
      case kServerOutFree: try_send_server(e.index); break;
      case kPullArrive: {
        const PushUnit u = units_.get(e.ref);
        units_.release(e.ref);
        port(e.index).listener_->on_pulled(u, clock_.now());
        break;
      }
    }
  }

 private:
  // A complete sum waiting on a server's uplink: its pulls to workers next..N-1 (one entry
  // for all N pulls, sent in worker order: exactly N consecutive entries of one FIFO).
  struct Pull {
    PushUnit unit;
    int next = 0;
  };
  struct Server {
    Server(QueueDiscipline d, int priorities, int in_lane, int out_lane)
        : in_lane(in_lane), out_lane(out_lane), out_q(d, priorities) {}
    Link in, out;
    int in_lane;   // the pushes arriving over `in`, in the order it delivers them (-1: the heap)
    // Their units, in the same order (an arrival event names only the server; the units
    // are read in sequence, not from scattered slots).
    Ring<std::pair<int, PushUnit>> arriving;
    int out_lane;  // out's end of serialisation (one at a time)
    AggMap agg;
    TxQueue<Pull> out_q;
  };

  Port& port(int w) { return *ports_[static_cast<std::size_t>(w)]; }
  static std::uint64_t key(const Chunk& c) {
    return (static_cast<std::uint64_t>(c.tensor) << 40) ^ static_cast<std::uint64_t>(c.offset);
  }
  void fail(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
  }

  void try_send(Port& w) {
    const TimeNs now = clock_.now();
    if (w.up_.busy_until > now || w.tx_.empty()) return;
    PushUnit u = w.tx_.pop();
    Server& s = *servers_[static_cast<std::size_t>(u.server)];
    const auto [fin1, fin2] = w.up_.transfer(now, u.chunk.length + cluster_.frame_header, s.in);
    w.busy_ += fin1 - now;
    w.bytes_ += u.chunk.length;
    ++w.units_;
    if (w.rec_up_.enabled()) w.rec_up_.add(now, fin1, "push " + std::to_string(u.chunk.tensor));
    clock_.schedule_event_on(w.up_lane_, fin1, kUplinkFree, w.id_, 0);
    if (!acks_) {
      // Without acknowledgements an arrival that does not complete its sum changes nothing
      // but the count, and the server's link delivers in the order it is given work: the
      // copy sent N-th is the one that arrives N-th. So the count is kept here and only
      // the completing arrival is an event (the others are counted in silent_events()).
      auto& a = s.agg.find_or_insert(key(u.chunk));
      if (a.count == 0) {
        a.length = u.chunk.length;
      } else if (a.length != u.chunk.length) {
        return fail(mismatch(u));
      }
      if (++a.count < cluster_.workers) {
        ++silent_;
        return;
      }
      s.agg.erase(a);
    }
    s.arriving.push({w.id_, u});
    clock_.schedule_event_on(s.in_lane, add_saturated(fin2, cluster_.latency), kServerArrive, w.id_,
                             static_cast<std::uint32_t>(u.server));
  }
  static Status mismatch(const PushUnit& u) {
    return internal_error("workers cut different units: tensor " + std::to_string(u.chunk.tensor) + " offset " +
                          std::to_string(u.chunk.offset));
  }

  // The uplink finished a unit: with nothing queued, everything handed over is on the wire.
  void on_uplink_free(Port& w) {
    if (w.tx_.empty()) w.listener_->on_drained(clock_.now());
    try_send(w);
  }

  void on_server_arrive(int worker, std::uint32_t server) {
    Server& s = *servers_[server];
    // A link delivers in order, and its arrivals are a lane of the clock: the same order.
    QS_CHECK(!s.arriving.empty() && s.arriving.front().first == worker);
    const PushUnit u = s.arriving.pop().second;
    if (acks_) {
      clock_.schedule_event_on(port(worker).ack_lane_, add_saturated(ack_time(s, port(worker)), cluster_.latency),
                               kAck, worker, units_.add(u, 1));
      auto& a = s.agg.find_or_insert(key(u.chunk));
      if (a.count == 0) {
        a.length = u.chunk.length;
      } else if (a.length != u.chunk.length) {
        return fail(mismatch(u));
      }
      if (++a.count < cluster_.workers) return;
      s.agg.erase(a);
    }  // else try_send counted the copies, and this one completes the sum
    // Sum complete: one pull per worker (Mercury IV-C "PS Sender").
    if (cluster_.overlapping_pulls) {
      // Mercury eq. 7: tau_pull = tau_push + t_pull, no pull waits for another.
      const TimeNs now = clock_.now();
      // With hosts of different rates, each pull takes its time at the slower of the two NICs.
      const Bytes bytes = u.chunk.length + cluster_.frame_header;
      const TimeNs from_server = s.out.finish_time(now, bytes);
      const std::uint32_t sum = units_.add(u, cluster_.workers);
      for (int w = 0; w < cluster_.workers; ++w) {
        const TimeNs fin = std::max(from_server, port(w).down_.finish_time(now, bytes)) + cluster_.frame_cpu;
        if (port(w).rec_down_.enabled()) port(w).rec_down_.add(now, fin, "pull " + std::to_string(u.chunk.tensor));
        clock_.schedule_event(add_saturated(fin, cluster_.latency), kPullArrive, w, sum);
      }
      return;
    }
    s.out_q.push(u.priority, Pull{u, 0});
    try_send_server(u.server);
  }

  // When the server's acknowledgement of a push leaves for the worker: at once, or with
  // ClusterConfig::ack_queue behind the pull in flight on the server's uplink and the
  // backlog of the worker's downlink, up to ack_queue.
  TimeNs ack_time(const Server& s, const Port& w) const {
    const TimeNs now = clock_.now();
    if (cluster_.ack_queue <= 0) return now;
    const TimeNs server_backlog = std::max<TimeNs>(0, s.out.busy_until - now);
    const TimeNs worker_backlog = std::max<TimeNs>(0, w.down_.busy_until - now);
    return now + std::min(cluster_.ack_queue, std::max(server_backlog, worker_backlog));
  }

  void try_send_server(int server) {
    Server& s = *servers_[static_cast<std::size_t>(server)];
    const TimeNs now = clock_.now();
    if (s.out.busy_until > now || s.out_q.empty()) return;
    Pull& next = s.out_q.front();
    const int wid = next.next++;
    const PushUnit u = next.unit;
    if (next.next == cluster_.workers) s.out_q.pop();
    Port& w = port(wid);
    const TimeNs start2 = std::max(now, w.down_.busy_until);
    const auto [fin1, fin2] = s.out.transfer(now, u.chunk.length + cluster_.frame_header, w.down_);
    if (w.rec_down_.enabled()) w.rec_down_.add(start2, fin2, "pull " + std::to_string(u.chunk.tensor));
    clock_.schedule_event_on(s.out_lane, fin1, kServerOutFree, server, 0);
    const TimeNs at = add_saturated(fin2, cluster_.latency);
    // A pull that does not complete its layer only adds to the layer's count in the
    // worker's loop (the forward gate opens on the last one), and the worker's downlink
    // delivers in the order it is given work: such a pull is reported now, with the time
    // it arrives, and only the layer's last pull is an event (ExchangeListener::on_pulled).
    const int layer = layout_.tensor(u.chunk.tensor).layer;
    Bytes& sent = w.pulls_sent_[static_cast<std::size_t>(layer)];
    sent += u.chunk.length;
    if (sent < layout_.layer_bytes(layer)) {
      ++silent_;
      w.listener_->on_pulled(u, at);
      return;
    }
    sent = 0;
    clock_.schedule_event(at, kPullArrive, wid, units_.add(u, 1));  // few: a layer's last
  }

  SimClock& clock_;
  const ClusterConfig& cluster_;
  const TensorLayout& layout_;
  const Placement& placement_;
  BandwidthSchedule schedule_;
  std::deque<BandwidthSchedule> host_schedules_;  // per-host rates (stable addresses)
  bool acks_;
  std::vector<std::unique_ptr<Port>> ports_;
  std::vector<std::unique_ptr<Server>> servers_;
  UnitPool units_;
  std::uint64_t silent_ = 0;  // arrivals that needed no event (counted as events all the same)
  Status error_;
};

}  // namespace

Result<SimResult> simulate_ps(const Profile& profile, const std::string& policy_name,
                              const PolicyOptions& popts, const ClusterConfig& cluster,
                              const SimOptions& opts) {
  const TensorLayout layout(profile);
  const Placement placement(layout, cluster.servers, popts.split_threshold, cluster.server_shares);
  auto factor_of = [&](int w) {
    return cluster.compute_factor.empty() ? 1.0 : cluster.compute_factor[static_cast<std::size_t>(w)];
  };
  std::vector<std::unique_ptr<PsPolicy>> policies;
  for (int w = 0; w < cluster.workers; ++w) {
    const PsContext ctx{&profile, &layout, &placement, cluster.workers, cluster.servers,
                        cluster.worker_rate(w), cluster.latency, factor_of(w)};
    QS_ASSIGN_OR_RETURN(auto p, make_ps_policy(policy_name, popts, ctx));
    policies.push_back(std::move(p));
  }
  SimResult result;
  result.policy = policy_name;
  SimClock clock;
  PsNetwork net(clock, cluster, layout, placement, policies[0]->server_discipline(), policies[0]->wants_acks());
  std::vector<std::unique_ptr<EmulatedCompute>> gpus;
  std::vector<std::unique_ptr<LaneTimer>> timers;  // per worker: its GPU's and its loop's callbacks
  std::vector<std::unique_ptr<TrainingLoop>> loops;
  bool any_failed = false;  // some loop failed: look for the first error (not O(N) per event)
  for (int w = 0; w < cluster.workers; ++w) {
    const double factor = factor_of(w);
    PsNetwork::Port& port = net.add_port(policies[static_cast<std::size_t>(w)]->discipline());
    if (opts.record_trace) port.record(&result.trace);
    LaneTimer& timer = *timers.emplace_back(std::make_unique<LaneTimer>(clock));
    gpus.push_back(std::make_unique<EmulatedCompute>(
        profile, factor, timer, opts.record_trace ? SpanRecorder(&result.trace, w, 0, true) : SpanRecorder()));
    LoopOptions lo;
    lo.iterations = opts.iterations;
    lo.verify_bytes = opts.verify_bytes;
    lo.failed = [&any_failed](const Status&) { any_failed = true; };
    loops.push_back(std::make_unique<TrainingLoop>(profile, layout, *policies[static_cast<std::size_t>(w)],
                                                   timer, *gpus.back(), port, std::move(lo)));
    port.set_listener(loops.back().get());
  }
  auto first_error = [&]() -> Status {
    if (!net.error().is_ok()) return net.error();
    for (std::size_t w = 0; w < loops.size(); ++w) {
      if (!loops[w]->error().is_ok()) return loops[w]->error().with_context("worker " + std::to_string(w));
    }
    return Status::ok();
  };
  for (auto& l : loops) l->start();
  while (!clock.empty()) {
    const auto e = clock.pop();
    if (e.time >= kSimHorizon) return horizon_error();
    if (!clock.run_callback(e)) net.dispatch(e.payload);
    if (!any_failed && net.error().is_ok()) continue;
    if (Status s = first_error(); !s.is_ok()) return s;
  }
  for (std::size_t w = 0; w < loops.size(); ++w) {
    if (!loops[w]->finished()) {
      return internal_error("simulation stalled: worker " + std::to_string(w) + " finished " +
                            std::to_string(loops[w]->iterations_done()) + " of " + std::to_string(opts.iterations) +
                            " iterations (a policy never pushed some gradient?)");
    }
  }
  // Iteration k of the cluster ends when its slowest worker's does (with an oracle or
  // unequal compute speeds, workers differ).
  const auto& r0 = loops[0]->records();
  std::vector<double> utilisation;
  for (std::size_t k = 0; k < r0.size(); ++k) {
    TimeNs t = 0;
    for (const auto& l : loops) t = std::max(t, l->records()[k].time);
    result.iteration_times.push_back(t);
    utilisation.push_back(r0[k].utilisation);
  }
  result.link_utilisation = steady_median(utilisation, opts.warmup);
  result.bytes_pushed_per_iteration = r0.back().traffic.bytes;
  result.messages_per_iteration = r0.back().traffic.messages;
  result.events = clock.fired() + net.silent_events();
  result.queue_events = clock.fired();
  finish_result(profile, cluster, opts, &result);
  return result;
}

}  // namespace qs
