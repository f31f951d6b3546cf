// The all-reduce engine and the simpler all-reduce policies: byte accounting, gates, DDP's
// buckets, compute factors, time-varying bandwidth, traces, errors; properties over
// seeded random profiles.
#include <gtest/gtest.h>

#include "policy/allreduce_plans.h"
#include "quicksilver/core/rng.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::allreduce_cluster;
using testing::layer;

SimOptions opts(int iterations = 3) {
  SimOptions o;
  o.iterations = iterations;
  o.verify_bytes = true;
  return o;
}

TEST(AllReduceEngine, RejectsParameterServerOnlyPolicies) {
  Profile p = testing::mercury_fig2();
  auto r = simulate(p, "mercury", PolicyOptions{}, allreduce_cluster(4), opts());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("parameter-server"), std::string::npos);
  EXPECT_EQ(allreduce_policy_names().size(), 9u);
}

TEST(AllReduceEngine, DdpBucketsFollowPyTorch) {
  // Five 10 MiB tensors, one per layer, and a 100 KiB one on top (ready first).
  Profile p;
  p.name = "ddp";
  for (int l = 0; l < 5; ++l)
    p.layers.push_back(layer("l" + std::to_string(l), 1000, 2000, 10 * kMiB));
  p.layers.push_back(layer("top", 1000, 2000, 100 * kKiB));
  // Reverse order: [top, l4] closes the 1 MiB first bucket (reaches it with l4);
  // [l3, l2, l1] reaches 25 MiB with l1 (30 MiB: a parameter is never split); [l0].
  auto r = simulate(p, "ddp", PolicyOptions{}, allreduce_cluster(4), opts());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->messages_per_iteration, 3);
  EXPECT_EQ(r->bytes_pushed_per_iteration, p.total_bytes());
}

TEST(AllReduceEngine, ByteSchedulerFusesWhatWaitsForTheLibrary) {
  // Five 100 KB layers, 100 us of backward each; at 1 Gbps with 4 workers one collective
  // of 100 KB takes 300 us + 1.2 ms. The top layer's partition goes alone on the idle
  // library; the other four are handed over while it runs and Horovod's next cycle fuses
  // them into one collective (issue 13: ByteScheduler on Horovod keeps Tensor Fusion).
  Profile p;
  p.name = "five";
  for (int l = 0; l < 5; ++l)
    p.layers.push_back(layer("l" + std::to_string(l), 100'000, 100'000, 100'000));
  auto fused = simulate(p, "bytescheduler", PolicyOptions{}, allreduce_cluster(4), opts());
  ASSERT_TRUE(fused.is_ok()) << fused.status().to_string();
  EXPECT_EQ(fused->messages_per_iteration, 2);
  EXPECT_EQ(fused->bytes_pushed_per_iteration, p.total_bytes());
  // The threshold bounds a fused collective: 250 KB holds two of the four.
  PolicyOptions o;
  o.fusion_size = 250'000;
  auto bounded = simulate(p, "bytescheduler", o, allreduce_cluster(4), opts());
  ASSERT_TRUE(bounded.is_ok());
  EXPECT_EQ(bounded->messages_per_iteration, 3);
  // Without fusion (the model before issue 13) every partition is its own collective,
  // and the four extra startups make the iteration longer.
  o.fusion_size = 1;
  auto alone = simulate(p, "bytescheduler", o, allreduce_cluster(4), opts());
  ASSERT_TRUE(alone.is_ok());
  EXPECT_EQ(alone->messages_per_iteration, 5);
  EXPECT_LT(fused->iteration_time, alone->iteration_time);
}

TEST(AllReduceEngine, ByteSchedulerCutsUniformPartitions) {
  // ByteScheduler cuts a tensor above the partition into ceil(size / partition) nearly
  // equal pieces: 10,000 elements at a 4,000-element partition are 3334 + 3333 + 3333.
  Profile p;
  p.name = "one";
  p.layers.push_back(layer("l0", 100'000, 100'000, 40'000));
  PolicyOptions o;
  o.partition_size = 16'000;
  o.credit_size = 16'000;  // stop-and-wait
  o.fusion_size = 1;
  SimOptions so = opts(1);
  so.record_trace = true;
  auto r = simulate(p, "bytescheduler", o, allreduce_cluster(2), so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->messages_per_iteration, 3);
  std::vector<TimeNs> lengths;
  for (const TraceSpan& s : r->trace) {
    if (s.track == 1) lengths.push_back(s.end - s.start);
  }
  ASSERT_EQ(lengths.size(), 3u);
  // T_ar = a + b*M: pieces of 13,336 and 13,332 bytes differ by 4 bytes' worth.
  EXPECT_GT(lengths[0], lengths[1]);
  EXPECT_EQ(lengths[1], lengths[2]);
}

TEST(AllReduceEngine, ByteSchedulerOnResNet101NeedsFewCollectives) {
  // DeFT Fig. 14's setting: 16 A100s, 40 Gbps, alpha 20 us, 6,500,000-parameter partitions.
  // Before issue 13 every one of ResNet-101's 314 tensors was its own collective.
  const Profile p = *load_model("resnet101", "a100");
  ClusterConfig c = allreduce_cluster(16, Rate::gbps(40), 20 * kNsPerUs);
  PolicyOptions o;
  o.partition_size = 26'000'000;
  auto r = simulate(p, "bytescheduler", o, c, opts(6));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LT(r->messages_per_iteration, 40);
  o.fusion_size = 1;
  auto alone = simulate(p, "bytescheduler", o, c, opts(6));
  ASSERT_TRUE(alone.is_ok());
  EXPECT_GE(alone->messages_per_iteration, 314);
  EXPECT_LT(r->iteration_time, alone->iteration_time);
}

TEST(AllReduceEngine, SlowestWorkerGatesEveryCollective) {
  Profile p = testing::mercury_fig2();
  ClusterConfig c = allreduce_cluster(4);
  auto base = simulate(p, "oracle", PolicyOptions{}, c, opts());
  c.compute_factor = {1.0, 2.0, 1.0, 1.0};
  auto slow = simulate(p, "oracle", PolicyOptions{}, c, opts());
  ASSERT_TRUE(base.is_ok() && slow.is_ok());
  EXPECT_EQ(slow->iteration_time, 2 * base->iteration_time);
}

TEST(AllReduceEngine, TimeVaryingBandwidth) {
  Profile p = testing::mercury_fig2();
  ClusterConfig c = allreduce_cluster(4, Rate::gbps(1), 0);
  auto plain = simulate(p, "wfbp", PolicyOptions{}, c, opts());
  // A schedule with the same constant rate changes nothing.
  c.schedule = BandwidthSchedule({{0, Rate::gbps(1)}, {kNsPerSec, Rate::gbps(1)}});
  auto same = simulate(p, "wfbp", PolicyOptions{}, c, opts());
  // Half the rate from t = 0 on: the transfer part doubles.
  c.schedule = BandwidthSchedule({{0, Rate::gbps(1)}, {1, Rate::mbps(500)}});
  auto half = simulate(p, "synceasgd", PolicyOptions{}, c, opts());
  c.schedule.reset();
  c.bandwidth = Rate::mbps(500);
  auto half_const = simulate(p, "synceasgd", PolicyOptions{}, c, opts());
  ASSERT_TRUE(plain.is_ok() && same.is_ok() && half.is_ok() && half_const.is_ok());
  EXPECT_EQ(plain->iteration_times, same->iteration_times);
  EXPECT_NEAR(static_cast<double>(half->iteration_time),
              static_cast<double>(half_const->iteration_time), 4.0);
}

TEST(AllReduceEngine, TraceHasComputeAndLinkTracks) {
  Profile p = testing::mercury_fig2();
  SimOptions o = opts(2);
  o.record_trace = true;
  auto r = simulate(p, "wfbp", PolicyOptions{}, allreduce_cluster(4), o);
  ASSERT_TRUE(r.is_ok());
  bool compute = false, link = false;
  for (const TraceSpan& s : r->trace) compute |= s.track == 0, link |= s.track == 1;
  EXPECT_TRUE(compute && link);
}

TEST(AllReduceEngine, SecondLinkMustBeSlower) {
  Profile p = testing::mercury_fig2();
  ClusterConfig c = allreduce_cluster(4);
  c.second_link_slowdown = 0.5;
  EXPECT_FALSE(simulate(p, "wfbp", PolicyOptions{}, c, opts()).is_ok());
}

// Properties over seeded random profiles: every policy reduces every byte of every
// iteration exactly once (verify_bytes), and in the engine mgwfbp-opt is never slower
// than wfbp, synceasgd or mgwfbp; the static policies' iteration equals the model's
// prediction max(backward end, last all-reduce end) + forward.
TEST(AllReduceProperty, EveryByteOnceAndOptimumNeverLoses) {
  Rng rng(4);
  PolicyOptions po;
  po.partition_size = 300'000;
  po.credit_size = 900'000;
  po.ddp_bucket_size = 500'000;
  po.ddp_first_bucket_size = 100'000;
  po.deft_partition_size = 400'000;
  for (int trial = 0; trial < 150; ++trial) {
    Profile p = testing::random_profile(rng, 10, 200'000, 2 * kNsPerMs);
    ClusterConfig c =
        allreduce_cluster(static_cast<int>(rng.uniform_int(2, 16)),
                          Rate::gbps(rng.uniform(0.5, 10)), rng.uniform_int(0, 100'000));
    if (trial % 3 == 0) c.second_link_slowdown = 1.65;
    std::map<std::string, TimeNs> t;
    for (const std::string& name : allreduce_policy_names()) {
      auto r = simulate(p, name, po, c, opts(4));
      ASSERT_TRUE(r.is_ok()) << name << " trial " << trial << ": " << r.status().to_string();
      t[name] = r->iteration_time;
    }
    // The model: every layer of a random profile is learnable, so MG-WFBP's merge problem
    // is the profile's backward times and bytes (paper order: entry i is layer i), and a
    // static policy's iteration is its merge set's end of the last all-reduce (never
    // before the backward end) plus the forward pass.
    MergeProblem mp;
    mp.cost = allreduce_cost(c);
    TimeNs backward = 0, forward = 0;
    for (const LayerSpec& l : p.layers) {
      mp.tb.push_back(l.backward);
      mp.bytes.push_back(l.bytes());
      backward += l.backward;
      forward += l.update + l.forward;
    }
    auto model = [&](const MergeSet& m) {
      return std::max(backward, merge_finish_time(mp, m)) + forward;
    };
    MergeSet all(p.layers.size(), true);
    all[0] = false;
    EXPECT_EQ(t["wfbp"], model(MergeSet(p.layers.size(), false))) << trial;
    EXPECT_EQ(t["synceasgd"], model(all)) << trial;
    EXPECT_EQ(t["mgwfbp"], model(mgwfbp_algorithm1(mp))) << trial;
    EXPECT_EQ(t["mgwfbp-opt"], model(optimal_merge(mp))) << trial;
    EXPECT_LE(t["mgwfbp-opt"], t["wfbp"]) << trial;
    EXPECT_LE(t["mgwfbp-opt"], t["synceasgd"]) << trial;
    EXPECT_LE(t["mgwfbp-opt"], t["mgwfbp"]) << trial;
    EXPECT_GE(t["wfbp"], t["oracle"]);
  }
}

}  // namespace
}  // namespace qs
