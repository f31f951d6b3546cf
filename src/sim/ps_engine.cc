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
// ClusterConfig::link_sharing = kFair (FluidLinks): messages go as over the runtime's TCP
// connections instead: a host starts its queue's head whenever the head's peer has no
// message of this host's in flight, then the next, stopping at the first head whose peer
// is busy (transport/sender.h), and the messages in flight share each link max-min fairly
// (a server's pulls of one sum leave to all workers at once, as do a worker's slices of
// one tensor to all servers). Not for packet-level policies (Mercury: one packet at a time
// per sender, in priority order), stop-and-wait ones (P3: one short slice per worker in
// flight, a burst the links queue whole; PsPolicy::stop_and_wait()) nor several jobs:
// those keep the per-message model.
//
// Several jobs under JobSharing::kFlows share the links the same way, as the runtime's jobs
// do over TCP connections of their own: their messages in flight share each link max-min
// fairly, byte by byte, while each job keeps its own model within itself: under
// LinkSharing::kFair (and neither packet-level nor stop-and-wait) the rule above, else one
// message of the job at a time per host (the per-message model's one unit per link, or
// Mercury's packets one at a time in priority order). With one job nothing changes.
//
// ClusterConfig::ack_queue (default 0, off): an acknowledgement waits behind the pull the
// server's uplink is sending and behind what the worker's downlink still carries, up to
// this long (the standing queue of a shaper that TCP keeps full), instead of taking the
// latency only; it does not wait for pulls the server has not started, as the runtime's
// control frames go ahead of those (issue 14 point 7; docs/simulator.md).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/priority_fifo.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/policy/ps_policy.h"
#include "sim_clock.h"

namespace qs {
namespace {

// A transport queue under a discipline: PriorityFifo, or plain FIFO as its one priority
// (no variant to dispatch on in the hot path).
template <typename T>
class TxQueue {
 public:
  TxQueue(QueueDiscipline d, int priorities)
      : fifo_(d != QueueDiscipline::kPriority), q_(fifo_ ? 1 : priorities) {}
  bool empty() const { return q_.empty(); }
  void push(int priority, T v) { q_.push(fifo_ ? 0 : priority, std::move(v)); }
  // The element pop() would return, to update in place.
  T& front() { return q_.top(); }
  T pop() { return q_.pop(); }

 private:
  bool fifo_;
  PriorityFifo<T> q_;
};

struct Link {
  const BandwidthSchedule* schedule = nullptr;
  TimeNs busy_until = 0;
  TimeNs frame_cpu = 0;  // added to every frame's time on this link
  Bytes burst = 0;       // token bucket depth (ClusterConfig::link_burst); 0: none

  // Cut-through transfer of one frame of `bytes` (header included) from this link (free
  // from `now`) to `to`: this link is busy until it serialised them; they arrive once `to`
  // carried them too, behind what it already carries. Returns (this link's end, the
  // arrival at the far end).
  // `convert`: the frame's conversion cost at each end (ClusterConfig::convert_time).
  std::pair<TimeNs, TimeNs> transfer(TimeNs now, Bytes bytes, Link& to, TimeNs convert = 0) {
    const TimeNs fin1 = serialise(now, bytes) + frame_cpu + convert;
    const TimeNs start2 = std::max(now, to.busy_until);
    const TimeNs fin2 = std::max(fin1, to.serialise(start2, bytes) + to.frame_cpu + convert);
    to.busy_until = fin2;
    busy_until = fin1;
    return {fin1, fin2};
  }
  // When a frame of `bytes` starting at `start` (the link free) has left: at the rate, or
  // with a burst (a token bucket, as the emulated cluster's tbf shapers are) at once for
  // the bytes the bucket holds, which refills at the rate while the link idles, up to
  // `burst`.
  TimeNs serialise(TimeNs start, Bytes bytes) {
    if (burst <= 0) return finish_time(start, bytes);
    const std::int64_t bps = schedule->rate_at(start).bits_per_second;
    const __int128 refill =
        static_cast<__int128>(std::max<TimeNs>(0, start - tokens_at_)) * bps / 8'000'000'000;
    const Bytes held = static_cast<Bytes>(std::min<__int128>(burst, tokens_ + refill));
    if (held >= bytes) {
      tokens_ = held - bytes;
      tokens_at_ = start;
      return start;
    }
    const TimeNs fin = schedule->finish_time(start, bytes - held);
    tokens_ = 0;
    tokens_at_ = fin;
    return fin;
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
  Bytes tokens_ = 0;  // burst: the bucket's bytes at tokens_at_ (it starts full: see serialise)
  TimeNs tokens_at_ = INT64_MIN / 2;
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
// The slot also names the unit's job.
class UnitPool {
 public:
  std::uint32_t add(const PushUnit& u, int refs, int job) {
    std::uint32_t slot;
    if (free_.empty()) {
      QS_CHECK(units_.size() < UINT32_MAX);
      slot = static_cast<std::uint32_t>(units_.size());
      units_.push_back(Entry{u, refs, job});
    } else {
      slot = free_.back();
      free_.pop_back();
      units_[slot] = Entry{u, refs, job};
    }
    return slot;
  }
  // A copy: the slot may be reused and the storage moved once released.
  PushUnit get(std::uint32_t slot) const { return units_[slot].unit; }
  int job(std::uint32_t slot) const { return units_[slot].job; }
  void release(std::uint32_t slot) {
    if (--units_[slot].refs == 0) free_.push_back(slot);
  }

 private:
  struct Entry {
    PushUnit unit;
    int refs;
    int job;
  };
  std::vector<Entry> units_;
  std::vector<std::uint32_t> free_;
};

// Max-min fair sharing of links among the messages in flight (LinkSharing::kFair). Each
// flow crosses two links, its sender's uplink and its receiver's downlink. reshare()
// gives every flow its rate by progressive filling (Bertsekas & Gallager, Data Networks,
// 6.5.2): the link whose capacity left over its flows not yet fixed is least fixes them
// at that share and leaves the others less capacity, until every flow has its rate. The
// owner calls it after every start and end. Progress is integer: a flow's bits left times
// 1e9, less its rate (bit/s) times the nanoseconds elapsed. Cost of one reshare:
// O(L x (L + F)) for the F flows in flight and the L links they cross (in the PS
// topology, each host has at most one flow per peer in flight). A flow may cross one link
// only (the other index -1).
class FluidLinks {
 public:
  // What a flow carries is its owner's (kind, from, to, unit).
  struct Flow {
    int up = 0, down = 0;  // link indices (-1: none)
    std::uint8_t kind = 0;
    int from = 0, to = 0;
    std::uint32_t unit = 0;
    TimeNs start = 0;
    std::uint8_t part = 0;  // the owner's: which part of its message the flow is
    __int128 left = 0;      // bits x 1e9
    std::int64_t rate = 0;  // bit/s; 0 until the next reshare()
  };
  static constexpr TimeNs kNever = INT64_MAX;

  // Link i's rates follow *schedules[i] (not owned).
  explicit FluidLinks(std::vector<const BandwidthSchedule*> schedules)
      : schedules_(std::move(schedules)),
        cap_(schedules_.size(), 0),
        count_(schedules_.size(), 0) {}
  bool empty() const { return flows_.empty(); }
  // Every flow's progress up to `now` at its current rate.
  void advance(TimeNs now) {
    const TimeNs dt = now - last_;
    last_ = now;
    if (dt <= 0) return;
    for (Flow& f : flows_)
      f.left = std::max<__int128>(0, f.left - static_cast<__int128>(f.rate) * dt);
  }
  // Starts `f` (advance() to its start first): `bytes` to send.
  void add(Flow f, Bytes bytes) {
    f.left = static_cast<__int128>(bytes) * 8 * 1'000'000'000;
    f.rate = 0;
    flows_.push_back(f);
  }
  // Removes the flows that have sent everything, in the order they started.
  std::vector<Flow> take_done() {
    std::vector<Flow> done;
    std::erase_if(flows_, [&](const Flow& f) {
      if (f.left > 0) return false;
      done.push_back(f);
      return true;
    });
    return done;
  }
  // Rates by progressive filling at `now`; returns when the next flow ends or a link's rate
  // changes (kNever: no flow).
  TimeNs reshare(TimeNs now) {
    links_.clear();
    for (Flow& f : flows_) {
      for (const int l : {f.up, f.down}) {
        if (l < 0) continue;
        if (count_[static_cast<std::size_t>(l)]++ == 0) {
          links_.push_back(l);
          cap_[static_cast<std::size_t>(l)] =
              schedules_[static_cast<std::size_t>(l)]->rate_at(now).bits_per_second;
        }
      }
      f.rate = -1;  // not fixed yet
    }
    std::size_t open = flows_.size();
    while (open > 0) {
      int best = -1;
      std::int64_t share = 0;
      for (const int l : links_) {  // in first-use order: ties go to the earlier link
        const auto i = static_cast<std::size_t>(l);
        if (count_[i] == 0) continue;
        const std::int64_t s = std::max<std::int64_t>(1, cap_[i] / count_[i]);
        if (best < 0 || s < share) {
          best = l;
          share = s;
        }
      }
      for (Flow& f : flows_) {
        if (f.rate >= 0 || (f.up != best && f.down != best)) continue;
        f.rate = share;
        for (const int l : {f.up, f.down}) {
          if (l < 0) continue;
          cap_[static_cast<std::size_t>(l)] -= share;
          --count_[static_cast<std::size_t>(l)];
        }
        --open;
      }
    }
    TimeNs next = kNever;
    for (const Flow& f : flows_) {
      const __int128 wait = (f.left + f.rate - 1) / f.rate;
      next = std::min<TimeNs>(
          next, add_saturated(now, static_cast<TimeNs>(std::min<__int128>(wait, kNever))));
    }
    for (const int l : links_) {
      const auto& segs = schedules_[static_cast<std::size_t>(l)]->segments();
      const auto k = std::upper_bound(
          segs.begin(), segs.end(), now,
          [](TimeNs t, const BandwidthSchedule::Segment& g) { return t < g.start; });
      if (k != segs.end()) next = std::min(next, k->start);
    }
    return next;
  }

 private:
  std::vector<const BandwidthSchedule*> schedules_;
  std::vector<Flow> flows_;        // in the order they started
  std::vector<std::int64_t> cap_;  // reshare(): per link, capacity not yet given (bit/s)
  std::vector<int> count_;         // reshare(): per link, its flows not yet fixed
  std::vector<int> links_;         // reshare(): the links with flows
  TimeNs last_ = 0;                // when the flows last advanced
};

enum Ev : std::uint8_t {
  kUplinkFree,     // a worker's uplink finished serialising a unit
  kServerArrive,   // a unit fully arrived at its server
  kAck,            // a server's acknowledgement reached the worker
  kServerOutFree,  // a server's uplink finished serialising a pull
  kPullArrive,     // a pulled (aggregated) unit fully arrived at the worker
  kFlowWake,       // LinkSharing::kFair: a flow ends or a rate changes (ref: the generation)
  kPushArrive,     // LinkSharing::kFair: a pushed unit arrived at its server (ref: its slot)
};

// What the network needs of one training job: its tensors and their placement, its
// policies' server discipline and whether they want acknowledgements, and the slack that
// JobSharing::kDeadline gives its units.
struct NetJob {
  const TensorLayout* layout = nullptr;
  const Placement* placement = nullptr;
  QueueDiscipline server_discipline = QueueDiscipline::kFifo;
  bool acks = false;
  bool per_message = false;  // PsPolicy::packet_level() or stop_and_wait(): never the TCP rule
  // Per tensor: from its layer's gradient being ready to its layer's next forward, if the
  // job computes without waiting (the backward of the layers before it in forward order,
  // then their update and forward): a unit's deadline is when it was handed over (a
  // worker's) or its sum completed (a server's) plus this.
  std::vector<TimeNs> slack;
};

// The simulated parameter-server network: every worker's Exchange (its Port, one per job)
// and the servers that sum and answer. Several jobs share the hosts' NICs (Mercury Fig.
// 20): each link serves one unit at a time, the jobs' queues by JobSharing, or under
// JobSharing::kFlows the jobs' messages share the links as flows (FluidLinks); with one
// job the network is the single job's, exactly.
class PsNetwork {
 public:
  // One job's side of one worker: its transport queue (under its policy's discipline) and
  // what it sent this iteration. The worker's NIC (Nic) is shared by its jobs.
  class Port final : public PsExchange {
   public:
    Port(PsNetwork& net, int job, int worker, QueueDiscipline d)
        : net_(net),
          job_(job),
          id_(worker),
          tx_(d, net.jobs_[static_cast<std::size_t>(job)].layout->num_tensors() + 1),
          ack_lane_(net.jobs_[static_cast<std::size_t>(job)].acks ? net.clock_.add_lane() : -1),
          peer_busy_(static_cast<std::size_t>(net.cluster_.servers), 0) {
      const auto layers =
          static_cast<std::size_t>(net.jobs_[static_cast<std::size_t>(job)].layout->num_layers());
      pulls_sent_.assign(layers, 0);
      queued_.assign(layers, 0);
      handed_at_.assign(layers, 0);
    }
    void set_listener(ExchangeListener* l) { listener_ = l; }
    // Trace processes: worker w of job j is process j * N + w (one job: the worker).
    void record(std::vector<TraceSpan>* trace) {
      const int pid = job_ * net_.cluster_.workers + id_;
      rec_up_ = SpanRecorder(trace, pid, 1, true);
      rec_down_ = SpanRecorder(trace, pid, 2, true);
    }

    // Queues without sending: the loop flushes once the policy callback that pushed
    // returns, so that all units pushed in one callback compete by priority.
    void push(const PushUnit& u) override {
      if (net_.sharing_ == JobSharing::kDeadline && net_.jobs_.size() > 1) {
        // The layer's units entered the queue when its first one did (its gradient was
        // ready): the same deadline for all.
        const auto l = static_cast<std::size_t>(
            net_.jobs_[static_cast<std::size_t>(job_)].layout->tensor(u.chunk.tensor).layer);
        if (queued_[l]++ == 0) handed_at_[l] = net_.clock_.now();
      }
      tx_.push(u.priority, u);
    }
    void flush() override { net_.try_send(id_); }
    Status check(const PushUnit& u) const override {
      const NetJob& j = net_.jobs_[static_cast<std::size_t>(job_)];
      return check_push_unit(u, *j.layout, *j.placement);
    }
    Traffic take_traffic(TimeNs) override {
      // The wire's bytes: compression halves them (ClusterConfig::wire_element_bytes).
      const int element = net_.cluster_.wire_element_bytes;
      Traffic t{bytes_, units_, static_cast<std::uint64_t>(net_.cluster_.wire_payload(bytes_)),
                busy_, 0};
      t.float32_per_wire_byte = 4.0 / element;
      bytes_ = busy_ = 0;
      units_ = 0;
      return t;
    }

   private:
    friend class PsNetwork;
    PsNetwork& net_;
    int job_;
    int id_;  // the worker
    ExchangeListener* listener_ = nullptr;
    TxQueue<PushUnit> tx_;
    int ack_lane_;  // acknowledgements for this worker (mostly in time order), if any
    // Shared links (fluid_on_): per server, whether a push of this port to it is in flight;
    // the pushes in flight and since when the port has had one (its busy time).
    std::vector<char> peer_busy_;
    int in_flight_ = 0;
    TimeNs busy_since_ = 0;
    std::vector<Bytes>
        pulls_sent_;  // per layer, this iteration's pulls sent so far (try_send_server)
    // JobSharing::kDeadline: per layer, units queued and when the first of them was.
    std::vector<int> queued_;
    std::vector<TimeNs> handed_at_;
    Bytes bytes_ = 0;
    std::int64_t units_ = 0;
    TimeNs busy_ = 0;  // uplink serialisation time this iteration
    SpanRecorder rec_up_, rec_down_;
  };

  PsNetwork(SimClock& clock, const ClusterConfig& cluster, std::vector<NetJob> jobs,
            JobSharing sharing)
      : clock_(clock),
        cluster_(cluster),
        jobs_(std::move(jobs)),
        sharing_(sharing),
        schedule_(cluster.link_schedule()) {
    bool acks = false;
    for (const NetJob& j : jobs_) acks |= j.acks;
    for (int w = 0; w < cluster.workers; ++w) {
      Nic& n = *nics_.emplace_back(std::make_unique<Nic>());
      n.up.schedule = n.down.schedule = host_schedule(cluster.worker_bandwidth, w);
      n.up.frame_cpu = n.down.frame_cpu = cluster.frame_cpu;
      n.up.burst = n.down.burst = cluster.link_burst;
      n.up_lane = clock.add_lane();
      n.ports.resize(jobs_.size(), nullptr);
      n.fair.finish.assign(jobs_.size(), 0);
    }
    for (int s = 0; s < cluster.servers; ++s) {
      // Without acknowledgements only an arrival that completes a sum is an event (try_send):
      // few, and the heap takes them; with them every arrival is, on the server's lane.
      const int in_lane = acks ? clock.add_lane() : -1;
      Server& srv = *servers_.emplace_back(std::make_unique<Server>(in_lane, clock.add_lane()));
      srv.in.schedule = srv.out.schedule = host_schedule(cluster.server_bandwidth, s);
      srv.in.frame_cpu = srv.out.frame_cpu = cluster.frame_cpu;
      srv.in.burst = srv.out.burst = cluster.link_burst;
      for (const NetJob& j : jobs_)
        srv.jobs.emplace_back(j.server_discipline, j.layout->num_tensors() + 1);
      srv.fair.finish.assign(jobs_.size(), 0);
    }
    fluid_on_ = jobs_.size() == 1
                    ? cluster.link_sharing == LinkSharing::kFair && !jobs_[0].per_message
                    : sharing == JobSharing::kFlows;
    for (const NetJob& j : jobs_)
      serial_.push_back(j.per_message || cluster.link_sharing != LinkSharing::kFair);
    if (fluid_on_) {
      // Links: worker w's uplink 2w and downlink 2w + 1, then server s's 2(N + s), 2(N + s) + 1.
      std::vector<const BandwidthSchedule*> schedules;
      for (const auto& n : nics_)
        schedules.insert(schedules.end(), {n->up.schedule, n->down.schedule});
      for (const auto& srv : servers_)
        schedules.insert(schedules.end(), {srv->in.schedule, srv->out.schedule});
      down_q_.resize(jobs_.size() * schedules.size());
      down_busy_.assign(down_q_.size(), 0);
      fluid_ = std::make_unique<FluidLinks>(std::move(schedules));
      for (auto& srv : servers_) {
        for (ServerJob& sj : srv->jobs)
          sj.peer_busy.assign(static_cast<std::size_t>(cluster.workers), 0);
      }
    }
  }

  // Job `job`'s port at the next worker without one (ports are added worker by worker).
  Port& add_port(int job, QueueDiscipline d) {
    auto& mine = ports_.emplace_back();
    (void)mine;
    const int worker = static_cast<int>(ports_by_job_[static_cast<std::size_t>(job)].size());
    QS_CHECK(worker < cluster_.workers);
    ports_.back() = std::make_unique<Port>(*this, job, worker, d);
    ports_by_job_[static_cast<std::size_t>(job)].push_back(ports_.back().get());
    nics_[static_cast<std::size_t>(worker)]->ports[static_cast<std::size_t>(job)] =
        ports_.back().get();
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
      case kUplinkFree:
        on_uplink_free(e.index);
        break;
      case kServerArrive:
        on_server_arrive(e.index, e.ref);
        break;
      case kAck: {
        const PushUnit u = units_.get(e.ref);
        const int job = units_.job(e.ref);
        units_.release(e.ref);
        port(job, e.index).listener_->on_push_acked(u);
        break;
      }
      case kServerOutFree:
        try_send_server(e.index);
        break;
      case kFlowWake:
        on_flow_wake(e.ref);
        break;
      case kPushArrive: {
        const PushUnit u = units_.get(e.ref);
        const int job = units_.job(e.ref);
        units_.release(e.ref);
        summed(u.server, job, e.index, u, 0, true);
        break;
      }
      case kPullArrive: {
        const PushUnit u = units_.get(e.ref);
        const int job = units_.job(e.ref);
        units_.release(e.ref);
        port(job, e.index).listener_->on_pulled(u, clock_.now());
        break;
      }
    }
  }

 private:
  // JobSharing::kFair's state on one link: its virtual time, and per job where its last
  // unit ends (in bytes of the link).
  struct FairShare {
    Bytes virtual_time = 0;
    std::vector<Bytes> finish;
  };
  // A worker's NIC: one uplink and one downlink for all its jobs.
  struct Nic {
    Link up, down;
    int up_lane = -1;          // up's end of serialisation (one at a time)
    std::vector<Port*> ports;  // by job
    int sending = -1;          // the job whose unit the uplink carries (or last carried)
    FairShare fair;            // the uplink's
  };
  // A complete sum waiting on a server's uplink: its pulls to workers next..N-1 (one entry
  // for all N pulls, sent in worker order: exactly N consecutive entries of one FIFO).
  struct Pull {
    PushUnit unit;
    int next = 0;
    TimeNs deadline = 0;  // JobSharing::kDeadline: the completing copy's
  };
  // One job's side of a server: its sums in progress and the pulls it owes.
  struct ServerJob {
    ServerJob(QueueDiscipline d, int priorities) : out_q(d, priorities) {}
    AggMap agg;
    TxQueue<Pull> out_q;
    // Shared links (fluid_on_): per worker, whether a pull of this job to it is in flight,
    // and the pulls in flight.
    std::vector<char> peer_busy;
    int in_flight = 0;
  };
  // A unit on its way in: its job and worker (an arrival event names only the worker and
  // the server; the units are read in sequence, not from scattered slots).
  struct Arrival {
    int job;
    int worker;
    PushUnit unit;
    TimeNs deadline;  // JobSharing::kDeadline: when the worker needs the unit's sum
  };
  struct Server {
    Server(int in_lane, int out_lane) : in_lane(in_lane), out_lane(out_lane) {}
    Link in, out;
    int in_lane;   // the pushes arriving over `in`, in the order it delivers them (-1: the heap)
    int out_lane;  // out's end of serialisation (one at a time)
    FifoRing<Arrival> arriving;  // in the order they arrive
    std::vector<ServerJob> jobs;
    FairShare fair;  // the uplink's
  };

  Port& port(int job, int w) {
    return *ports_by_job_[static_cast<std::size_t>(job)][static_cast<std::size_t>(w)];
  }
  static std::uint64_t key(const Chunk& c) {
    return (static_cast<std::uint64_t>(c.tensor) << 40) ^ static_cast<std::uint64_t>(c.offset);
  }
  void fail(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
  }

  // JobSharing::kDeadline: when worker `p`'s unit of `tensor` is needed (its layer's next
  // forward, if the job computes without waiting): when the layer's first unit was
  // handed over plus the layer's slack.
  TimeNs deadline(const Port& p, TensorId tensor) const {
    const NetJob& nj = jobs_[static_cast<std::size_t>(p.job_)];
    return p.handed_at_[static_cast<std::size_t>(nj.layout->tensor(tensor).layer)] +
           nj.slack[static_cast<std::size_t>(tensor)];
  }

  // The job whose queue a free link serves next (-1: all empty). `empty(j)` is job j's
  // queue's, `bytes(j)` and `deadline(j)` its front unit's; with one job, that job whenever
  // it has something.
  template <typename Empty, typename Size, typename Deadline>
  int pick_job(FairShare& fair, Empty empty, Size bytes, Deadline deadline) const {
    const int n = static_cast<int>(jobs_.size());
    if (n == 1) return empty(0) ? -1 : 0;
    int best = -1;
    std::int64_t best_key = 0;  // bytes (kFair) or a time (kDeadline)
    for (int j = 0; j < n; ++j) {
      if (empty(j)) continue;
      if (sharing_ == JobSharing::kStrict) return j;
      // kFair: start-time fair queueing (Goyal et al., SIGCOMM'96) over the link's bytes: a
      // job's next unit starts at the later of the link's virtual time and the end of the
      // job's previous unit, and the earliest start goes first, so jobs of any unit size
      // share the link's bytes equally (separate transports sharing a NIC).
      // kDeadline (Mercury Fig. 20, the paper's future work: priorities that hold across
      // jobs): earliest deadline first. Within one job the deadlines follow Mercury's order
      // (a layer's deadline is its next forward's start), so each job's own scheduler still
      // decides among its units. Ties: the lower job.
      const std::int64_t key =
          sharing_ == JobSharing::kFair
              ? std::max(fair.virtual_time, fair.finish[static_cast<std::size_t>(j)])
              : deadline(j);
      if (best < 0 || key < best_key) {
        best = j;
        best_key = key;
      }
    }
    if (best >= 0 && sharing_ == JobSharing::kFair) {
      fair.virtual_time = best_key;
      fair.finish[static_cast<std::size_t>(best)] = best_key + bytes(best);
    }
    return best;
  }

  void try_send(int worker) {
    if (fluid_on_) return try_send_fluid(worker);
    Nic& n = *nics_[static_cast<std::size_t>(worker)];
    const TimeNs now = clock_.now();
    if (n.up.busy_until > now) return;
    const int job = pick_job(
        n.fair, [&](int j) { return n.ports[static_cast<std::size_t>(j)]->tx_.empty(); },
        [&](int j) { return n.ports[static_cast<std::size_t>(j)]->tx_.front().chunk.length; },
        [&](int j) {
          Port& p = *n.ports[static_cast<std::size_t>(j)];
          return deadline(p, p.tx_.front().chunk.tensor);
        });
    if (job < 0) return;
    Port& w = *n.ports[static_cast<std::size_t>(job)];
    const NetJob& nj = jobs_[static_cast<std::size_t>(job)];
    PushUnit u = w.tx_.pop();
    TimeNs due = 0;
    if (sharing_ == JobSharing::kDeadline && jobs_.size() > 1) {
      due = deadline(w, u.chunk.tensor);
      --w.queued_[static_cast<std::size_t>(nj.layout->tensor(u.chunk.tensor).layer)];
    }
    Server& s = *servers_[static_cast<std::size_t>(u.server)];
    const auto [fin1, fin2] =
        n.up.transfer(now, cluster_.wire_payload(u.chunk.length) + cluster_.frame_header, s.in,
                      cluster_.convert_time(u.chunk.length));
    w.busy_ += fin1 - now;
    w.bytes_ += u.chunk.length;
    ++w.units_;
    n.sending = job;
    if (w.rec_up_.enabled()) w.rec_up_.add(now, fin1, "push " + std::to_string(u.chunk.tensor));
    clock_.schedule_event_on(n.up_lane, fin1, kUplinkFree, worker, 0);
    if (!nj.acks) {
      // Without acknowledgements an arrival that does not complete its sum changes nothing
      // but the count, and the server's link delivers in the order it is given work: the
      // copy sent N-th is the one that arrives N-th. So the count is kept here and only
      // the completing arrival is an event (the others are counted in silent_events()).
      auto& a = s.jobs[static_cast<std::size_t>(job)].agg.find_or_insert(key(u.chunk));
      if (a.count == 0) {
        a.length = u.chunk.length;
      } else if (a.length != u.chunk.length) {
        return fail(mismatch(u));
      }
      if (++a.count < cluster_.workers) {
        ++silent_;
        return;
      }
      s.jobs[static_cast<std::size_t>(job)].agg.erase(a);
    }
    s.arriving.push(Arrival{job, worker, u, due});
    clock_.schedule_event_on(s.in_lane, add_saturated(fin2, cluster_.latency), kServerArrive,
                             worker, static_cast<std::uint32_t>(u.server));
  }
  static Status mismatch(const PushUnit& u) {
    return internal_error("workers cut different units: tensor " + std::to_string(u.chunk.tensor) +
                          " offset " + std::to_string(u.chunk.offset));
  }

  // The uplink finished a unit: with nothing queued, everything its job handed over is on
  // the wire.
  void on_uplink_free(int worker) {
    Nic& n = *nics_[static_cast<std::size_t>(worker)];
    Port& w = *n.ports[static_cast<std::size_t>(n.sending)];
    if (w.tx_.empty()) w.listener_->on_drained(clock_.now());
    try_send(worker);
  }

  void on_server_arrive(int worker, std::uint32_t server) {
    Server& s = *servers_[server];
    // A link delivers in order, and its arrivals are a lane of the clock: the same order.
    QS_CHECK(!s.arriving.empty() && s.arriving.front().worker == worker);
    const Arrival arrival = s.arriving.pop();
    s.arriving.prefetch_second();
    // Without acknowledgements try_send counted the copies, and this one completes the sum.
    summed(static_cast<int>(server), arrival.job, worker, arrival.unit, arrival.deadline,
           jobs_[static_cast<std::size_t>(arrival.job)].acks);
  }

  // Worker `worker`'s unit `u` of job `job` arrived at server `server`: its acknowledgement
  // (if the job wants them), its count if `count` (else the caller counted it and it
  // completes the sum), and the pulls once the sum is complete.
  void summed(int server, int job, int worker, const PushUnit& u, TimeNs due, bool count) {
    Server& s = *servers_[static_cast<std::size_t>(server)];
    ServerJob& sj = s.jobs[static_cast<std::size_t>(job)];
    if (jobs_[static_cast<std::size_t>(job)].acks) {
      // With shared links a worker's units may arrive out of order: not a lane.
      clock_.schedule_event_on(fluid_on_ ? -1 : port(job, worker).ack_lane_,
                               add_saturated(ack_time(s, worker), cluster_.latency), kAck, worker,
                               units_.add(u, 1, job));
    }
    if (count) {
      auto& a = sj.agg.find_or_insert(key(u.chunk));
      if (a.count == 0) {
        a.length = u.chunk.length;
      } else if (a.length != u.chunk.length) {
        return fail(mismatch(u));
      }
      if (++a.count < cluster_.workers) return;
      sj.agg.erase(a);
    }
    // Sum complete: one pull per worker (Mercury IV-C "PS Sender").
    if (cluster_.overlapping_pulls) {
      // Mercury eq. 7: tau_pull = tau_push + t_pull, no pull waits for another.
      const TimeNs now = clock_.now();
      // With hosts of different rates, each pull takes its time at the slower of the two NICs.
      const Bytes bytes = cluster_.wire_payload(u.chunk.length) + cluster_.frame_header;
      const TimeNs convert = cluster_.convert_time(u.chunk.length);
      const TimeNs from_server = s.out.finish_time(now, bytes) + convert;
      const std::uint32_t sum = units_.add(u, cluster_.workers, job);
      for (int w = 0; w < cluster_.workers; ++w) {
        const TimeNs fin =
            std::max(from_server,
                     nics_[static_cast<std::size_t>(w)]->down.finish_time(now, bytes) + convert) +
            cluster_.frame_cpu;
        if (port(job, w).rec_down_.enabled()) {
          port(job, w).rec_down_.add(now, fin, "pull " + std::to_string(u.chunk.tensor));
        }
        clock_.schedule_event(add_saturated(fin, cluster_.latency), kPullArrive, w, sum);
      }
      return;
    }
    sj.out_q.push(u.priority, Pull{u, 0, due});
    try_send_server(server);
  }

  // When the server's acknowledgement of a push leaves for the worker: at once, or with
  // ClusterConfig::ack_queue behind the pull in flight on the server's uplink and the
  // backlog of the worker's downlink, up to ack_queue.
  TimeNs ack_time(const Server& s, int worker) const {
    const TimeNs now = clock_.now();
    if (cluster_.ack_queue <= 0) return now;
    const TimeNs server_backlog = std::max<TimeNs>(0, s.out.busy_until - now);
    const TimeNs worker_backlog =
        std::max<TimeNs>(0, nics_[static_cast<std::size_t>(worker)]->down.busy_until - now);
    return now + std::min(cluster_.ack_queue, std::max(server_backlog, worker_backlog));
  }

  void try_send_server(int server) {
    if (fluid_on_) return try_send_server_fluid(server);
    Server& s = *servers_[static_cast<std::size_t>(server)];
    const TimeNs now = clock_.now();
    if (s.out.busy_until > now) return;
    const int job = pick_job(
        s.fair, [&](int j) { return s.jobs[static_cast<std::size_t>(j)].out_q.empty(); },
        [&](int j) { return s.jobs[static_cast<std::size_t>(j)].out_q.front().unit.chunk.length; },
        [&](int j) { return s.jobs[static_cast<std::size_t>(j)].out_q.front().deadline; });
    if (job < 0) return;
    ServerJob& sj = s.jobs[static_cast<std::size_t>(job)];
    Pull& next = sj.out_q.front();
    const int wid = next.next++;
    const PushUnit u = next.unit;
    if (next.next == cluster_.workers) sj.out_q.pop();
    Port& w = port(job, wid);
    Nic& n = *nics_[static_cast<std::size_t>(wid)];
    const TimeNs start2 = std::max(now, n.down.busy_until);
    const auto [fin1, fin2] =
        s.out.transfer(now, cluster_.wire_payload(u.chunk.length) + cluster_.frame_header, n.down,
                       cluster_.convert_time(u.chunk.length));
    if (w.rec_down_.enabled())
      w.rec_down_.add(start2, fin2, "pull " + std::to_string(u.chunk.tensor));
    clock_.schedule_event_on(s.out_lane, fin1, kServerOutFree, server, 0);
    const TimeNs at = add_saturated(fin2, cluster_.latency);
    // A pull that does not complete its layer only adds to the layer's count in the
    // worker's loop (the forward gate opens on the last one), and the worker's downlink
    // delivers in the order it is given work: such a pull is reported now, with the time
    // it arrives, and only the layer's last pull is an event (ExchangeListener::on_pulled).
    const TensorLayout& layout = *jobs_[static_cast<std::size_t>(job)].layout;
    const int layer = layout.tensor(u.chunk.tensor).layer;
    Bytes& sent = w.pulls_sent_[static_cast<std::size_t>(layer)];
    sent += u.chunk.length;
    if (sent < layout.layer_bytes(layer)) {
      ++silent_;
      w.listener_->on_pulled(u, at);
      return;
    }
    sent = 0;
    clock_.schedule_event(at, kPullArrive, wid, units_.add(u, 1, job));  // few: a layer's last
  }

  // Shared links: worker `worker` starts each job's queue's units in order (job by job)
  // while the job's own model lets it: under LinkSharing::kFair while each one's server has
  // no push of this job's worker in flight (transport/sender.h), else (serial_) one push
  // of the job at a time.
  void try_send_fluid(int worker) {
    Nic& n = *nics_[static_cast<std::size_t>(worker)];
    const TimeNs now = clock_.now();
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      Port& w = *n.ports[j];
      while (!w.tx_.empty() &&
             (serial_[j] ? w.in_flight_ == 0
                         : !w.peer_busy_[static_cast<std::size_t>(w.tx_.front().server)])) {
        const PushUnit u = w.tx_.pop();
        w.peer_busy_[static_cast<std::size_t>(u.server)] = 1;
        if (w.in_flight_++ == 0) w.busy_since_ = now;
        w.bytes_ += u.chunk.length;
        ++w.units_;
        send(static_cast<int>(j),
             FluidLinks::Flow{2 * worker, 2 * (cluster_.workers + u.server) + 1, kPushArrive,
                              worker, u.server, units_.add(u, 1, static_cast<int>(j)), now},
             u.chunk.length);
      }
    }
  }
  // Server `server` starts each job's pulls in order while the job's model lets it: while
  // each one's worker has no pull of this server's job in flight, or (serial_) one at a time.
  void try_send_server_fluid(int server) {
    Server& s = *servers_[static_cast<std::size_t>(server)];
    const TimeNs now = clock_.now();
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      ServerJob& sj = s.jobs[j];
      while (!sj.out_q.empty() &&
             (serial_[j] ? sj.in_flight == 0
                         : !sj.peer_busy[static_cast<std::size_t>(sj.out_q.front().next)])) {
        Pull& next = sj.out_q.front();
        const int wid = next.next++;
        const PushUnit u = next.unit;
        if (next.next == cluster_.workers) sj.out_q.pop();
        sj.peer_busy[static_cast<std::size_t>(wid)] = 1;
        ++sj.in_flight;
        send(static_cast<int>(j),
             FluidLinks::Flow{2 * (cluster_.workers + server), 2 * wid + 1, kPullArrive, server,
                              wid, units_.add(u, 1, static_cast<int>(j)), now},
             u.chunk.length);
      }
    }
  }
  // Job `job`'s message `f` (both links): one flow over both, or for a serial_ job the
  // per-message model as flows: one over the sender's link, which frees the sender when it
  // ends, and one over the receiver's, queued behind the job's others there (one at a
  // time, in the order they were sent), both starting now if they can (cut-through); it
  // arrives when both have ended. With the job alone on its links this is the per-message
  // model; beside other jobs each link is shared equally among the jobs that use it.
  void send(int job, FluidLinks::Flow f, Bytes payload) {
    if (!serial_[static_cast<std::size_t>(job)]) return start_flow(f, payload);
    if (pending_.size() <= f.unit) pending_.resize(f.unit + 1, 0);
    pending_[f.unit] = 2;
    FluidLinks::Flow up = f, down = f;
    up.down = -1;
    up.part = kSenderPart;
    down.up = -1;
    down.part = kReceiverPart;
    start_flow(up, payload);
    const std::size_t q = static_cast<std::size_t>(job) * 2 *
                              static_cast<std::size_t>(cluster_.workers + cluster_.servers) +
                          static_cast<std::size_t>(f.down);
    if (down_busy_[q]) {
      down_q_[q].push_back(DownPart{down, payload});
    } else {
      down_busy_[q] = 1;
      start_flow(down, payload);
    }
  }
  void start_flow(const FluidLinks::Flow& f, Bytes payload) {
    fluid_->advance(clock_.now());
    fluid_->add(f, cluster_.wire_payload(payload) + cluster_.frame_header);
    // The rates change: reshare once the current event is done (one reshare for every
    // flow it starts), unless a wake is already due now or on_flow_wake reshares anyway.
    if (in_wake_ || wake_at_ == clock_.now()) return;
    wake_at_ = clock_.now();
    clock_.schedule_event(wake_at_, kFlowWake, 0, ++wake_generation_);
  }
  // The flows that ended by now hand their units on (frame_cpu and the latency later);
  // then every rate is recomputed and the next wake scheduled. A wake of an older
  // generation is stale (the rates changed since it was scheduled).
  void on_flow_wake(std::uint32_t generation) {
    if (generation != wake_generation_) return;
    const TimeNs now = clock_.now();
    fluid_->advance(now);
    in_wake_ = true;
    for (const FluidLinks::Flow& f : fluid_->take_done()) {
      const int job = units_.job(f.unit);
      if (f.part == kReceiverPart) {
        // The job's next message queued on this link starts.
        const std::size_t q = static_cast<std::size_t>(job) * 2 *
                                  static_cast<std::size_t>(cluster_.workers + cluster_.servers) +
                              static_cast<std::size_t>(f.down);
        if (down_q_[q].empty()) {
          down_busy_[q] = 0;
        } else {
          const DownPart next = down_q_[q].front();
          down_q_[q].pop_front();
          FluidLinks::Flow d = next.flow;
          d.start = now;
          start_flow(d, next.payload);
        }
      } else {
        sender_done(job, f);
      }
      if (f.part == kBothParts || --pending_[f.unit] == 0) arrived(job, f);
    }
    in_wake_ = false;
    wake_at_ = fluid_->reshare(now);
    ++wake_generation_;
    if (wake_at_ != FluidLinks::kNever)
      clock_.schedule_event(wake_at_, kFlowWake, 0, wake_generation_);
  }

  // Flow `f` of job `job` left its sender (its sender's link carried it): the sender may
  // start the next.
  void sender_done(int job, const FluidLinks::Flow& f) {
    const TimeNs now = clock_.now();
    if (f.kind == kPushArrive) {
      Port& w = port(job, f.from);
      w.peer_busy_[static_cast<std::size_t>(f.to)] = 0;
      if (--w.in_flight_ == 0) w.busy_ += now - w.busy_since_;
      if (w.rec_up_.enabled())
        w.rec_up_.add(f.start, now, "push " + std::to_string(units_.get(f.unit).chunk.tensor));
      if (w.in_flight_ == 0 && w.tx_.empty()) w.listener_->on_drained(now);
      try_send_fluid(f.from);
    } else {
      ServerJob& sj =
          servers_[static_cast<std::size_t>(f.from)]->jobs[static_cast<std::size_t>(job)];
      sj.peer_busy[static_cast<std::size_t>(f.to)] = 0;
      --sj.in_flight;
      try_send_server_fluid(f.from);
    }
  }
  // Flow `f`'s message of job `job` has arrived now: handed on frame_cpu and the latency later.
  void arrived(int job, const FluidLinks::Flow& f) {
    const TimeNs now = clock_.now();
    const TimeNs at = add_saturated(now + cluster_.frame_cpu, cluster_.latency);
    if (f.kind == kPushArrive) {
      clock_.schedule_event(at, kPushArrive, f.from, f.unit);
    } else {
      Port& w = port(job, f.to);
      if (w.rec_down_.enabled())
        w.rec_down_.add(f.start, now, "pull " + std::to_string(units_.get(f.unit).chunk.tensor));
      clock_.schedule_event(at, kPullArrive, f.to, f.unit);
    }
  }

  SimClock& clock_;
  const ClusterConfig& cluster_;
  std::vector<NetJob> jobs_;
  JobSharing sharing_;
  BandwidthSchedule schedule_;
  std::deque<BandwidthSchedule> host_schedules_;  // per-host rates (stable addresses)
  std::vector<std::unique_ptr<Nic>> nics_;        // by worker
  std::vector<std::unique_ptr<Port>> ports_;
  std::vector<std::vector<Port*>> ports_by_job_ = std::vector<std::vector<Port*>>(jobs_.size());
  std::vector<std::unique_ptr<Server>> servers_;
  UnitPool units_;
  std::uint64_t silent_ = 0;  // arrivals that needed no event (counted as events all the same)
  Status error_;
  // Links shared as flows (FluidLinks): on for one job under LinkSharing::kFair of a policy
  // that is neither packet-level nor stop-and-wait, and for several under JobSharing::kFlows.
  bool fluid_on_ = false;
  // Per job, with fluid_on_: whether its messages go one at a time per host (its own model
  // is the per-message one), else as over TCP (LinkSharing::kFair).
  std::vector<char> serial_;
  // A serial_ job's message as flows (send()): which part a flow is.
  static constexpr std::uint8_t kBothParts = 0, kSenderPart = 1, kReceiverPart = 2;
  struct DownPart {
    FluidLinks::Flow flow;
    Bytes payload;
  };
  // Per job and link (job * links + link): the receiver parts queued, and whether one is in flight.
  std::vector<std::deque<DownPart>> down_q_;
  std::vector<char> down_busy_;
  std::vector<std::uint8_t> pending_;  // per unit slot: the parts of its message not yet ended
  std::unique_ptr<FluidLinks> fluid_;
  TimeNs wake_at_ = FluidLinks::kNever;  // the kFlowWake of wake_generation_
  std::uint32_t wake_generation_ = 0;
  bool in_wake_ = false;  // on_flow_wake() is handing ended flows on
};

// A worker host's GPU shared by several jobs (Mercury Fig. 20: "the same 4 workers and 4
// PSes are utilized for all jobs"): processor sharing, as a GPU time-slices between
// processes: with k steps on the device each advances at 1/k of its speed alone. A job
// has one step at a time (its loop waits for each). Progress is kept in integers: a step's
// remaining work is its time alone times kScale, which every k up to kMaxSharedJobs
// divides, so that k steps each advance kScale / k per nanosecond exactly.
class SharedGpu {
 public:
  explicit SharedGpu(Timer& timer) : timer_(timer) {}
  // Starts a step that takes `solo` alone on the device; done(end) when it completes.
  void start(TimeNs solo, std::function<void(TimeNs)> done) {
    advance();
    active_.push_back(Step{static_cast<__int128>(solo) * kScale, std::move(done)});
    schedule_next();
  }

 private:
  static constexpr __int128 kScale = 720720;  // lcm(1..16)
  static_assert(kMaxSharedJobs <= 16);
  struct Step {
    __int128 remaining;
    std::function<void(TimeNs)> done;
  };
  void advance() {
    const TimeNs now = timer_.now();
    if (!active_.empty()) {
      const __int128 per_ns = kScale / static_cast<__int128>(active_.size());
      for (Step& s : active_)
        s.remaining = std::max<__int128>(0, s.remaining - (now - last_) * per_ns);
    }
    last_ = now;
  }
  // The next completion, at the current sharing; a change of the active steps makes the
  // event scheduled before it stale (its generation is past).
  void schedule_next() {
    const std::uint64_t generation = ++generation_;
    if (active_.empty()) return;
    __int128 least = active_.front().remaining;
    for (const Step& s : active_) least = std::min(least, s.remaining);
    const __int128 per_ns = kScale / static_cast<__int128>(active_.size());
    const auto wait = static_cast<TimeNs>((least + per_ns - 1) / per_ns);
    timer_.schedule_at(timer_.now() + wait, [this, generation] {
      if (generation != generation_) return;
      advance();
      std::vector<std::function<void(TimeNs)>> finished;
      std::erase_if(active_, [&](Step& s) {
        if (s.remaining > 0) return false;
        finished.push_back(std::move(s.done));
        return true;
      });
      schedule_next();
      for (auto& done : finished) done(timer_.now());  // may start the next steps
    });
  }

  Timer& timer_;
  std::vector<Step> active_;  // in the order they started
  TimeNs last_ = 0;           // when active_ last advanced
  std::uint64_t generation_ = 0;
};

// One job's view of a shared GPU (the Compute seam): EmulatedCompute's durations, on a
// device other jobs use too.
class SharedGpuCompute final : public Compute {
 public:
  SharedGpuCompute(const Profile& profile, double factor, Timer& timer, SharedGpu& gpu,
                   SpanRecorder recorder)
      : durations_(profile, factor, timer),
        profile_(profile),
        timer_(timer),
        gpu_(gpu),
        recorder_(std::move(recorder)) {}
  void run(const ComputeStep& step, TimeNs earliest, Done done) override {
    done_ = std::move(done);
    if (earliest > timer_.now()) {
      timer_.schedule_at(earliest, [this, step] { begin(step); });
    } else {
      begin(step);
    }
  }

 private:
  void begin(const ComputeStep& step) {
    const TimeNs start = timer_.now();
    gpu_.start(durations_.duration(step), [this, step, start](TimeNs end) {
      if (recorder_.enabled()) {
        recorder_.add(start, end,
                      (step.pass == Pass::kBackward ? "bp " : "fp ") +
                          profile_.layers[static_cast<std::size_t>(step.layer)].name);
      }
      Done d = std::move(done_);
      d(end);
    });
  }

  EmulatedCompute durations_;  // for duration() only
  const Profile& profile_;
  Timer& timer_;
  SharedGpu& gpu_;
  SpanRecorder recorder_;
  Done done_;
};

// Per tensor, NetJob::slack: the layers before its own, in forward order, compute their
// backward after it and their update and forward before it.
std::vector<TimeNs> slacks(const Profile& profile, const TensorLayout& layout) {
  std::vector<TimeNs> at_layer;
  TimeNs t = 0;
  for (const LayerSpec& l : profile.layers) {
    at_layer.push_back(t);
    t += l.backward + l.update + l.forward;
  }
  std::vector<TimeNs> out;
  for (const TensorInfo& ti : layout.tensors())
    out.push_back(at_layer[static_cast<std::size_t>(ti.layer)]);
  return out;
}

// The least any iteration of worker 0 takes (SimOptions::stop_at_least's bound for the
// iterations not ended): its compute, and, for a policy that communicates, the time its
// uplink takes to carry its push. An iteration's window, from the end of the previous
// forward to the end of its own, holds every push of its gradients: none is ready before
// its backward, and every byte's sum must be pulled before the forward that needs it. On a
// link of rate R with a token bucket of depth D, X bytes take at least (X - D) / R. Only
// at a constant rate (a time-varying one may run faster later).
TimeNs least_iteration(const Profile& profile, const PsPolicy& policy, const ClusterConfig& cluster,
                       double factor) {
  SimClock unused;
  const TimeNs compute = EmulatedCompute(profile, factor, unused).iteration_compute();
  if (!policy.communicates() || (cluster.schedule && !cluster.schedule->is_constant()))
    return compute;
  const Bytes bytes = cluster.wire_payload(profile.total_bytes()) - cluster.link_burst;
  const std::int64_t bps = cluster.worker_rate(0).bits_per_second;
  if (bytes <= 0 || bps <= 0) return compute;
  const auto push = static_cast<TimeNs>(static_cast<__int128>(bytes) * 8 * kNsPerSec / bps);
  return std::max(compute, push);
}

// Iteration k of the cluster ends when its slowest worker's does (with an oracle or
// unequal compute speeds, workers differ).
TimeNs cluster_iteration(const std::vector<std::unique_ptr<TrainingLoop>>& loops, std::size_t k) {
  TimeNs t = 0;
  for (const auto& l : loops) t = std::max(t, l->records()[k].time);
  return t;
}

// SimOptions::stop_when_steady: the cluster's iterations k - 1 and k took the same time.
// Precondition: every loop has ended iteration k (>= 1).
bool steady_now(const std::vector<std::unique_ptr<TrainingLoop>>& loops, std::size_t k) {
  return cluster_iteration(loops, k) == cluster_iteration(loops, k - 1);
}

}  // namespace

Result<std::vector<SimResult>> simulate_ps_jobs(const std::vector<PsJobInput>& inputs,
                                                const ClusterConfig& cluster,
                                                const SimOptions& opts,
                                                const SharingOptions& sharing) {
  const bool shared = inputs.size() > 1;
  struct JobRun {
    std::unique_ptr<TensorLayout> layout;
    std::unique_ptr<Placement> placement;
    std::vector<std::unique_ptr<PsPolicy>> policies;
    std::vector<std::unique_ptr<Compute>> gpus;
    std::vector<std::unique_ptr<TrainingLoop>> loops;
    int workers_done = 0;  // workers that completed opts.iterations (shared runs)
    SimResult result;
  };
  auto factor_of = [&](int w) {
    return cluster.compute_factor.empty() ? 1.0
                                          : cluster.compute_factor[static_cast<std::size_t>(w)];
  };
  std::vector<JobRun> runs(inputs.size());
  std::vector<NetJob> net_jobs;
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    const PsJobInput& in = inputs[j];
    JobRun& run = runs[j];
    run.layout = std::make_unique<TensorLayout>(*in.profile);
    run.placement = std::make_unique<Placement>(*run.layout, cluster.servers,
                                                in.options->split_threshold, cluster.server_shares);
    for (int w = 0; w < cluster.workers; ++w) {
      const PsContext ctx{in.profile,      run.layout.get(), run.placement.get(),
                          cluster.workers, cluster.servers,  cluster.worker_rate(w),
                          cluster.latency, factor_of(w)};
      auto p = make_ps_policy(in.policy, *in.options, ctx);
      if (!p) return shared ? p.status().with_context("job " + std::to_string(j)) : p.status();
      run.policies.push_back(std::move(*p));
    }
    run.result.policy = in.policy;
    net_jobs.push_back(NetJob{run.layout.get(), run.placement.get(),
                              run.policies[0]->server_discipline(), run.policies[0]->wants_acks(),
                              run.policies[0]->packet_level() || run.policies[0]->stop_and_wait(),
                              slacks(*in.profile, *run.layout)});
  }
  SimClock clock;
  PsNetwork net(clock, cluster, std::move(net_jobs), sharing.sharing);
  std::vector<std::unique_ptr<LaneTimer>>
      timers;  // per job and worker: its GPU's and its loop's callbacks
  std::vector<std::unique_ptr<LaneTimer>> gpu_timers;  // per worker host: its shared GPU's
  std::vector<std::unique_ptr<SharedGpu>> host_gpus;
  if (shared && sharing.share_gpus) {
    for (int w = 0; w < cluster.workers; ++w) {
      host_gpus.push_back(std::make_unique<SharedGpu>(
          *gpu_timers.emplace_back(std::make_unique<LaneTimer>(clock))));
    }
  }
  // SimOptions::stop_at_least: when the statistic is known to reach it (kTimeNever: not
  // yet), and the least an iteration of worker 0 takes (least_iteration).
  TimeNs stop_at = kTimeNever;
  const TimeNs least =
      opts.stop_at_least > 0 && !shared
          ? least_iteration(*inputs[0].profile, *runs[0].policies[0], cluster, factor_of(0))
          : 0;
  // SimOptions::stop_when_steady: the workers that ended iteration warmup + 1 (the run
  // stops once all have and that iteration repeated the one before: steady_now()).
  const auto steady_index = static_cast<std::int64_t>(opts.warmup) + 1;
  const bool watch_steady = opts.stop_when_steady && !shared && steady_index + 1 < opts.iterations;
  int steady_ended = 0;
  bool steady = false;        // it did stop there
  bool any_failed = false;    // some loop failed: look for the first error (not O(N) per event)
  std::size_t jobs_done = 0;  // shared runs: jobs whose every worker completed opts.iterations
  // A shared run keeps every job training until all have completed opts.iterations (a job
  // that finished early would stop competing for the links), then stops.
  const int loop_iterations =
      shared ? std::min(1'000'000, opts.iterations * 100 + 100) : opts.iterations;
  for (std::size_t j = 0; j < runs.size(); ++j) {
    JobRun& run = runs[j];
    const Profile& profile = *inputs[j].profile;
    for (int w = 0; w < cluster.workers; ++w) {
      const double factor = factor_of(w);
      PsPolicy& policy = *run.policies[static_cast<std::size_t>(w)];
      PsNetwork::Port& port = net.add_port(static_cast<int>(j), policy.discipline());
      const int pid = static_cast<int>(j) * cluster.workers + w;
      if (opts.record_trace) port.record(&run.result.trace);
      LaneTimer& timer = *timers.emplace_back(std::make_unique<LaneTimer>(clock));
      SpanRecorder rec =
          opts.record_trace ? SpanRecorder(&run.result.trace, pid, 0, true) : SpanRecorder();
      if (shared && sharing.share_gpus) {
        run.gpus.push_back(std::make_unique<SharedGpuCompute>(
            profile, factor, timer, *host_gpus[static_cast<std::size_t>(w)], rec));
      } else {
        run.gpus.push_back(std::make_unique<EmulatedCompute>(profile, factor, timer, rec));
      }
      LoopOptions lo;
      lo.iterations = loop_iterations;
      lo.verify_bytes = opts.verify_bytes;
      lo.failed = [&any_failed](const Status&) { any_failed = true; };
      if (shared) {
        lo.iteration_ended = [&run, &jobs_done, &opts, &cluster](std::int64_t it) {
          if (it + 1 == opts.iterations && ++run.workers_done == cluster.workers) ++jobs_done;
        };
      } else if ((w == 0 && opts.stop_at_least > 0) || watch_steady) {
        const bool bound = w == 0 && opts.stop_at_least > 0;
        lo.iteration_ended = [&run, &stop_at, &clock, &opts, least, bound, watch_steady,
                              steady_index, &steady_ended](std::int64_t it) {
          if (watch_steady && it == steady_index) ++steady_ended;
          // Worker 0's next iteration begins as this one ends (now).
          if (bound) {
            stop_at = known_at_least_from(run.loops[0]->durations(), clock.now(), least, opts);
          }
        };
      }
      run.loops.push_back(std::make_unique<TrainingLoop>(profile, *run.layout, policy, timer,
                                                         *run.gpus.back(), port, std::move(lo)));
      port.set_listener(run.loops.back().get());
    }
  }
  auto first_error = [&]() -> Status {
    if (!net.error().is_ok()) return net.error();
    for (std::size_t j = 0; j < runs.size(); ++j) {
      for (std::size_t w = 0; w < runs[j].loops.size(); ++w) {
        if (!runs[j].loops[w]->error().is_ok()) {
          const std::string where =
              (shared ? "job " + std::to_string(j) + " " : "") + "worker " + std::to_string(w);
          return runs[j].loops[w]->error().with_context(where);
        }
      }
    }
    return Status::ok();
  };
  for (auto& run : runs) {
    for (auto& l : run.loops) l->start();
  }
  if (!shared && opts.stop_at_least > 0) {
    stop_at = known_at_least_from({}, runs[0].loops[0]->first_backward_at(), least, opts);
  }
  while (!clock.empty() && !(shared && jobs_done == runs.size())) {
    const auto e = clock.pop();
    if (e.time >= stop_at) {
      // Worker 0's iteration is still going (its end would be an event at or after this
      // one: events are never scheduled in the past), so it takes at least stop_at minus
      // its start (and its compute), and the run's statistic reaches the bound.
      SimResult r;
      r.policy = runs[0].result.policy;
      r.at_least = true;
      r.iteration_time = opts.stop_at_least;
      r.iteration_times = runs[0].loops[0]->durations();
      r.events = clock.fired() + net.silent_events();
      r.queue_events = clock.fired();
      return std::vector<SimResult>{std::move(r)};
    }
    if (e.time >= kSimHorizon) return horizon_error();
    if (!clock.run_callback(e)) net.dispatch(e.payload);
    if (steady_ended == cluster.workers) {
      steady_ended = 0;  // checked once
      if ((steady = steady_now(runs[0].loops, static_cast<std::size_t>(steady_index)))) break;
    }
    if (!any_failed && net.error().is_ok()) continue;
    if (Status s = first_error(); !s.is_ok()) return s;
  }
  if (Status s = first_error(); !s.is_ok()) return s;
  // The iterations the result has: all, or up to warmup + 1 (SimResult::steady).
  const int ended = steady ? static_cast<int>(steady_index) + 1 : opts.iterations;
  std::vector<SimResult> results;
  for (std::size_t j = 0; j < runs.size(); ++j) {
    JobRun& run = runs[j];
    for (std::size_t w = 0; w < run.loops.size(); ++w) {
      if (run.loops[w]->iterations_done() < ended) {
        return internal_error(
            "simulation stalled: " + (shared ? "job " + std::to_string(j) + " " : std::string()) +
            "worker " + std::to_string(w) + " finished " +
            std::to_string(run.loops[w]->iterations_done()) + " of " +
            std::to_string(opts.iterations) + " iterations (a policy never pushed some gradient?)");
      }
    }
    SimResult& result = run.result;
    const auto& r0 = run.loops[0]->records();
    std::vector<double> utilisation;
    for (std::size_t k = 0; k < static_cast<std::size_t>(ended); ++k) {
      result.iteration_times.push_back(cluster_iteration(run.loops, k));
      utilisation.push_back(r0[k].utilisation);
    }
    result.steady = steady;
    const IterationRecord& last = r0[static_cast<std::size_t>(ended) - 1];
    result.link_utilisation = steady_median(utilisation, opts.warmup);
    result.bytes_pushed_per_iteration = last.traffic.bytes;
    result.messages_per_iteration = last.traffic.messages;
    result.events = clock.fired() + net.silent_events();
    result.queue_events = clock.fired();
    result.notes = run.policies[0]->report();
    finish_result(*inputs[j].profile, cluster, opts, &result);
    results.push_back(std::move(result));
  }
  return results;
}

Result<SimResult> simulate_ps(const Profile& profile, const std::string& policy_name,
                              const PolicyOptions& popts, const ClusterConfig& cluster,
                              const SimOptions& opts) {
  QS_ASSIGN_OR_RETURN(auto results, simulate_ps_jobs({PsJobInput{&profile, policy_name, &popts}},
                                                     cluster, opts, SharingOptions{}));
  return std::move(results.front());
}

}  // namespace qs
