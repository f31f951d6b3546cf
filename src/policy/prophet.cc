// Prophet (Z. Zhang et al., "Prophet: Speeding up Distributed DNN Training with
// Predictable Communication Scheduling", ICPP'21), Algorithm 1 of section 4.1 on the
// model of section 3, as an event-driven PsPolicy.
//
// The paper's indices: gradient i has priority i (0 = the first layer's, needed first by
// the next forward pass); c^(i) is when backward generates it, s^(i) its size,
// E^(i) = s^(i) / B its transfer time (eq. 5), A^(i) = min |c^(i) - c^(j)|, j < i, the
// "expected transfer time interval" before a higher-priority gradient is generated.
// Here gradient i is TensorLayout's tensor i (smaller id = more urgent, as in the
// paper), cut into BytePS partitions (PolicyOptions::prophet_partition_size).
//
// Algorithm 1, as implemented (line numbers cite it):
//   line 1   at every iteration start, E for each partition from the latest bandwidth
//            estimate B (PsContext::bandwidth, then on_bandwidth_estimate(): Prophet's
//            Network Bandwidth Monitor, section 4.2); c^(i) and A^(i) from the profile's
//            backward times (the Training Job Profiler) times this worker's compute factor
//            (PsContext::compute_factor): the profiler measures the GPU the job runs on.
//   line 5-11 backward phase: when a step of the stepwise pattern is generated, assemble
//            ready partitions in priority order (line 10) into one block while the next
//            one still fits: T_used + E^(q) <= A (line 7, Constraint 11), starting at
//            c^(p) (line 8). The block leaves as one hand-over to the communication
//            library. What does not fit waits for a later step or the forward phase.
//   line 17-18 gradient 0 (the last step of backward) is sent as soon as it is generated;
//            t_next <- t^(0) + E^(0).
//   line 12-14 forward phase: every remaining partition, one by one in priority order
//            (Constraint 9), at t^(p) = t_next, t_next += E^(p).
//
// Deliberate differences, each forced by the event-driven PushSink or by the model:
//  * A^(i) ignores gradients generated at the same instant: the literal min over j < i
//    is 0 for every gradient but the first of a step (a layer's weight and bias, or
//    layers fused by the framework, are generated together), which would forbid blocks
//    altogether, against the paper's "{gradient 144 - gradient 156} are generated within
//    a short time" being one block. So A is the time from a step to the next step: for
//    the step closed by layer l, the backward time of layer l-1 (the next layer computed).
//  * Line 7 measures the window from the block's start c^(p) for every q (also for a
//    partition left over from an earlier step, whose own A^(q) has already elapsed).
//  * Steps: layers whose gradients appear at the same time (zero backward time between
//    them) form one step; the block is assembled when the step's last layer is ready,
//    so the most urgent of them goes first.
//  * Planned start times become PushSink delays: a block handed over at c^(p) enters the
//    transport queue after the user-level startup time (PolicyOptions::startup_time:
//    Prophet runs on BytePS's user-level scheduler, Mercury III-A), so T_used starts at
//    the startup time, not 0, and a block must fit A including it. In the forward phase
//    each partition is pushed with delay = t^(p) - now, where t^(p) >= now + startup: the
//    startup of a partition overlaps the previous transfer, as BytePS pipelines tasks.
//    The transport queue is FIFO (the library's), so a late estimate delays but never
//    reorders.
//  * If a block is still (by plan) on the link when the next step or gradient 0 comes,
//    the new block starts when it ends (T_used and t_next start there); the paper's
//    planner assumes the link is free at c^(p), which Constraint 11 makes true when the
//    estimate is right.
//  * Tensors split over several servers by the Placement: partitions are cut inside each
//    server's slice (a unit never straddles servers) and a tensor's partitions are
//    ordered round-robin over its slices (k-th partition of every slice, then the
//    (k+1)-th), so a block spreads over the server links. The cut depends only on the
//    layout and the partition size, so every worker cuts the same units whatever its
//    timing or bandwidth estimate; blocks only decide when units leave.
#include <algorithm>
#include <string>
#include <vector>

#include "knob_table.h"
#include "ps_policies.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/reservoir.h"

namespace qs {
namespace {

class Prophet final : public PsPolicy {
 public:
  Prophet(const PolicyOptions& o, const PsContext& ctx)
      : ctx_(ctx),
        startup_(o.startup_time),
        overrun_(o.prophet_allow_overrun),
        bandwidth_(ctx.bandwidth),
        rate_(ctx.bandwidth) {
    const TensorLayout& layout = *ctx.layout;
    partitions_.resize(static_cast<std::size_t>(layout.num_tensors()));
    for (const TensorInfo& t : layout.tensors()) {
      auto& out = partitions_[static_cast<std::size_t>(t.id)];
      push_interleaved(ctx, t.id, o.prophet_partition_size,
                       [&](const PushUnit& u) { out.push_back(u); });
    }
  }

  std::string_view name() const override { return "prophet"; }
  // The communication library under BytePS (ps-lite / ZeroMQ) sends what it is handed in
  // order; Prophet's own Scheduled Queue decides the order and the time of hand-over.
  QueueDiscipline discipline() const override { return QueueDiscipline::kFifo; }

  void on_iteration_start(std::int64_t, TimeNs now, PushSink&) override {
    // Line 1: re-plan from the latest estimate (the monitor's value when the iteration starts).
    rate_ = bandwidth_;
    QS_CHECK(ready_.empty());
    link_free_ = now;
  }

  void on_bandwidth_estimate(Rate rate, TimeNs) override {
    if (rate.bits_per_second > 0) bandwidth_ = rate;
    if (rate.bits_per_second > 0) estimates_.add(rate.bits_per_second);
  }

  // The monitor's estimates against the rate the job was configured with: in the runtime
  // the estimate is the goodput of this worker's own transfers while its transport held
  // them, so a server's downlink shared with the other workers lowers it, and every block
  // of the next iteration holds less (docs/policies-ps.md, Prophet).
  std::vector<std::string> report() const override {
    if (estimates_.count() == 0) return {};
    const auto mbps = [](std::int64_t b) {
      return std::to_string((b + 500'000) / 1'000'000) + " Mbit/s";
    };
    const std::int64_t median = estimates_.percentile(50);
    const double of =
        static_cast<double>(median) / static_cast<double>(ctx_.bandwidth.bits_per_second);
    return {"bandwidth monitor: " + std::to_string(estimates_.count()) + " estimates, median " +
            mbps(median) + " (" + mbps(estimates_.percentile(0)) + " to " +
            mbps(estimates_.percentile(100)) + "), " +
            std::to_string(static_cast<int>(100 * of + 0.5)) + " % of the rate it started from (" +
            mbps(ctx_.bandwidth.bits_per_second) + ")"};
  }

  void on_gradient_ready(int layer, TimeNs now, PushSink& out) override {
    const TensorLayout& layout = *ctx_.layout;
    for (TensorId t = layout.end_tensor(layer); t-- > layout.first_tensor(layer);) {
      for (auto k = static_cast<int>(partitions_[static_cast<std::size_t>(t)].size()); k-- > 0;)
        make_ready(Key{t, k});
    }
    if (layer == 0) {
      send_forward_phase(now, out);
      return;
    }
    // A step closes when the next layer to compute takes time; a zero-time layer below
    // generates its gradient at this same instant, so wait for it.
    // The window is this worker's time for that backward: the profile's, scaled by its
    // compute factor, as its GPU runs it.
    const TimeNs window = scale_time(
        ctx_.profile->layers[static_cast<std::size_t>(layer - 1)].backward, ctx_.compute_factor);
    if (window == 0) return;
    assemble_block(window, now, out);
  }

 private:
  // A ready partition: (tensor, index in partitions_[tensor]). Ordered by tensor id
  // (priority), then index: a strict total order, every key unique.
  struct Key {
    TensorId tensor;
    int index;
    // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted <=>
    friend auto operator<=>(const Key&, const Key&) = default;
  };

  // Adds `k` to ready_ in its place. The backward pass generates the layers from the last
  // to the first, and a layer's partitions are more urgent than every one ready before
  // them, so they go on at the back, the most urgent end; a key that is not (a layer out
  // of that order) is inserted where it belongs.
  void make_ready(const Key& k) {
    if (ready_.empty() || k < ready_.back()) {
      ready_.push_back(k);
      return;
    }
    ready_.insert(std::upper_bound(ready_.begin(), ready_.end(), k,
                                   [](const Key& a, const Key& b) { return b < a; }),
                  k);
  }

  const PushUnit& unit(const Key& k) const {
    return partitions_[static_cast<std::size_t>(k.tensor)][static_cast<std::size_t>(k.index)];
  }
  // Eq. 5: E = s / B, at the bandwidth of this iteration's plan.
  TimeNs estimate(const Key& k) const { return transfer_time(unit(k).chunk.length, rate_); }

  // Lines 5-11: one block for the step generated at `now`, within the window `a` to the
  // next step.
  void assemble_block(TimeNs a, TimeNs now, PushSink& out) {
    // Line 6 (T_used <- 0), plus the block's startup and any planned transfer still on
    // the link (see the header).
    TimeNs used = std::max(startup_, link_free_ - now);
    // Line 7: q = the most urgent ready partition; it joins the block iff it is
    // transferred completely within the window (Constraint 11), or, with
    // prophet_allow_overrun, iff some of the window is left.
    while (!ready_.empty()) {
      const Key q = ready_.back();
      const TimeNs e = estimate(q);
      if (overrun_ ? used >= a : used + e > a) break;
      // Line 8: t^(q) = c^(p) + T_used; the whole block is handed over now and its
      // partitions go back-to-back from now + startup.
      out.push(unit(q), startup_);
      used += e;          // line 9
      ready_.pop_back();  // line 10: next most urgent ready partition
    }
    link_free_ = std::max(link_free_, now + used);
  }

  // Lines 17-18 then 12-14: gradient 0 was just generated (the end of backward).
  void send_forward_phase(TimeNs now, PushSink& out) {
    // Line 17: t^(0) = c^(0) (plus the startup, or after a planned transfer).
    TimeNs t_next = std::max(now + startup_, link_free_);
    // The most urgent ready partitions are gradient 0's (line 17-18); the rest follow one
    // by one in priority order (lines 13-14). Same arithmetic for both.
    for (auto k = ready_.rbegin(); k != ready_.rend(); ++k) {
      out.push(unit(*k), t_next - now);  // line 13: t^(p) = t_next
      t_next += estimate(*k);            // line 14 (line 18 for gradient 0)
    }
    ready_.clear();
    link_free_ = t_next;
  }

  PsContext ctx_;
  TimeNs startup_;
  bool overrun_;               // line 7 read as "residual positive" (PolicyOptions)
  Rate bandwidth_;             // latest monitor estimate
  Rate rate_;                  // the estimate this iteration's plan uses
  Reservoir estimates_{1024};  // the estimates received (bit/s; bounded sample), for report()
  std::vector<std::vector<PushUnit>> partitions_;  // per tensor, in sending order
  // Generated, not yet handed over: most urgent last (a std::set was 4 % of a large
  // simulation's time in its nodes, docs/benchmarks.md "advise").
  std::vector<Key> ready_;
  TimeNs link_free_ = 0;  // when the planned transfers end
};

}  // namespace

Result<std::unique_ptr<PsPolicy>> make_prophet_policy(const PolicyOptions& options,
                                                      const PsContext& context) {
  if (options.prophet_partition_size <= 0) {
    return invalid_argument("prophet partition size must be positive");
  }
  if (options.startup_time < 0) return invalid_argument("--startup-time must be >= 0");
  if (context.bandwidth.bits_per_second <= 0)
    return invalid_argument("prophet needs a positive bandwidth");
  if (!(context.compute_factor >= 0))
    return invalid_argument("prophet needs a compute factor >= 0");
  return std::unique_ptr<PsPolicy>(new Prophet(options, context));
}

Status register_prophet(PolicyRegistry& r) {
  return r.add(
      {{.name = "prophet_partition_size",
        .flag = "--prophet-partition-size",
        .type = KnobType::kBytes,
        .help = "partition size blocks are assembled from (BytePS's)",
        .scales = true,
        .cuts = true,
        .field = knob_field(&ProphetOptions::prophet_partition_size)},
       {.name = "prophet_allow_overrun",
        .flag = "--prophet-overrun",
        .type = KnobType::kBool,
        .help = "let a block's last partition overrun its window (Alg. 1 line 7's other reading)",
        .field = knob_field(&ProphetOptions::prophet_allow_overrun)}},
      {{.name = "prophet",
        .summary = "blocks of partitions planned from the step pattern",
        .knobs = {"prophet_partition_size", "prophet_allow_overrun", "startup_time",
                  "split_threshold"},
        .rank = 50,
        .make_ps = make_prophet_policy}});
}

}  // namespace qs
