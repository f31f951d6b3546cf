// Prophet (Prophet paper, ICPP'21): the paper's illustrative example (section 2.3,
// Fig. 5) worked out by hand, unit tests of Algorithm 1's block assembly, and end-to-end
// simulations with every byte checked.
#include <gtest/gtest.h>

#include <memory>

#include "quicksilver/core/rng.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;

constexpr TimeNs kMs = kNsPerMs;
constexpr Bytes kPart = 1'000'000;  // one partition; 1 ms at 8 Gbps

struct Pushed {
  Chunk chunk;
  int server;
  int priority;
  TimeNs delay;
};

class RecordingSink final : public PushSink {
 public:
  void push(const PushUnit& u, TimeNs delay) override {
    pushes.push_back(Pushed{u.chunk, u.server, u.priority, delay});
  }
  std::vector<Pushed> take() { return std::exchange(pushes, {}); }
  std::vector<Pushed> pushes;
};

// A profile, its layout and placement, and one worker's prophet policy.
struct Harness {
  Harness(Profile p, PolicyOptions o, int servers = 1, Rate bw = Rate::gbps(8),
          double compute_factor = 1.0)
      : profile(std::move(p)), layout(profile), placement(layout, servers, o.split_threshold) {
    PsContext ctx{&profile, &layout, &placement, 1, servers, bw, 0, compute_factor};
    auto made = make_ps_policy("prophet", o, ctx);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    policy = std::move(*made);
  }
  Profile profile;
  TensorLayout layout;
  Placement placement;
  std::unique_ptr<PsPolicy> policy;
  RecordingSink sink;
};

PolicyOptions options(TimeNs startup) {
  PolicyOptions o;
  o.prophet_partition_size = kPart;
  o.partition_size = kPart;
  o.slice_size = kPart;
  o.credit_size = 3 * kPart;
  o.startup_time = startup;
  return o;
}

// ---- The paper's illustrative example (section 2.3, Fig. 5) ----
//
// Two gradients, as in the figure: gradient 1 is large (four partitions of 1 MB, 1 ms
// each on an 8 Gbps link) and generated first, at c^(1) = 1 ms; gradient 0 is small (one
// partition) and generated at c^(0) = 3.5 ms, so A^(1) = 2.5 ms. Each forward takes
// 1 ms, one worker and one server, no latency, user-level startup 0.3 ms per hand-over.
//
// Prophet (Algorithm 1): at 1 ms, T_used = 0.3 (startup); partition 1 fits (1.3 <= 2.5),
// partition 2 fits (2.3 <= 2.5), partition 3 does not (3.3 > 2.5): "only two partitions
// of gradient 1 can be transmitted before gradient 0 is generated". The block leaves at
// 1.3: push [1.3,2.3] [2.3,3.3], pulls [2.3,3.3] [3.3,4.3]. At 3.5 gradient 0 is sent
// greedily (line 17): push [3.8,4.8], pull [4.8,5.8]; t_next = 4.8. Forward phase (lines
// 13-14): partition 3 at 4.8 [4.8,5.8], partition 4 at 5.8 [5.8,6.8]; pulls [5.8,6.8]
// [6.8,7.8]. fp0 [5.8,6.8], fp1 waits for gradient 1: [7.8,8.8]. Iteration 8.8 ms.
//
// ByteScheduler (credit = 3 partitions, the figure's "3 times partition size"):
// partitions 1-3 enter at 1.3: push [1.3,4.3]; partition 1's ack at 2.3 frees credit,
// partition 4 enters at 2.6 and goes [4.3,5.3]. At 3.5 the credit holds partitions 3, 4
// (2 of 3) so gradient 0 enters at 3.8 behind them: [5.3,6.3], pull [6.3,7.3]; fp0
// [7.3,8.3], fp1 [8.3,9.3]. Iteration 9.3 ms.
//
// P3 (stop-and-wait, 1 MB slices): each slice waits for the previous ack and the startup:
// slice 1 [1.3,2.3], 2 [2.6,3.6], 3 [3.9,4.9]; then gradient 0 (priority) [5.2,6.2],
// pull [6.2,7.2]; slice 4 [6.5,7.5], pull [7.5,8.5]; fp0 [7.2,8.2], fp1 [8.5,9.5].
// Iteration 9.5 ms.
//
// Default MXNet (wfbp, FIFO, whole tensors, no user-level scheduler): gradient 1
// [1,5], gradient 0 queued behind it [5,6]; pulls [5,9] [9,10]; fp0 [10,11] fp1 [11,12].
// Iteration 12 ms.
Profile fig5_profile() {
  Profile p;
  p.name = "prophet-fig5";
  p.batch_size = 1;
  p.layers = {layer("g0", 1 * kMs, 2500 * kNsPerUs, kPart),
              layer("g1", 1 * kMs, 1 * kMs, 4 * kPart)};
  return p;
}

using testing::one_to_one;
using testing::steady_iteration;

TEST(ProphetFig5, PlanSendsTwoPartitionsBeforeGradientZero) {
  Harness h(fig5_profile(), options(300 * kNsPerUs));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
  auto block = h.sink.take();
  ASSERT_EQ(block.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(block[k].chunk, (Chunk{1, k * kPart, kPart}));
    EXPECT_EQ(block[k].delay, 300 * kNsPerUs);  // one hand-over, one startup
    EXPECT_EQ(block[k].priority, 1);
  }
  h.policy->on_gradient_ready(0, 3500 * kNsPerUs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 3u);
  EXPECT_EQ(fwd[0].chunk, (Chunk{0, 0, kPart}));  // line 17: gradient 0 at c^(0) (+ startup)
  EXPECT_EQ(fwd[0].delay, 300 * kNsPerUs);
  EXPECT_EQ(fwd[1].chunk, (Chunk{1, 2 * kPart, kPart}));  // lines 13-14: one by one
  EXPECT_EQ(fwd[1].delay, 1300 * kNsPerUs);
  EXPECT_EQ(fwd[2].chunk, (Chunk{1, 3 * kPart, kPart}));
  EXPECT_EQ(fwd[2].delay, 2300 * kNsPerUs);
}

TEST(ProphetFig5, TimelinesOfTheFourStrategies) {
  const Profile p = fig5_profile();
  const PolicyOptions o = options(300 * kNsPerUs);
  EXPECT_EQ(steady_iteration(p, "prophet", o, one_to_one()), 8800 * kNsPerUs);
  EXPECT_EQ(steady_iteration(p, "bytescheduler", o, one_to_one()), 9300 * kNsPerUs);
  EXPECT_EQ(steady_iteration(p, "p3", o, one_to_one()), 9500 * kNsPerUs);
  EXPECT_EQ(steady_iteration(p, "wfbp", o, one_to_one()), 12 * kMs);
}

// ---- Algorithm 1, backward phase (lines 5-11) ----

// Gradient 1 has three 1 ms partitions; the window A^(1) is layer 0's backward time.
Profile window_profile(TimeNs window) {
  Profile p;
  p.name = "window";
  p.layers = {layer("g0", 1 * kMs, window, kPart), layer("g1", 1 * kMs, 1 * kMs, 3 * kPart)};
  return p;
}

std::size_t block_size(TimeNs window, TimeNs startup) {
  Harness h(window_profile(window), options(startup));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
  return h.sink.take().size();
}

TEST(ProphetBlock, Line7AdmitsAPartitionThatEndsExactlyAtTheNextStep) {
  // T_used + E^(q) <= A^(q) (Constraint 11): equality fits, one nanosecond less does not.
  EXPECT_EQ(block_size(2 * kMs, 0), 2u);
  EXPECT_EQ(block_size(2 * kMs - 1, 0), 1u);
  EXPECT_EQ(block_size(3 * kMs, 0), 3u);
  EXPECT_EQ(block_size(10 * kMs, 0), 3u);
  // The block's startup counts against the window.
  EXPECT_EQ(block_size(2 * kMs, 1), 1u);
  EXPECT_EQ(block_size(2 * kMs + 500 * kNsPerUs, 500 * kNsPerUs), 2u);
}

// The window is the worker's own time for the next backward: the profile's times its
// compute factor (issue 14: Prophet planned with the unscaled profile while the worker's
// GPU ran scaled, so a factor of 0.76 made every window 1/0.76 = 1.32 times too long).
TEST(ProphetBlock, WindowsAreTheWorkersScaledBackwardTimes) {
  auto block_at = [](double factor) {
    Harness h(window_profile(3 * kMs), options(0), 1, Rate::gbps(8), factor);
    h.policy->on_iteration_start(0, 0, h.sink);
    h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
    return h.sink.take().size();
  };
  EXPECT_EQ(block_at(1.0), 3u);   // A = 3 ms: three 1 ms partitions
  EXPECT_EQ(block_at(0.5), 1u);   // A = 1.5 ms
  EXPECT_EQ(block_at(0.76), 2u);  // A = 2.28 ms
  EXPECT_EQ(block_at(2.0), 3u);   // A = 6 ms, and only three partitions
}

TEST(ProphetBlock, NothingFitsSoEverythingWaitsForTheForwardPhase) {
  Harness h(window_profile(999 * kNsPerUs), options(0));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
  EXPECT_TRUE(h.sink.take().empty());
  h.policy->on_gradient_ready(0, 1999 * kNsPerUs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 4u);
  EXPECT_EQ(fwd[0].chunk.tensor, 0);
  for (std::size_t k = 1; k < 4; ++k) EXPECT_EQ(fwd[k].chunk.tensor, 1);
}

TEST(ProphetBlock, LeftoversJoinTheNextBlockAfterMoreUrgentGradients) {
  // c: layer 2 at 1 ms (two partitions), layer 1 at 2.5 ms (one partition), layer 0 at
  // 5 ms. First window 1.5 ms: one partition of tensor 2. Second window 2.5 ms: tensor
  // 1 first (line 10: the most urgent ready), then tensor 2's leftover.
  Profile p;
  p.layers = {layer("g0", kMs, 2500 * kNsPerUs, kPart), layer("g1", kMs, 1500 * kNsPerUs, kPart),
              layer("g2", kMs, kMs, 2 * kPart)};
  Harness h(p, options(0));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(2, 1 * kMs, h.sink);
  auto first = h.sink.take();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].chunk, (Chunk{2, 0, kPart}));
  h.policy->on_gradient_ready(1, 2500 * kNsPerUs, h.sink);
  auto second = h.sink.take();
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].chunk, (Chunk{1, 0, kPart}));
  EXPECT_EQ(second[1].chunk, (Chunk{2, kPart, kPart}));
  h.policy->on_gradient_ready(0, 5 * kMs, h.sink);
  auto last = h.sink.take();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].chunk.tensor, 0);
}

TEST(ProphetBlock, LayersGeneratedTogetherFormOneStepInPriorityOrder) {
  // Layer 1 takes no backward time: layers 2 and 1 are generated at the same instant, so
  // the block waits for layer 1 and puts its (more urgent) gradient first.
  Profile p;
  p.layers = {layer("g0", kMs, 5 * kMs, kPart), layer("g1", kMs, 0, kPart),
              layer("g2", kMs, kMs, kPart)};
  Harness h(p, options(0));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(2, 1 * kMs, h.sink);
  EXPECT_TRUE(h.sink.take().empty());
  h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
  auto block = h.sink.take();
  ASSERT_EQ(block.size(), 2u);
  EXPECT_EQ(block[0].chunk.tensor, 1);
  EXPECT_EQ(block[1].chunk.tensor, 2);
}

// ---- Algorithm 1, gradient 0 and the forward phase (lines 12-18) ----

TEST(ProphetForward, GradientZeroGoesFirstThenOneByOneInPriorityOrder) {
  // Nothing fits the backward windows; at gradient 0 every partition is scheduled at
  // t_next, which advances by each partition's E (1 ms for 1 MB, 0.5 ms for 0.5 MB).
  Profile p;
  p.layers = {layer("g0", kMs, 100 * kNsPerUs, kPart / 2),
              layer("g1", kMs, 100 * kNsPerUs, 2 * kPart), layer("g2", kMs, kMs, kPart)};
  const TimeNs startup = 200 * kNsPerUs;
  Harness h(p, options(startup));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(2, 1 * kMs, h.sink);
  h.policy->on_gradient_ready(1, 1100 * kNsPerUs, h.sink);
  EXPECT_TRUE(h.sink.take().empty());
  h.policy->on_gradient_ready(0, 1200 * kNsPerUs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 4u);
  EXPECT_EQ(fwd[0].chunk, (Chunk{0, 0, kPart / 2}));
  EXPECT_EQ(fwd[0].delay, startup);  // line 17: t^(0) = c^(0)
  EXPECT_EQ(fwd[1].chunk, (Chunk{1, 0, kPart}));
  EXPECT_EQ(fwd[1].delay, startup + 500 * kNsPerUs);  // line 18: t_next = t^(0) + E^(0)
  EXPECT_EQ(fwd[2].chunk, (Chunk{1, kPart, kPart}));
  EXPECT_EQ(fwd[2].delay, startup + 1500 * kNsPerUs);  // line 14
  EXPECT_EQ(fwd[3].chunk, (Chunk{2, 0, kPart}));
  EXPECT_EQ(fwd[3].delay, startup + 2500 * kNsPerUs);
}

TEST(ProphetForward, GradientZeroWaitsForABlockStillOnTheLink) {
  // A block planned to run until 2.5 ms; gradient 0 comes at 2 ms (a window the
  // profile promised longer than the run gave): it starts when the block ends.
  Harness h(window_profile(2 * kMs), options(0));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(1, 500 * kNsPerUs, h.sink);
  ASSERT_EQ(h.sink.take().size(), 2u);  // planned [0.5, 2.5]
  h.policy->on_gradient_ready(0, 2 * kMs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 2u);
  EXPECT_EQ(fwd[0].chunk.tensor, 0);
  EXPECT_EQ(fwd[0].delay, 500 * kNsPerUs);
  EXPECT_EQ(fwd[1].delay, 1500 * kNsPerUs);
}

// ---- The bandwidth monitor ----

TEST(ProphetMonitor, ReplansFromTheLatestEstimateAtTheNextIteration) {
  Harness h(window_profile(2 * kMs), options(0));
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_bandwidth_estimate(Rate::gbps(4), 100);  // mid-iteration: next plan
  h.policy->on_gradient_ready(1, 1 * kMs, h.sink);
  EXPECT_EQ(h.sink.take().size(), 2u);  // 8 Gbps: two 1 ms partitions in 2 ms
  h.policy->on_gradient_ready(0, 3 * kMs, h.sink);
  h.sink.take();
  h.policy->on_iteration_start(1, 10 * kMs, h.sink);
  h.policy->on_gradient_ready(1, 11 * kMs, h.sink);
  EXPECT_EQ(h.sink.take().size(), 1u);  // 4 Gbps: one 2 ms partition
  h.policy->on_gradient_ready(0, 13 * kMs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 3u);
  EXPECT_EQ(fwd[2].delay - fwd[1].delay, 2 * kMs);  // E at the new estimate
}

TEST(ProphetMonitor, ReportsWhatTheMonitorReadAgainstTheStartingRate) {
  Harness h(window_profile(2 * kMs), options(0));
  EXPECT_TRUE(h.policy->report().empty());  // nothing read yet
  h.policy->on_bandwidth_estimate(Rate::gbps(4), 100);
  h.policy->on_bandwidth_estimate(Rate::gbps(6), 200);
  h.policy->on_bandwidth_estimate(Rate::gbps(5), 300);
  h.policy->on_bandwidth_estimate(Rate{0}, 400);  // no estimate: ignored
  const auto lines = h.policy->report();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "bandwidth monitor: 3 estimates, median 5000 Mbit/s (4000 Mbit/s to 6000 Mbit/s), 63 % "
            "of the rate it "
            "started from (8000 Mbit/s)");
}

// ---- Tensors split over servers ----

TEST(ProphetPlacement, PartitionsStayInsideSlicesRoundRobinOverServers) {
  // 4 MB over two servers: slices [0,2M) and [2M,4M), two partitions each.
  Profile p;
  p.layers = {layer("g0", kMs, 10 * kMs, 4 * kPart)};
  Harness h(p, options(0), /*servers=*/2);
  h.policy->on_iteration_start(0, 0, h.sink);
  h.policy->on_gradient_ready(0, 10 * kMs, h.sink);
  auto fwd = h.sink.take();
  ASSERT_EQ(fwd.size(), 4u);
  EXPECT_EQ(fwd[0].chunk, (Chunk{0, 0, kPart}));
  EXPECT_EQ(fwd[0].server, 0);
  EXPECT_EQ(fwd[1].chunk, (Chunk{0, 2 * kPart, kPart}));
  EXPECT_EQ(fwd[1].server, 1);
  EXPECT_EQ(fwd[2].chunk, (Chunk{0, kPart, kPart}));
  EXPECT_EQ(fwd[3].chunk, (Chunk{0, 3 * kPart, kPart}));
}

TEST(ProphetOptions, RejectsZeroPartitionSize) {
  Profile p = fig5_profile();
  TensorLayout layout(p);
  Placement placement(layout, 1);
  PolicyOptions o;
  o.prophet_partition_size = 0;
  PsContext ctx{&p, &layout, &placement, 1, 1, Rate::gbps(10), 0};
  EXPECT_FALSE(make_ps_policy("prophet", o, ctx).is_ok());
}

// ---- End to end ----

TEST(ProphetSim, ResNet50EveryByteOnceOnManyServers) {
  // The paper's regime (section 5: ResNet-50, batch 64, a slow GPU, 1 Gbps): backward
  // steps long enough for blocks. Prophet beats ByteScheduler with its default knobs, as
  // in the paper's Table 2 at low bandwidth.
  auto p = load_model("resnet50", "k80", 64);
  ASSERT_TRUE(p.is_ok());
  ClusterConfig c;
  c.workers = 3;
  c.servers = 3;
  c.bandwidth = Rate::gbps(1);
  SimOptions s;
  s.iterations = 3;
  s.verify_bytes = true;
  auto r = simulate(*p, "prophet", {}, c, s);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->bytes_pushed_per_iteration, p->total_bytes());
  EXPECT_GE(r->iteration_time, r->compute_time);
  auto bs = simulate(*p, "bytescheduler", {}, c, s);
  ASSERT_TRUE(bs.is_ok());
  EXPECT_LT(r->iteration_time, bs->iteration_time);
}

// A compute factor is the same job as a profile whose times are already scaled: the
// worker's GPU and Prophet's plan must both see the scaled times (the Prophet Table 2
// reproduction runs the K80 profile at --compute-factor 0.76).
TEST(ProphetSim, AComputeFactorIsTheSameJobAsAScaledProfile) {
  auto p = load_model("resnet50", "k80", 64);
  ASSERT_TRUE(p.is_ok());
  constexpr double kFactor = 0.76;
  Profile scaled = *p;
  for (LayerSpec& l : scaled.layers) {
    l.backward = scale_time(l.backward, kFactor);
    l.forward =
        scale_time(l.update + l.forward, kFactor);  // the GPU runs update + forward as one step
    l.update = 0;
  }
  for (double gbps : {1.0, 2.0, 5.0}) {
    ClusterConfig c;
    c.workers = 3;
    c.servers = 3;
    c.bandwidth = Rate::gbps(gbps);
    SimOptions s;
    s.iterations = 4;
    s.verify_bytes = true;
    auto plain = simulate(scaled, "prophet", {}, c, s);
    ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
    c.compute_factor.assign(3, kFactor);
    auto factored = simulate(*p, "prophet", {}, c, s);
    ASSERT_TRUE(factored.is_ok()) << factored.status().to_string();
    EXPECT_EQ(factored->iteration_times, plain->iteration_times) << gbps << " Gbps";
  }
}

TEST(ProphetSim, RandomProfilesHeterogeneousWorkersAndVaryingBandwidth) {
  // Workers that compute at different speeds on a bandwidth that changes mid-run still
  // cut identical units (the server would report a mismatch) and push every byte once.
  Rng rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    Profile p = testing::random_profile(rng);
    ClusterConfig c;
    c.workers = static_cast<int>(rng.uniform_int(1, 4));
    c.servers = static_cast<int>(rng.uniform_int(1, 3));
    c.latency = rng.uniform_int(0, 50) * kNsPerUs;
    c.schedule = BandwidthSchedule(
        {{0, Rate::gbps(10)}, {3 * kMs, Rate::gbps(1)}, {9 * kMs, Rate::gbps(4)}});
    for (int w = 0; w < c.workers; ++w) c.compute_factor.push_back(1.0 + 0.5 * w);
    PolicyOptions o;
    o.prophet_partition_size = rng.uniform_int(4, 300'000);
    o.split_threshold = rng.uniform_int(1, 400'000);
    SimOptions s;
    s.iterations = 4;
    s.verify_bytes = true;
    auto r = simulate(p, "prophet", o, c, s);
    ASSERT_TRUE(r.is_ok()) << "trial " << trial << ": " << r.status().to_string();
  }
}

}  // namespace
}  // namespace qs
