// Properties of the PS engine and policies over thousands of seeded random profiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

struct Case {
  Profile profile;
  ClusterConfig cluster;
};

Case random_case(Rng& rng, bool theorem_assumptions) {
  Case c;
  c.profile = testing::random_profile(rng, 10, 100'000);
  const int n = static_cast<int>(rng.uniform_int(1, 4));
  c.cluster.workers = n;
  // Theorem 1 assumes no hardware heterogeneity and balanced links: N = M, no latency.
  c.cluster.servers = theorem_assumptions ? n : static_cast<int>(rng.uniform_int(1, 4));
  c.cluster.bandwidth = Rate::mbps(static_cast<double>(rng.uniform_int(500, 40'000)));
  c.cluster.latency = theorem_assumptions ? 0 : rng.uniform_int(0, 50'000);
  return c;
}

// The number of random cases a property runs: `n`, or n / QS_PROPERTY_CASES_DIVISOR when
// that is set (scripts/sanitize.sh: under AddressSanitizer each case costs several times
// as much, and a quarter of the cases still covers every policy and cluster shape).
int cases_to_run(int n) {
  const char* d = std::getenv("QS_PROPERTY_CASES_DIVISOR");
  const int divisor = d != nullptr ? std::atoi(d) : 1;
  return divisor > 1 ? std::max(1, n / divisor) : n;
}

PolicyOptions small_units() {
  PolicyOptions o;
  o.packet_size = 1024;
  o.partition_size = 64 * 1024;
  o.credit_size = 256 * 1024;
  o.slice_size = 32 * 1024;
  o.split_threshold = 128 * 1024;
  return o;
}

// No policy beats the oracle; every gradient byte is pushed and pulled exactly once per
// iteration (SimOptions::verify_bytes checks it inside the engine, per worker).
TEST(PsProperties, NoPolicyBeatsOracleAndEveryByteMovesOnce) {
  Rng rng(2024);
  const PolicyOptions o = small_units();
  for (int i = 0, n = cases_to_run(400); i < n; ++i) {
    Case c = random_case(rng, false);
    SimOptions s;
    s.iterations = 3;
    s.verify_bytes = true;
    for (const std::string& policy : ps_policy_names()) {
      auto r = simulate(c.profile, policy, o, c.cluster, s);
      ASSERT_TRUE(r.is_ok()) << "case " << i << " " << policy << ": " << r.status().to_string();
      ASSERT_GE(r->iteration_time, c.profile.compute_time()) << "case " << i << " " << policy;
      if (policy != "oracle") {
        ASSERT_EQ(r->bytes_pushed_per_iteration, c.profile.total_bytes()) << policy;
      }
    }
  }
}

// Mercury paper Theorem 1: with (nearly) infinitely small packets Mercury gives the
// minimum iteration time. With finite packets it may lose at most one packet's time: the
// time the server's link takes to receive one packet from each of the N workers (the N
// copies of a packet arrive back to back, and the sum leaves after the last). Measured
// over these 1500 cases: never slower at all for N <= 3, at most 1.73 single-packet
// times for N = 4.
TEST(PsProperties, MercuryIsNeverSlowerThanAnyOtherPolicyBeyondPacketGranularity) {
  Rng rng(1);
  const PolicyOptions o = small_units();
  int cases = 0;
  const int n = cases_to_run(1500);
  for (int i = 0; i < n; ++i) {
    Case c = random_case(rng, true);
    SimOptions s;
    s.iterations = 2;
    auto mercury = simulate(c.profile, "mercury", o, c.cluster, s);
    ASSERT_TRUE(mercury.is_ok());
    const TimeNs packet = transfer_time(o.packet_size, c.cluster.bandwidth);
    const TimeNs slack = packet * c.cluster.workers;
    for (const char* policy :
         {"wfbp", "tictac", "p3", "bytescheduler", "prophet", "mercury-nopreempt"}) {
      auto r = simulate(c.profile, policy, o, c.cluster, s);
      ASSERT_TRUE(r.is_ok());
      ASSERT_LE(mercury->iteration_time, r->iteration_time + slack)
          << "case " << i << ": mercury " << mercury->iteration_time << " vs " << policy << " "
          << r->iteration_time << " (N=M=" << c.cluster.workers << ", L=" << c.profile.num_layers()
          << ")";
    }
    ++cases;
  }
  EXPECT_EQ(cases, n);
}

// The seed drives the random bandwidth walk: the same seed repeats a run exactly, and a
// different seed gives a different run.
TEST(PsProperties, IdenticalSeedsGiveIdenticalOutput) {
  Rng rng(5);
  Case c = random_case(rng, false);
  c.profile.layers[0].tensors[0].elements = 2'000'000;  // long enough to see the rate change
  auto run = [&](std::uint64_t seed, const std::string& policy) {
    ClusterConfig cl = c.cluster;
    cl.schedule = *BandwidthSchedule::from_spec("random:200Mbps:20Gbps:100us", seed);
    SimOptions o;
    o.seed = seed;
    auto r = simulate(c.profile, policy, small_units(), cl, o);
    EXPECT_TRUE(r.is_ok());
    return r.is_ok() ? r->iteration_times : std::vector<TimeNs>{};
  };
  for (const char* policy : {"mercury", "p3", "bytescheduler", "tictac", "wfbp", "prophet"}) {
    EXPECT_EQ(run(7, policy), run(7, policy)) << policy;
    EXPECT_NE(run(7, policy), run(8, policy)) << policy;
  }
}

}  // namespace
}  // namespace qs
