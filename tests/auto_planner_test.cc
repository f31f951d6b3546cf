// `run --policy auto`'s decision (quicksilver/sim/auto_planner.h): the effective rate
// round-trips through the simulator; a job running a slow policy on a known network leaves
// it (a switch, or a trial of the near-ties); a switch that costs more than it gains over
// the horizon is not made; the same measurements give the same decision; a near-tie is
// measured once at about its rate, or while the trial's pick measures as it did, and the
// pick is taken back when a prediction left it, or kept when the prediction names a
// candidate the trial measured slower (than its pick, or than the running one measures now
// while that measures no faster than then).
#include "quicksilver/sim/auto_planner.h"

#include <gtest/gtest.h>

#include <algorithm>

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
  if (d->change) {
    EXPECT_NE(d->next.policy, "wfbp");
  }
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

// A near-tie (ResNet-18 on 4 workers at 10 Gbit/s: the packet and partition policies within
// 5 %) is measured in a trial; measured at about the same rate it is not measured again,
// and the trial's pick is kept whatever the simulator's order; at a rate far from the
// trial's it is measured again.
TEST(AutoPlanner, ANearTieIsMeasuredOnceAtAboutItsRate) {
  const Job j = job(Rate::gbps(10));
  const TimeNs measured = predict(j, "mercury");
  auto first = decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, {});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_FALSE(first->trial.empty()) << first->reason;
  EXPECT_GE(first->near.size(), 2u);
  EXPECT_NE(first->reason.find("measuring each"), std::string::npos) << first->reason;
  AutoTrialled trialled{first->near, first->network, "mercury", 0};
  if (std::find(trialled.candidates.begin(), trialled.candidates.end(), "mercury") ==
      trialled.candidates.end()) {
    trialled.candidates.push_back("mercury");
  }
  // Every near candidate measured, mercury (running, the trial's pick) among them: kept.
  auto again =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->trial.empty()) << again->reason;
  EXPECT_FALSE(again->change) << again->reason;
  EXPECT_NE(again->reason.find("measured fastest"), std::string::npos) << again->reason;
  // The same candidates measured at a third of the rate: measured again.
  trialled.network = Rate{first->network.bits_per_second / 3};
  auto far = decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(far.is_ok());
  EXPECT_FALSE(far->trial.empty()) << far->reason;
  // ... unless the trial's pick runs and measures as it did then (the rate's estimate moved,
  // the job did not).
  trialled.pick_measured = measured + measured / 10;
  auto same = decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(same.is_ok());
  EXPECT_TRUE(same->trial.empty()) << same->reason;
  EXPECT_FALSE(same->change) << same->reason;
  trialled.pick_measured = measured / 2;  // it measured twice as fast then: measured again
  auto moved =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(moved.is_ok());
  EXPECT_FALSE(moved->trial.empty()) << moved->reason;
  // ... unless every other candidate measured slower then than mercury measures now (it
  // measures no faster than then: they are slower still).
  for (const std::string& n : trialled.candidates) {
    trialled.measured.push_back(n == "mercury" ? measured / 2 : measured + measured / 10);
  }
  auto slower =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(slower.is_ok());
  EXPECT_TRUE(slower->trial.empty()) << slower->reason;
  EXPECT_FALSE(slower->change) << slower->reason;
  EXPECT_NE(slower->reason.find("measured fastest"), std::string::npos) << slower->reason;
  trialled.measured.back() = measured - measured / 10;  // one measured faster: measured again
  if (trialled.candidates.back() == "mercury") trialled.measured.front() = measured - measured / 10;
  auto one_faster =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(one_faster.is_ok());
  EXPECT_FALSE(one_faster->trial.empty()) << one_faster->reason;
  trialled.measured.clear();
  // A near candidate the trial did not measure, its pick running: only that one is measured
  // (a band of 50 %: three near candidates).
  AutoOptions wide;
  wide.trial_band = 0.5;
  auto three =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, {}, wide);
  ASSERT_TRUE(three.is_ok());
  ASSERT_EQ(three->near.size(), 3u) << three->reason;
  const std::string missing =
      three->near.back() != "mercury" ? three->near.back() : three->near.front();
  AutoTrialled partial{{"mercury"}, three->network, "mercury", measured};
  for (const std::string& n : three->near) {
    if (n != missing && n != "mercury") partial.candidates.push_back(n);
  }
  auto rest =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, partial, wide);
  ASSERT_TRUE(rest.is_ok());
  ASSERT_EQ(rest->trial.size(), 1u) << rest->reason;
  EXPECT_EQ(auto_candidate(rest->trial[0].policy, rest->trial[0].options, Architecture::kPs),
            missing);
  // The same at a third of the trial's rate, mercury measuring as it did then: only the
  // rate's estimate moved, so the candidate near only there is neither measured nor taken.
  partial.network = Rate{three->network.bits_per_second / 3};
  auto moved_estimate =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, partial, wide);
  ASSERT_TRUE(moved_estimate.is_ok());
  EXPECT_TRUE(moved_estimate->trial.empty()) << moved_estimate->reason;
  EXPECT_FALSE(moved_estimate->change) << moved_estimate->reason;
  // ... and with mercury measuring twice as long as then, the job moved: measured in full.
  partial.pick_measured = measured / 2;
  auto moved_job =
      decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, partial, wide);
  ASSERT_TRUE(moved_job.is_ok());
  EXPECT_GE(moved_job->trial.size(), 2u) << moved_job->reason;
  // At the trial's rate, with another candidate its pick (measured faster than mercury runs
  // now): the job goes back to the pick, whatever the prediction says.
  std::string other;
  for (const std::string& n : first->near) {
    if (n != "mercury") other = n;
  }
  ASSERT_FALSE(other.empty());
  trialled.network = first->network;
  trialled.pick = other;
  trialled.pick_measured = measured - measured / 10;
  auto back = decide_auto(j, "mercury", j.policy_options, measured, kNsPerMs, 200, false, trialled);
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(back->change) << back->reason;
  EXPECT_EQ(auto_candidate(back->next.policy, back->next.options, Architecture::kPs), other);
  EXPECT_NE(back->reason.find("switched back"), std::string::npos) << back->reason;
}

// A candidate the last trial measured slower than its pick is not switched to on a
// prediction while the pick runs at about the trial's rate; at a rate far from it, and
// measuring otherwise than then, it is.
// wfbp running at 1 Gbit/s with every candidate a near-tie and no trial affordable (none
// is measured in turn): with no trial behind it, the prediction switches to `best`.
struct PredictionDecides {
  Job j = job(Rate::gbps(1));
  TimeNs measured = predict(j, "wfbp");
  AutoOptions no_trial{.trial_band = 10, .trial_budget = 0};
  AutoDecision plain;
  std::string best;

  PredictionDecides() {
    auto d = decide_auto(j, "wfbp", j.policy_options, measured, kNsPerMs, 200, false, {}, no_trial);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (d) plain = *d;
    EXPECT_TRUE(plain.change) << plain.reason;
    best = auto_candidate(plain.next.policy, plain.next.options, Architecture::kPs);
  }
  AutoDecision after(const AutoTrialled& t) const {
    auto d = decide_auto(j, "wfbp", j.policy_options, measured, kNsPerMs, 200, false, t, no_trial);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    return d ? *d : AutoDecision{};
  }
};

TEST(AutoPlanner, WhatTheTrialMeasuredSlowerIsNotTakenOnAPrediction) {
  const PredictionDecides p;
  ASSERT_TRUE(p.plain.change);
  const TimeNs measured = p.measured;
  const std::string& best = p.best;
  AutoTrialled trialled{{"wfbp", best}, p.plain.network, "wfbp", measured};
  const AutoDecision kept = p.after(trialled);
  EXPECT_FALSE(kept.change) << kept.reason;
  EXPECT_NE(kept.reason.find("measured it slower than wfbp"), std::string::npos) << kept.reason;
  // A trial that did not measure the best: the prediction decides.
  AutoTrialled other{{"wfbp", "tictac"}, p.plain.network, "wfbp", measured};
  if (best != "tictac") {
    const AutoDecision moved = p.after(other);
    EXPECT_TRUE(moved.change) << moved.reason;
    // That trial at a third of this rate, wfbp measuring as it did then: only the rate's
    // estimate moved, and a gain inside the near-tie's band is not taken.
    other.network = Rate{p.plain.network.bits_per_second / 3};
    const AutoDecision estimate = p.after(other);
    EXPECT_FALSE(estimate.change) << estimate.reason;
    EXPECT_NE(estimate.reason.find("only the rate's estimate moved"), std::string::npos)
        << estimate.reason;
  }
  // The trial at a third of this rate, its pick measuring twice as fast then: it no longer
  // holds.
  trialled.network = Rate{p.plain.network.bits_per_second / 3};
  trialled.pick_measured = measured / 2;
  const AutoDecision far = p.after(trialled);
  EXPECT_TRUE(far.change) << far.reason;
}

// When the trial no longer holds (its rate far from today's, its pick measuring otherwise),
// what it measured still counts where conditions are no better than then: a candidate the
// trial measured slower than the running one measures now, while the running one measures
// no faster than it did in the trial, is not taken on a prediction. Measured faster than
// now, or with the running one faster than then, the prediction decides.
TEST(AutoPlanner, WhatATrialMeasuredSlowerThanTheRunningOneNowIsNotTaken) {
  const PredictionDecides p;
  ASSERT_TRUE(p.plain.change);
  const TimeNs measured = p.measured;
  // The trial at a third of this rate; wfbp (its pick) measured half as long then.
  const Rate far{p.plain.network.bits_per_second / 3};
  auto decide = [&](TimeNs wfbp_then, TimeNs best_then) {
    return p.after({{"wfbp", p.best}, far, "wfbp", wfbp_then, {wfbp_then, best_then}});
  };
  const AutoDecision kept = decide(measured / 2, measured + measured / 10);
  EXPECT_FALSE(kept.change) << kept.reason;
  EXPECT_NE(kept.reason.find("slower than wfbp measures now"), std::string::npos) << kept.reason;
  // The candidate measured faster then than wfbp measures now: the prediction decides.
  const AutoDecision faster = decide(measured / 2, measured - measured / 10);
  EXPECT_TRUE(faster.change) << faster.reason;
  // wfbp measures faster now than in the trial (conditions are better): so might the best.
  const AutoDecision better = decide(2 * measured, 3 * measured);
  EXPECT_TRUE(better.change) << better.reason;
}

TEST(AutoPlanner, RefusesNoMeasurement) {
  const Job j = job(Rate::gbps(1));
  EXPECT_FALSE(decide_auto(j, "mercury", j.policy_options, 0, 0, 200, false, {}).is_ok());
}

}  // namespace
}  // namespace qs
