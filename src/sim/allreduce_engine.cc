// The all-reduce simulation engine (DESIGN.md "Network model", MG-WFBP section II-D).
//
// Workers are symmetric in a collective, so one representative compute chain stands for
// all of them: the slowest worker's (ClusterConfig::compute_factor), since every collective
// waits for its last participant. The chain is backward L..1, then for each layer l in
// 1..L: wait for the policy's forward gate, update, forward. An iteration runs from the
// end of the previous one (the start of bp^L unless a kPolicy gate holds it) to the end of
// the next fp^L.
//
// Links: one (or two, ClusterConfig::second_link_slowdown) links, each running one
// collective at a time (MG-WFBP's model) from its queue (FIFO, or lowest priority first).
// A collective of M bytes takes T_ar(M) = a + b*M (eq. 9, Table II). Under a time-varying
// bandwidth (ClusterConfig::schedule) the startup a and the reduction part (gamma) are
// fixed and the transfer part moves Table II's beta-coefficient * M bytes at the
// schedule's rates.
#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <queue>
#include <sstream>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/sim/event_queue.h"

namespace qs {


namespace {

// The coefficients of MG-WFBP Table II: a = a_alpha * alpha, b = b_beta * beta + b_gamma *
// gamma. log2 N is rounded up for N not a power of two (the number of rounds).
struct TableII {
  double a_alpha = 0, b_beta = 0, b_gamma = 0;
};

TableII table_ii(AllReduceAlgorithm algo, int n) {
  const double N = n;
  const double lg = n > 1 ? std::ceil(std::log2(N) - 1e-12) : 0.0;
  switch (algo) {
    case AllReduceAlgorithm::kTree: return {2 * lg, 2 * lg, lg};
    case AllReduceAlgorithm::kRecursiveDoubling: return {lg, lg, lg};
    case AllReduceAlgorithm::kRecursiveHalvingDoubling:
      return {n > 1 ? 2 * lg : 0.0, n > 1 ? 2 - 2 / N : 0.0, n > 1 ? 1 - 1 / N : 0.0};
    case AllReduceAlgorithm::kRing: break;
  }
  return {2 * (N - 1), 2 * (N - 1) / N, (N - 1) / N};
}

// How a link charges a collective: fixed time a + gamma part, then `wire` bytes per byte
// at the schedule's rates. For a constant schedule this equals cost.time(M) exactly.
struct LinkModel {
  AllReduceCost cost;
  TimeNs a = 0;
  double fixed_ns_per_byte = 0;
  double wire_per_byte = 0;
  std::optional<BandwidthSchedule> schedule;  // none: constant, use cost.time()

  TimeNs finish(TimeNs start, Bytes m) const {
    if (!schedule) return start + cost.time(m);
    const TimeNs t0 = start + a + static_cast<TimeNs>(fixed_ns_per_byte * static_cast<double>(m) + 0.5);
    const Bytes wire = static_cast<Bytes>(wire_per_byte * static_cast<double>(m) + 0.5);
    return wire > 0 ? schedule->finish_time(t0, wire) : t0;
  }
};

LinkModel link_model(const ClusterConfig& c, double slowdown) {
  LinkModel m;
  const AllReduceCost base = allreduce_cost(c);
  m.cost = AllReduceCost{static_cast<TimeNs>(static_cast<double>(base.a) * slowdown + 0.5),
                         base.b_ns_per_byte * slowdown};
  if (!c.schedule || c.schedule->is_constant()) return m;
  const TableII t = table_ii(c.allreduce, c.workers);
  const double bps = c.schedule->rate_at(0).bytes_per_second();
  m.a = m.cost.a;
  if (c.allreduce_b_ns_per_byte) {
    m.wire_per_byte = *c.allreduce_b_ns_per_byte * bps / 1e9;  // all of b scales with the rate
  } else {
    m.wire_per_byte = t.b_beta;
    m.fixed_ns_per_byte = c.reduction_rate ? t.b_gamma * 1e9 / c.reduction_rate->bytes_per_second() : 0.0;
  }
  m.fixed_ns_per_byte *= slowdown;
  m.schedule = slowdown == 1.0 ? *c.schedule : c.schedule->scaled(1.0 / slowdown);
  return m;
}

enum class Ev : std::uint8_t { kComputeDone, kEnqueue, kCollectiveDone };

struct Payload {
  Ev type;
  int link = 0;
  std::size_t bucket = 0;  // index into the engine's bucket store
};

class AllReduceEngine {
 public:
  AllReduceEngine(const Profile& profile, const ClusterConfig& cluster, const SimOptions& opts)
      : profile_(profile), cluster_(cluster), opts_(opts), layout_(profile) {
    for (double f : cluster.compute_factor) factor_ = std::max(factor_, f);
  }

  Result<SimResult> run(const std::string& name, const PolicyOptions& popts) {
    if (!(cluster_.second_link_slowdown == 0 || cluster_.second_link_slowdown >= 1.0)) {
      return invalid_argument("the second link's slowdown must be 0 (none) or >= 1");
    }
    links_.emplace_back().model = link_model(cluster_, 1.0);
    if (cluster_.second_link_slowdown >= 1.0) {
      links_.emplace_back().model = link_model(cluster_, cluster_.second_link_slowdown);
    }
    AllReduceContext ctx;
    ctx.profile = &profile_;
    ctx.layout = &layout_;
    ctx.workers = cluster_.workers;
    for (const Link& l : links_) ctx.links.push_back(l.model.cost);
    ctx.compute_factor = factor_;
    auto p = make_allreduce_policy(name, popts, ctx);
    if (!p) return p.status();
    policy_ = std::move(*p);
    sink_.engine = this;
    result_.policy = name;
    const int n = layout_.num_layers();
    layer_reduced_.assign(static_cast<std::size_t>(n), 0);
    reduced_per_iteration_.assign(static_cast<std::size_t>(opts_.iterations), 0);
    if (opts_.verify_bytes) covered_.resize(static_cast<std::size_t>(opts_.iterations));
    if (opts_.record_trace) {
      rec_compute_ = SpanRecorder(&result_.trace, 0, 0, false);
      for (std::size_t i = 0; i < links_.size(); ++i) {
        links_[i].rec = SpanRecorder(&result_.trace, 0, static_cast<int>(i) + 1, false);
      }
    }
    begin_iteration(0);
    while (!q_.empty()) {
      auto e = q_.pop();
      if (e.time >= kSimHorizon) return horizon_error().with_context(name);
      dispatch(e.payload);
      if (!error_.is_ok()) return error_.with_context(name);
    }
    if (iteration_ < opts_.iterations) {
      return internal_error(name + ": simulation stalled in iteration " + std::to_string(iteration_) +
                            " of " + std::to_string(opts_.iterations) +
                            " (the policy never reduced some gradient, or its gate never opened)");
    }
    if (policy_->communicates()) {
      for (int it = 0; it < opts_.iterations; ++it) {
        if (reduced_per_iteration_[static_cast<std::size_t>(it)] != layout_.total_bytes()) {
          return internal_error(name + ": iteration " + std::to_string(it) + " reduced " +
                                std::to_string(reduced_per_iteration_[static_cast<std::size_t>(it)]) +
                                " of " + std::to_string(layout_.total_bytes()) + " gradient bytes");
        }
        if (opts_.verify_bytes) {
          Status s = check_exact_cover(std::move(covered_[static_cast<std::size_t>(it)]), layout_)
                         .with_context("all-reduce, iteration " + std::to_string(it));
          if (!s.is_ok()) return s.with_context(name);
        }
      }
    }
    result_.iteration_times = iteration_times_;
    result_.link_utilisation = steady_median(utilisation_, opts_.warmup);
    result_.bytes_pushed_per_iteration = bytes_last_;
    result_.messages_per_iteration = messages_last_;
    result_.events = q_.fired();
    result_.notes = policy_->report();
    finish_result(profile_, cluster_, opts_, &result_);
    return std::move(result_);
  }

 private:
  struct Sink final : CollectiveSink {
    AllReduceEngine* engine = nullptr;
    void all_reduce(const CollectiveBucket& bucket, TimeNs delay) override;
  };

  struct Queued {
    int priority;
    std::uint64_t seq;
    std::size_t bucket;
    // Min-heap by (priority, seq): seq is unique, a strict ordering without ties.
    bool operator<(const Queued& o) const {
      return priority != o.priority ? priority > o.priority : seq > o.seq;
    }
  };
  struct Link {
    LinkModel model;
    bool busy = false;
    std::priority_queue<Queued> queue;
    SpanRecorder rec;
  };

  TimeNs scaled(TimeNs t) const {
    return factor_ == 1.0 ? t : static_cast<TimeNs>(static_cast<double>(t) * factor_ + 0.5);
  }
  void fail(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
  }
  const LayerSpec& spec(int l) const { return profile_.layers[static_cast<std::size_t>(l)]; }

  // ---- compute chain ----
  void begin_iteration(std::int64_t it) {
    iteration_ = it;
    iteration_start_ = q_.now();
    waiting_backward_ = true;
    try_backward();
  }

  void try_backward() {
    if (!waiting_backward_) return;
    if (policy_->forward_gate() == ForwardGate::kPolicy && !policy_->backward_ready()) return;
    waiting_backward_ = false;
    std::fill(layer_reduced_.begin(), layer_reduced_.end(), 0);
    reduced_now_ = 0;
    backward_ = true;
    policy_->on_iteration_start(iteration_, q_.now(), sink_);
    run_backward(layout_.num_layers() - 1);
  }

  void run_backward(int l) {
    layer_ = l;
    const TimeNs d = scaled(spec(l).backward);
    rec_compute_.add(q_.now(), q_.now() + d, "bp " + spec(l).name);
    q_.schedule(q_.now() + d, Payload{Ev::kComputeDone});
  }

  bool gate_open(int l) const {
    if (!policy_->communicates()) return true;
    switch (policy_->forward_gate()) {
      case ForwardGate::kAfterAll: return reduced_now_ == layout_.total_bytes();
      case ForwardGate::kPerLayer: return layer_reduced_[static_cast<std::size_t>(l)] == layout_.layer_bytes(l);
      case ForwardGate::kPolicy: return policy_->forward_ready(l);
    }
    return true;
  }

  void try_forward(int l) {
    layer_ = l;
    backward_ = false;
    if (!gate_open(l)) {
      blocked_ = true;
      return;
    }
    blocked_ = false;
    const TimeNs now = q_.now();
    policy_->on_forward_start(l, now, sink_);
    const TimeNs d = scaled(spec(l).update + spec(l).forward);
    rec_compute_.add(now, now + d, "fp " + spec(l).name);
    q_.schedule(now + d, Payload{Ev::kComputeDone});
  }

  void on_compute_done() {
    const int l = layer_;
    if (backward_) {
      if (policy_->communicates()) policy_->on_gradient_ready(l, q_.now(), sink_);
      if (l > 0) {
        run_backward(l - 1);
      } else {
        try_forward(0);
      }
      return;
    }
    if (l + 1 < layout_.num_layers()) {
      try_forward(l + 1);
      return;
    }
    end_iteration();
  }

  void end_iteration() {
    const TimeNs now = q_.now();
    iteration_times_.push_back(now - iteration_start_);
    utilisation_.push_back(span_last_ > span_first_ && span_first_ >= 0
                               ? static_cast<double>(busy_) / static_cast<double>(span_last_ - span_first_)
                               : 0.0);
    span_first_ = -1;
    span_last_ = busy_ = 0;
    bytes_last_ = bytes_now_;
    messages_last_ = messages_now_;
    bytes_now_ = messages_now_ = 0;
    if (iteration_ + 1 < opts_.iterations) {
      begin_iteration(iteration_ + 1);
    } else {
      iteration_ = opts_.iterations;
      if (policy_->communicates()) policy_->on_training_end(now, sink_);
    }
  }

  // ---- links ----
  void enqueue(std::size_t b) {
    const CollectiveBucket& cb = buckets_[b];
    Link& link = links_[static_cast<std::size_t>(cb.link)];
    const int prio = policy_->discipline() == LinkDiscipline::kPriority ? cb.priority : 0;
    link.queue.push(Queued{prio, seq_++, b});
    try_start(cb.link);
  }

  void try_start(int li) {
    Link& link = links_[static_cast<std::size_t>(li)];
    if (link.busy || link.queue.empty()) return;
    const std::size_t b = link.queue.top().bucket;
    link.queue.pop();
    link.busy = true;
    const TimeNs now = q_.now();
    const Bytes m = buckets_[b].bytes();
    const TimeNs end = link.model.finish(now, m);
    if (li == 0) {
      if (span_first_ < 0) span_first_ = now;
      span_last_ = std::max(span_last_, end);
      busy_ += end - now;
    }
    bytes_now_ += m;
    ++messages_now_;
    if (opts_.record_trace) {
      const CollectiveBucket& cb = buckets_[b];
      link.rec.add(now, end, "ar #" + std::to_string(cb.id) + " it " + std::to_string(cb.first_iteration) +
                                 (cb.last_iteration != cb.first_iteration ? "-" + std::to_string(cb.last_iteration) : "") +
                                 " " + format_size(m));
    }
    q_.schedule(end, Payload{Ev::kCollectiveDone, li, b});
  }

  void on_collective_done(int li, std::size_t b) {
    links_[static_cast<std::size_t>(li)].busy = false;
    const CollectiveBucket& cb = buckets_[b];
    for (const Chunk& c : cb.chunks) {
      for (std::int64_t it = cb.first_iteration; it <= cb.last_iteration; ++it) {
        reduced_per_iteration_[static_cast<std::size_t>(it)] += c.length;
        if (opts_.verify_bytes) covered_[static_cast<std::size_t>(it)].push_back(c);
      }
      if (cb.first_iteration <= iteration_ && iteration_ <= cb.last_iteration) {
        layer_reduced_[static_cast<std::size_t>(layout_.tensor(c.tensor).layer)] += c.length;
        reduced_now_ += c.length;
      }
    }
    policy_->on_collective_done(cb, q_.now(), sink_);
    try_start(li);
    if (iteration_ < opts_.iterations) {
      if (blocked_ && !backward_ && gate_open(layer_)) try_forward(layer_);
      try_backward();
    }
  }

  void dispatch(const Payload& p) {
    switch (p.type) {
      case Ev::kComputeDone: on_compute_done(); break;
      case Ev::kEnqueue: enqueue(p.bucket); break;
      case Ev::kCollectiveDone: on_collective_done(p.link, p.bucket); break;
    }
  }

  Status check_bucket(const CollectiveBucket& b) const {
    if (b.chunks.empty()) return internal_error("policy issued an empty collective");
    if (b.link < 0 || b.link >= static_cast<int>(links_.size())) {
      return internal_error("policy used link " + std::to_string(b.link) + " of " + std::to_string(links_.size()));
    }
    if (b.first_iteration < 0 || b.first_iteration > b.last_iteration ||
        b.last_iteration >= opts_.iterations || b.last_iteration > iteration_) {
      return internal_error("policy issued a collective for iterations " + std::to_string(b.first_iteration) +
                            ".." + std::to_string(b.last_iteration) + " in iteration " + std::to_string(iteration_));
    }
    for (const Chunk& c : b.chunks) {
      if (c.tensor < 0 || c.tensor >= layout_.num_tensors() || c.offset < 0 || c.length <= 0 ||
          c.end() > layout_.tensor(c.tensor).bytes) {
        return internal_error("policy issued a chunk outside its tensor (tensor " + std::to_string(c.tensor) + ")");
      }
    }
    return Status::ok();
  }

  const Profile& profile_;
  const ClusterConfig& cluster_;
  const SimOptions& opts_;
  TensorLayout layout_;
  double factor_ = 1.0;
  std::unique_ptr<AllReducePolicy> policy_;
  Sink sink_;
  EventQueue<Payload> q_;
  std::vector<Link> links_;
  std::vector<CollectiveBucket> buckets_;
  std::uint64_t seq_ = 0;
  // Chain state.
  std::int64_t iteration_ = 0;
  TimeNs iteration_start_ = 0;
  bool backward_ = true, blocked_ = false, waiting_backward_ = false;
  int layer_ = 0;
  std::vector<Bytes> layer_reduced_;  // this iteration's reduced bytes per layer
  Bytes reduced_now_ = 0;
  // Accounting.
  std::vector<Bytes> reduced_per_iteration_;
  std::vector<std::vector<Chunk>> covered_;
  std::vector<TimeNs> iteration_times_;
  std::vector<double> utilisation_;
  TimeNs span_first_ = -1, span_last_ = 0, busy_ = 0;
  Bytes bytes_now_ = 0, bytes_last_ = 0;
  std::int64_t messages_now_ = 0, messages_last_ = 0;
  SpanRecorder rec_compute_;
  SimResult result_;
  Status error_;

  friend struct Sink;
};

void AllReduceEngine::Sink::all_reduce(const CollectiveBucket& bucket, TimeNs delay) {
  AllReduceEngine& e = *engine;
  Status s = e.check_bucket(bucket);
  if (!s.is_ok()) {
    e.fail(s);
    return;
  }
  e.buckets_.push_back(bucket);
  const std::size_t idx = e.buckets_.size() - 1;
  if (delay <= 0) {
    e.enqueue(idx);
  } else {
    e.q_.schedule(e.q_.now() + delay, Payload{Ev::kEnqueue, 0, idx});
  }
}

}  // namespace

AllReduceCost allreduce_cost(const ClusterConfig& c) {
  const TableII t = table_ii(c.allreduce, c.workers);
  const double alpha = static_cast<double>(c.latency);
  const double beta = 8e9 / static_cast<double>(c.link_schedule().rate_at(0).bits_per_second);
  const double gamma = c.reduction_rate ? 1e9 / c.reduction_rate->bytes_per_second() : 0.0;
  AllReduceCost cost;
  cost.a = c.allreduce_a ? *c.allreduce_a : static_cast<TimeNs>(t.a_alpha * alpha + 0.5);
  cost.b_ns_per_byte = c.allreduce_b_ns_per_byte ? *c.allreduce_b_ns_per_byte : t.b_beta * beta + t.b_gamma * gamma;
  return cost;
}

Result<AllReduceCost> fit_allreduce_cost(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open");
  std::vector<std::pair<double, double>> pts;  // (bytes, ns)
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ss(line);
    std::string size_s, time_s, extra;
    if (!(ss >> size_s)) continue;
    if (!(ss >> time_s) || (ss >> extra)) {
      return invalid_argument(path + ":" + std::to_string(lineno) + ": expected 'SIZE TIME'");
    }
    auto size = parse_size(size_s);
    if (!size) return size.status().with_context(path + ":" + std::to_string(lineno));
    auto t = parse_time(time_s);
    if (!t) return t.status().with_context(path + ":" + std::to_string(lineno));
    pts.emplace_back(static_cast<double>(*size), static_cast<double>(*t));
  }
  if (pts.size() < 2) return invalid_argument(path + ": need at least two (size, time) pairs");
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : pts) sx += x, sy += y, sxx += x * x, sxy += x * y;
  const double n = static_cast<double>(pts.size());
  const double den = n * sxx - sx * sx;
  if (!(std::abs(den) > 0)) return invalid_argument(path + ": the sizes must not all be equal");
  const double b = (n * sxy - sx * sy) / den;
  const double a = (sy - b * sx) / n;
  if (b < 0) return invalid_argument(path + ": the fitted b is negative (time falls with size)");
  return AllReduceCost{static_cast<TimeNs>(std::max(0.0, a) + 0.5), b};
}

Result<SimResult> simulate_allreduce(const Profile& profile, const std::string& policy,
                                     const PolicyOptions& policy_options,
                                     const ClusterConfig& cluster, const SimOptions& options) {
  AllReduceEngine engine(profile, cluster, options);
  return engine.run(policy, policy_options);
}

}  // namespace qs
