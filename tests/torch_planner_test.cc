// The simulator as policy="auto" calls it (quicksilver/torch/planner.h): the same prediction
// as `simulate` for the same job, the ranking's candidates, and errors that name the input.
#include <gtest/gtest.h>

#include <string>

#include "quicksilver/sim/simulator.h"
#include "quicksilver/torch/planner.h"

namespace qs::pytorch {
namespace {

const char* kPlannerProfile = R"({"name": "m", "layers": [
  {"name": "a", "forward_ms": 1, "backward_ms": 2, "tensors": [{"name": "w", "elements": 400000}]},
  {"name": "b", "forward_ms": 1, "backward_ms": 2, "tensors": [{"name": "w", "elements": 1000000}]},
  {"name": "c", "forward_ms": 2, "backward_ms": 4, "tensors": [{"name": "w", "elements": 3000000}]}]})";

PlanSpec spec(Architecture a, double gbps) {
  PlanSpec s;
  s.profile_json = kPlannerProfile;
  s.architecture = a;
  s.workers = 4;
  s.servers = 4;
  s.bandwidth = Rate::gbps(gbps);
  s.latency = 50 * kNsPerUs;
  return s;
}

TEST(TorchPlanner, PredictionIsTheSimulatorsForTheSameJob) {
  for (Architecture a : {Architecture::kPs, Architecture::kAllReduce}) {
    const PlanSpec s = spec(a, 1.0);
    const std::string policy = a == Architecture::kPs ? "bytescheduler" : "mgwfbp";
    auto job = plan_job(s, policy);
    ASSERT_TRUE(job.is_ok()) << job.status().to_string();
    auto direct = simulate(job->profile, policy, job->policy_options, job->cluster, job->sim);
    ASSERT_TRUE(direct.is_ok());
    auto predicted = predict_iteration(s, policy, {});
    ASSERT_TRUE(predicted.is_ok()) << predicted.status().to_string();
    EXPECT_EQ(*predicted, direct->iteration_time);
  }
  // Knobs as the Python keywords spell them: a different partition, a different time.
  const PlanSpec s = spec(Architecture::kPs, 1.0);
  auto small = predict_iteration(s, "bytescheduler", {{"partition_size", "64KiB"}});
  auto large = predict_iteration(s, "bytescheduler", {{"partition_size", "16MiB"}});
  ASSERT_TRUE(small.is_ok() && large.is_ok());
  EXPECT_NE(*small, *large);
  // The prediction falls as the rate grows (what the effective-rate search relies on).
  auto slow = predict_iteration(spec(Architecture::kPs, 0.5), "mercury", {});
  auto fast = predict_iteration(spec(Architecture::kPs, 5.0), "mercury", {});
  ASSERT_TRUE(slow.is_ok() && fast.is_ok());
  EXPECT_GT(*slow, *fast);
}

TEST(TorchPlanner, RanksTheArchitecturesCommunicatingPoliciesAndDeftOnlyWhenStaleIsAllowed) {
  auto strict = rank_policies(spec(Architecture::kAllReduce, 1.0), false);
  auto stale = rank_policies(spec(Architecture::kAllReduce, 1.0), true);
  ASSERT_TRUE(strict.is_ok() && stale.is_ok());
  auto has = [](const Advice& a, const std::string& p) {
    for (const AdvisedPolicy& r : a.ranking) {
      if (r.policy == p) return true;
    }
    return false;
  };
  EXPECT_FALSE(has(*strict, "deft"));
  EXPECT_TRUE(has(*stale, "deft"));
  EXPECT_FALSE(has(*stale, "oracle"));
  for (std::size_t i = 1; i < strict->ranking.size(); ++i)
    EXPECT_LE(strict->ranking[i - 1].iteration_time, strict->ranking[i].iteration_time);
  auto ps = rank_policies(spec(Architecture::kPs, 1.0), false);
  ASSERT_TRUE(ps.is_ok());
  EXPECT_TRUE(has(*ps, "mercury"));
  EXPECT_FALSE(has(*ps, "mgwfbp"));
}

TEST(TorchPlanner, ErrorsNameTheInput) {
  PlanSpec s = spec(Architecture::kPs, 1.0);
  s.profile_json = "{\"layers\": []";
  auto r = predict_iteration(s, "mercury", {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("measured profile"), std::string::npos)
      << r.status().message();
  s = spec(Architecture::kPs, 1.0);
  s.compression = "int3";
  EXPECT_FALSE(predict_iteration(s, "mercury", {}).is_ok());
  auto knob = predict_iteration(spec(Architecture::kPs, 1.0), "mercury", {{"packet_sise", "4KiB"}});
  ASSERT_FALSE(knob.is_ok());
  EXPECT_NE(knob.status().message().find("unknown knob 'packet_sise'"), std::string::npos);
  auto policy = predict_iteration(spec(Architecture::kPs, 1.0), "mgwfbp", {});
  EXPECT_FALSE(policy.is_ok());
}

}  // namespace
}  // namespace qs::pytorch
