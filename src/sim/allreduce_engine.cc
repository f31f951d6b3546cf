// The all-reduce simulation engine (DESIGN.md "Network model", MG-WFBP section II-D): one
// training loop (engine/training_loop.h) over the simulated links as its Exchange.
//
// Workers are symmetric in a collective, so one representative loop stands for all of
// them: the slowest worker's (ClusterConfig::compute_factor), since every collective waits
// for its last participant.
//
// Links: one (or two, ClusterConfig::second_link_slowdown) links, each running one
// collective at a time (MG-WFBP's model) from its queue (FIFO, or lowest priority first).
// A collective of M bytes takes T_ar(M) = a + b*M (eq. 9, Table II). Under a time-varying
// bandwidth (ClusterConfig::schedule) the startup a and the reduction part (gamma) are
// fixed and the transfer part moves Table II's beta-coefficient * M bytes at the
// schedule's rates.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <queue>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/text_table.h"
#include "quicksilver/engine/training_loop.h"
#include "sim_clock.h"

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
    case AllReduceAlgorithm::kTree:
      return {2 * lg, 2 * lg, lg};
    case AllReduceAlgorithm::kRecursiveDoubling:
      return {lg, lg, lg};
    case AllReduceAlgorithm::kRecursiveHalvingDoubling:
      return {n > 1 ? 2 * lg : 0.0, n > 1 ? 2 - 2 / N : 0.0, n > 1 ? 1 - 1 / N : 0.0};
    case AllReduceAlgorithm::kRing:
      break;
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
    const TimeNs t0 =
        start + a + static_cast<TimeNs>(fixed_ns_per_byte * static_cast<double>(m) + 0.5);
    const Bytes wire = static_cast<Bytes>(wire_per_byte * static_cast<double>(m) + 0.5);
    return wire > 0 ? schedule->finish_time(t0, wire) : t0;
  }
};

LinkModel link_model(const ClusterConfig& c, double slowdown) {
  LinkModel m;
  AllReduceCost base = allreduce_cost(c);
  // Compression: the bytes (b) shrink to the wire's share; the rounding and widening of the
  // whole bucket (twice: before and after) and of every partial sum (once per element,
  // the reduction) add their cost per float32 byte.
  const double wire_share = static_cast<double>(c.wire_element_bytes) / 4.0;
  const double convert_per_byte =
      c.wire_element_bytes == 4 ? 0.0 : 3 * c.convert_ns_per_element / 4.0;
  base.b_ns_per_byte = base.b_ns_per_byte * wire_share + convert_per_byte;
  m.cost = AllReduceCost{static_cast<TimeNs>(static_cast<double>(base.a) * slowdown + 0.5),
                         base.b_ns_per_byte * slowdown};
  if (!c.schedule || c.schedule->is_constant()) return m;
  const TableII t = table_ii(c.allreduce, c.workers);
  const double bps = c.schedule->rate_at(0).bytes_per_second();
  m.a = m.cost.a;
  if (c.allreduce_b_ns_per_byte) {
    m.wire_per_byte =
        *c.allreduce_b_ns_per_byte * bps / 1e9 * wire_share;  // all of b scales with the rate
  } else {
    m.wire_per_byte = t.b_beta * wire_share;
    m.fixed_ns_per_byte =
        c.reduction_rate ? t.b_gamma * 1e9 / c.reduction_rate->bytes_per_second() : 0.0;
  }
  m.fixed_ns_per_byte += convert_per_byte;
  m.fixed_ns_per_byte *= slowdown;
  m.schedule = slowdown == 1.0 ? *c.schedule : c.schedule->scaled(1.0 / slowdown);
  return m;
}

// The simulated all-reduce links: the loop's Exchange.
class AllReduceLinks final : public CollectiveExchange {
 public:
  static constexpr std::uint8_t kCollectiveDone = 0;

  AllReduceLinks(SimClock& clock, const ClusterConfig& cluster, LinkDiscipline discipline)
      : clock_(clock), discipline_(discipline) {
    links_.emplace_back().model = link_model(cluster, 1.0);
    if (cluster.second_link_slowdown >= 1.0)
      links_.emplace_back().model = link_model(cluster, cluster.second_link_slowdown);
  }
  std::vector<AllReduceCost> costs() const {
    std::vector<AllReduceCost> c;
    for (const Link& l : links_) c.push_back(l.model.cost);
    return c;
  }
  void set_listener(ExchangeListener* l) { listener_ = l; }
  void record(std::vector<TraceSpan>* trace) {
    record_ = true;
    for (std::size_t i = 0; i < links_.size(); ++i)
      links_[i].rec = SpanRecorder(trace, 0, static_cast<int>(i) + 1, false);
  }
  void set_discipline(LinkDiscipline d) { discipline_ = d; }

  void all_reduce(const CollectiveBucket& b) override {
    buckets_.push_back(b);
    Link& link = links_[static_cast<std::size_t>(b.link)];
    const int prio = discipline_ == LinkDiscipline::kPriority ? b.priority : 0;
    link.queue.push(Queued{prio, seq_++, buckets_.size() - 1});
    try_start(b.link);
  }
  void flush() override {
    for (std::size_t li = 0; li < links_.size(); ++li) try_start(static_cast<int>(li));
  }
  Status check(const CollectiveBucket& b) const override {
    if (b.link < 0 || b.link >= static_cast<int>(links_.size())) {
      return internal_error("policy used link " + std::to_string(b.link) + " of " +
                            std::to_string(links_.size()));
    }
    return Status::ok();
  }
  Traffic take_traffic(TimeNs) override { return meter_.take(); }

  void dispatch(const SimEvent& e) {
    links_[static_cast<std::size_t>(e.index)].busy = false;
    // The deque keeps the bucket in place while the policy issues more.
    listener_->on_collective_done(buckets_[static_cast<std::size_t>(e.ref)]);
  }

 private:
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

  void try_start(int li) {
    Link& link = links_[static_cast<std::size_t>(li)];
    if (link.busy || link.queue.empty()) return;
    const std::size_t b = link.queue.top().bucket;
    link.queue.pop();
    link.busy = true;
    const TimeNs now = clock_.now();
    const CollectiveBucket& cb = buckets_[b];
    const Bytes m = cb.bytes();
    const TimeNs end = link.model.finish(now, m);
    meter_.add(li, now, end, m);
    if (record_) {
      link.rec.add(
          now, end,
          "ar #" + std::to_string(cb.id) + " it " + std::to_string(cb.first_iteration) +
              (cb.last_iteration != cb.first_iteration ? "-" + std::to_string(cb.last_iteration)
                                                       : "") +
              " " + format_size(m));
    }
    QS_CHECK(b <= UINT32_MAX);
    clock_.schedule_event(end, kCollectiveDone, li,
                          static_cast<std::uint32_t>(b));  // the bucket's index
  }

  SimClock& clock_;
  LinkDiscipline discipline_;
  ExchangeListener* listener_ = nullptr;
  std::vector<Link> links_;
  std::deque<CollectiveBucket> buckets_;
  std::uint64_t seq_ = 0;
  bool record_ = false;
  CollectiveMeter meter_;
};

}  // namespace

AllReduceCost allreduce_cost(const ClusterConfig& c) {
  const TableII t = table_ii(c.allreduce, c.workers);
  const double alpha = static_cast<double>(c.latency);
  const double beta = 8e9 / static_cast<double>(c.link_schedule().rate_at(0).bits_per_second);
  const double gamma = c.reduction_rate ? 1e9 / c.reduction_rate->bytes_per_second() : 0.0;
  AllReduceCost cost;
  cost.a = c.allreduce_a ? *c.allreduce_a : static_cast<TimeNs>(t.a_alpha * alpha + 0.5);
  cost.b_ns_per_byte =
      c.allreduce_b_ns_per_byte ? *c.allreduce_b_ns_per_byte : t.b_beta * beta + t.b_gamma * gamma;
  return cost;
}

Result<AllReduceCost> fit_allreduce_cost(const std::string& path) {
  QS_ASSIGN_OR_RETURN(auto text, read_text_file(path, "all-reduce fit"));
  QS_ASSIGN_OR_RETURN(auto lines, parse_two_columns(text, path, "'SIZE TIME'"));
  std::vector<std::pair<double, double>> pts;  // (bytes, ns)
  for (const TwoColumnLine& l : lines) {
    auto size = parse_size(l.first);
    if (!size) return size.status().with_context(l.where);
    auto t = parse_time(l.second);
    if (!t) return t.status().with_context(l.where);
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

Result<SimResult> simulate_allreduce(const Profile& profile, const std::string& name,
                                     const PolicyOptions& popts, const ClusterConfig& cluster,
                                     const SimOptions& opts) {
  if (!(cluster.second_link_slowdown == 0 || cluster.second_link_slowdown >= 1.0)) {
    return invalid_argument("the second link's slowdown must be 0 (none) or >= 1");
  }
  double factor = 1.0;
  for (double f : cluster.compute_factor) factor = std::max(factor, f);
  const TensorLayout layout(profile);
  SimClock clock;
  AllReduceLinks links(clock, cluster, LinkDiscipline::kFifo);
  AllReduceContext ctx;
  ctx.profile = &profile;
  ctx.layout = &layout;
  ctx.workers = cluster.workers;
  ctx.links = links.costs();
  ctx.compute_factor = factor;
  QS_ASSIGN_OR_RETURN(auto policy, make_allreduce_policy(name, popts, ctx));
  links.set_discipline(policy->discipline());
  SimResult result;
  result.policy = name;
  if (opts.record_trace) links.record(&result.trace);
  EmulatedCompute gpu(
      profile, factor, clock,
      opts.record_trace ? SpanRecorder(&result.trace, 0, 0, false) : SpanRecorder());
  LoopOptions lo;
  lo.iterations = opts.iterations;
  lo.verify_bytes = opts.verify_bytes;
  // SimOptions::stop_at_least, as the PS engine (ps_engine.cc): the one loop is worker 0's.
  TimeNs stop_at = kTimeNever;
  const TimeNs least = opts.stop_at_least > 0 ? gpu.iteration_compute() : 0;
  const TrainingLoop* running = nullptr;
  if (opts.stop_at_least > 0) {
    lo.iteration_ended = [&](std::int64_t) {
      stop_at = known_at_least_from(running->durations(), clock.now(), least, opts);
    };
  }
  // SimOptions::stop_when_steady, as the PS engine: the one loop is the cluster.
  const auto steady_index = static_cast<std::size_t>(opts.warmup) + 1;
  bool steady = false;
  if (opts.stop_when_steady && static_cast<int>(steady_index) + 1 < opts.iterations) {
    lo.iteration_ended = [&, bounded = std::move(lo.iteration_ended)](std::int64_t it) {
      if (bounded) bounded(it);
      const auto& r = running->records();
      steady = static_cast<std::size_t>(it) == steady_index &&
               r[steady_index].time == r[steady_index - 1].time;
    };
  }
  TrainingLoop loop(profile, layout, *policy, clock, gpu, links, std::move(lo));
  running = &loop;
  links.set_listener(&loop);
  loop.start();
  if (opts.stop_at_least > 0) {
    stop_at = known_at_least_from({}, loop.first_backward_at(), least, opts);
  }
  while (!clock.empty()) {
    const auto e = clock.pop();
    if (e.time >= stop_at) {
      result.at_least = true;
      result.iteration_time = opts.stop_at_least;
      result.iteration_times = loop.durations();
      result.events = result.queue_events = clock.fired();
      return result;
    }
    if (e.time >= kSimHorizon) return horizon_error().with_context(name);
    if (!clock.run_callback(e)) links.dispatch(e.payload);
    if (!loop.error().is_ok()) return loop.error().with_context(name);
    if (steady) break;
  }
  if (!steady && !loop.finished()) {
    return internal_error(name + ": simulation stalled in iteration " +
                          std::to_string(loop.iterations_done()) + " of " +
                          std::to_string(opts.iterations) +
                          " (the policy never reduced some gradient, or its gate never opened)");
  }
  if (Status s = loop.check_complete(); !s.is_ok()) return s.with_context(name);
  std::vector<double> utilisation;
  for (const IterationRecord& r : loop.records()) {
    result.iteration_times.push_back(r.time);
    utilisation.push_back(r.utilisation);
  }
  result.steady = steady;
  result.link_utilisation = steady_median(utilisation, opts.warmup);
  result.bytes_pushed_per_iteration = loop.records().back().traffic.bytes;
  result.messages_per_iteration = loop.records().back().traffic.messages;
  result.events = result.queue_events = clock.fired();
  result.notes = policy->report();
  finish_result(profile, cluster, opts, &result);
  return result;
}

}  // namespace qs
