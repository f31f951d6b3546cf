// The simulation-driven tuner of bytescheduler's (partition, credit) and p3's slice size.
#include "quicksilver/sim/tuner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "quicksilver/model/zoo.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;

// Three layers, 8 Gbps (1 byte/ns), one worker and one server: every simulation is a
// few dozen events.
Profile tiny() {
  Profile p;
  p.name = "tiny";
  p.batch_size = 1;
  p.layers = {layer("l1", 200'000, 300'000, 200'000), layer("l2", 200'000, 300'000, 800'000),
              layer("l3", 200'000, 300'000, 400'000)};
  return p;
}

ClusterConfig cluster(int n = 1) {
  ClusterConfig c;
  c.workers = n;
  c.servers = n;
  c.bandwidth = Rate::gbps(8);
  return c;
}

SimOptions sim() {
  SimOptions s;
  s.iterations = 2;
  return s;
}

TEST(Tuner, NeverWorseThanTheDefaultsAndCountsSimulations) {
  auto p = load_model("vgg16_cifar10");
  ASSERT_TRUE(p.is_ok());
  TuneOptions t;
  t.grid_points = 6;
  t.credit_doublings = 3;
  t.refine_rounds = 2;
  auto r = tune(*p, {}, cluster(2), sim(), t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LE(r->iteration_time, r->default_time);
  EXPECT_GE(r->simulations, 6 * 4 + 1);
  EXPECT_EQ(r->options.partition_size, r->partition_size);
  EXPECT_EQ(r->options.credit_size, r->credit_size);
  // The reported time is what the simulator gives for the returned options.
  auto again = simulate(*p, "bytescheduler", r->options, cluster(2), sim());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->iteration_time, r->iteration_time);
}

TEST(Tuner, FindsTheBruteForceOptimumOnATinyProfile) {
  // Brute force over a dense lattice: partitions 4 KB..4 MB (64 log steps) and credits
  // partition * 2^(k/4), k = 0..24. The tuner sees far fewer points.
  const Profile p = tiny();
  PolicyOptions base;
  base.startup_time = 20 * kNsPerUs;
  TimeNs brute = kTimeNever;
  for (int i = 0; i <= 64; ++i) {
    const Bytes part =
        std::max<Bytes>(4, std::llround(4000.0 * std::pow(1000.0, i / 64.0) / 4) * 4);
    for (int k = 0; k <= 24; ++k) {
      PolicyOptions o = base;
      o.partition_size = part;
      o.credit_size = static_cast<Bytes>(static_cast<double>(part) * std::pow(2.0, k / 4.0));
      auto r = simulate(p, "bytescheduler", o, cluster(), sim());
      ASSERT_TRUE(r.is_ok());
      brute = std::min(brute, r->iteration_time);
    }
  }
  TuneOptions t;
  t.min_size = 4000;
  t.max_size = 4'000'000;
  auto r = tune(p, base, cluster(), sim(), t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LE(r->iteration_time, brute);
  EXPECT_LT(r->simulations, 65 * 25 / 4);
}

TEST(Tuner, TunesP3SliceSizeOnly) {
  PolicyOptions base;
  base.startup_time = 20 * kNsPerUs;
  TuneOptions t;
  t.policy = "p3";
  t.min_size = 4000;
  t.max_size = 4'000'000;
  auto r = tune(tiny(), base, cluster(), sim(), t);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->credit_size, 0);
  EXPECT_EQ(r->options.slice_size, r->partition_size);
  EXPECT_LE(r->iteration_time, r->default_time);
  // One dimension: the grid plus a few dozen refinement probes.
  EXPECT_LE(r->simulations, 60);
}

TEST(Tuner, DeterministicResult) {
  TuneOptions t;
  t.min_size = 4000;
  t.max_size = 4'000'000;
  auto a = tune(tiny(), {}, cluster(), sim(), t);
  auto b = tune(tiny(), {}, cluster(), sim(), t);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->partition_size, b->partition_size);
  EXPECT_EQ(a->credit_size, b->credit_size);
  EXPECT_EQ(a->iteration_time, b->iteration_time);
}

TEST(Tuner, RejectsBadRequests) {
  TuneOptions t;
  t.policy = "mercury";
  EXPECT_FALSE(tune(tiny(), {}, cluster(), sim(), t).is_ok());
  t.policy = "bytescheduler";
  t.min_size = 1000;
  t.max_size = 10;
  EXPECT_FALSE(tune(tiny(), {}, cluster(), sim(), t).is_ok());
}

}  // namespace
}  // namespace qs
