// `run --policy auto`'s decision (quicksilver/sim/auto_planner.h): the effective rate
// round-trips through the simulator; a job running a slow policy on a known network leaves
// it (a switch, or a trial of the near-ties); a switch that costs more than it gains over
// the horizon is not made; the same measurements give the same decision.
#include "quicksilver/sim/auto_planner.h"

#include <gtest/gtest.h>

#include "quicksilver/model/zoo.h"
#include "quicksilver/sim/simulator.h"

namespace qs {
namespace {

Job job(Rate bandwidth) {
  Job j;
  j.profile = *load_model("resnet18");
  j.cluster.architecture = Architecture::kPs;
  j.cluster.workers = 4;
  j.cluster.servers = 4;
  j.cluster.bandwidth = bandwidth;
  j.sim.iterations = 3;
  return j;
}

TimeNs predict(const Job& j, const std::string& policy) {
  auto r = simulate(j.profile, policy, j.policy_options, j.cluster, j.sim);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r ? r->iteration_time : 0;
}

TEST(AutoPlanner, EffectiveRateRoundTrips) {
  const Job j = job(Rate::mbps(2500));
  const TimeNs measured = predict(j, "mercury");
  auto rate = effective_rate(
      [&](Rate r) -> Result<TimeNs> {
        Job k = j;
        k.cluster.bandwidth = r;
        return predict(k, "mercury");
      },
      measured);
  ASSERT_TRUE(rate.is_ok()) << rate.status().to_string();
  EXPECT_NEAR(rate->gbps_value(), 2.5, 0.025);
}

TEST(AutoPlanner, LeavesASlowPolicyAndDecidesAlike) {
  const Job j = job(Rate::gbps(1));
  const TimeNs measured = predict(j, "wfbp");
  auto d = decide_auto(j, "wfbp", j.policy_options, measured, kNsPerMs, 200, false, {});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_NEAR(d->network.gbps_value(), 1.0, 0.02);
  EXPECT_TRUE(d->change || !d->trial.empty()) << d->reason;
  EXPECT_LT(d->ranking.front().iteration_time, measured);
  if (d->change) EXPECT_NE(d->next.policy, "wfbp");
  for (const AdvisedPolicy& a : d->trial) EXPECT_NE(a.policy, "wfbp");
  auto again = decide_auto(j, "wfbp", j.policy_options, measured, kNsPerMs, 200, false, {});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->reason, d->reason);
  EXPECT_EQ(again->network, d->network);
}

TEST(AutoPlanner, ASwitchCostingMoreThanItGainsIsNotMade) {
  const Job j = job(Rate::gbps(1));
  const TimeNs measured = predict(j, "wfbp");
  // A switch costing an hour: no trial is affordable, and no gain over 10 iterations pays.
  auto d = decide_auto(j, "wfbp", j.policy_options, measured, 3600 * kNsPerSec, 10, false, {});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_FALSE(d->change) << d->reason;
  EXPECT_TRUE(d->trial.empty());
  EXPECT_EQ(d->next.policy, "wfbp");
  EXPECT_NE(d->reason.find("than a switch costs"), std::string::npos) << d->reason;
}

TEST(AutoPlanner, RefusesNoMeasurement) {
  const Job j = job(Rate::gbps(1));
  EXPECT_FALSE(decide_auto(j, "mercury", j.policy_options, 0, 0, 200, false, {}).is_ok());
}

}  // namespace
}  // namespace qs
