// `quicksilver advise`'s library (quicksilver/sim/advisor.h): every policy of the
// architecture ranked with its knobs tuned; never slower than the defaults; the same job
// gives the same advice; its shortcuts (the proxy search, the short runs) keep
// `simulate`'s predictions; DeFT only when stale updates are allowed; the sweep names the
// pick.
#include "quicksilver/sim/advisor.h"

#include <gtest/gtest.h>

#include <set>

#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/sim/simulator.h"

namespace qs {
namespace {

Job job(const std::string& model, Architecture arch, int workers, Rate bandwidth) {
  Job j;
  j.profile = *load_model(model);
  j.cluster.architecture = arch;
  j.cluster.workers = workers;
  j.cluster.servers = workers;
  j.cluster.bandwidth = bandwidth;
  j.sim.iterations = 3;
  return j;
}

// The best policy other than oracle at the job's default knobs, as `simulate --policy all`
// finds it.
TimeNs best_default(const Job& j, bool allow_stale) {
  TimeNs best = kTimeNever;
  for (const std::string& name : policy_registry().names(j.cluster.architecture)) {
    const PolicySpec* spec = policy_registry().find(name, j.cluster.architecture);
    if (!spec->communicates || (spec->delays_updates && !allow_stale)) continue;
    auto r = simulate(j.profile, name, j.policy_options, j.cluster, j.sim);
    if (r) best = std::min(best, r->iteration_time);
  }
  return best;
}

void expect_sound(const Job& j, const Advice& a, bool allow_stale) {
  ASSERT_FALSE(a.ranking.empty());
  std::set<std::string> seen;
  for (std::size_t i = 0; i < a.ranking.size(); ++i) {
    const AdvisedPolicy& p = a.ranking[i];
    EXPECT_TRUE(seen.insert(p.policy).second) << p.policy;
    EXPECT_NE(p.policy, "oracle");
    EXPECT_LE(p.iteration_time, p.default_time) << p.policy;
    EXPECT_GE(p.iteration_time, a.bound) << p.policy;
    if (i > 0) {
      EXPECT_LE(a.ranking[i - 1].iteration_time, p.iteration_time);
    }
    // The prediction is the simulator's for the tuned knobs.
    auto again = simulate(j.profile, p.policy, p.options, j.cluster, j.sim);
    ASSERT_TRUE(again.is_ok()) << p.policy;
    EXPECT_EQ(again->iteration_time, p.iteration_time) << p.policy;
  }
  EXPECT_LE(a.ranking.front().iteration_time, best_default(j, allow_stale));
}

TEST(Advise, RanksEveryPsPolicyNeverSlowerThanItsDefaults) {
  const Job j = job("resnet18", Architecture::kPs, 4, Rate::gbps(10));
  AdviseOptions o;
  auto a = advise(j, o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  expect_sound(j, *a, false);
  std::set<std::string> ranked;
  for (const AdvisedPolicy& p : a->ranking) ranked.insert(p.policy);
  for (const std::string& name : policy_registry().names(Architecture::kPs)) {
    if (name != "oracle") {
      EXPECT_TRUE(ranked.count(name)) << name;
    }
  }
  // bytescheduler's partition and credit are tuned (the knobs it cuts by).
  for (const AdvisedPolicy& p : a->ranking) {
    if (p.policy != "bytescheduler") continue;
    std::set<std::string> names;
    for (const auto& [name, value] : p.knobs) names.insert(name);
    EXPECT_TRUE(names.count("partition_size"));
    EXPECT_TRUE(names.count("credit_size"));
  }
  ASSERT_FALSE(a->sensitivity.empty());
  EXPECT_EQ(a->sensitivity.front().rfind(a->ranking.front().policy + " stays best", 0), 0u)
      << a->sensitivity.front();
}

// Whatever the threads: with more threads than policies, a search simulates its scans'
// and finishing steps' points together (IdleThreads); its path stays the sequential one.
// The 8-worker job is searched on a 4-worker proxy and finished on itself.
TEST(Advise, TheSameJobGivesTheSameAdvice) {
  for (const int workers : {2, 8}) {
    const Job j = job("resnet18", Architecture::kPs, workers, Rate::gbps(workers == 2 ? 2 : 10));
    std::vector<Advice> advice;
    for (const int threads : {1, 2, 16}) {
      AdviseOptions o;
      o.threads = threads;
      o.sensitivity = workers == 2;
      auto a = advise(j, o);
      ASSERT_TRUE(a.is_ok()) << a.status().to_string();
      advice.push_back(std::move(*a));
    }
    for (std::size_t t = 1; t < advice.size(); ++t) {
      const Advice &a = advice[0], &b = advice[t];
      ASSERT_EQ(a.ranking.size(), b.ranking.size());
      for (std::size_t i = 0; i < a.ranking.size(); ++i) {
        EXPECT_EQ(a.ranking[i].policy, b.ranking[i].policy) << workers << " workers";
        EXPECT_EQ(a.ranking[i].iteration_time, b.ranking[i].iteration_time) << a.ranking[i].policy;
        EXPECT_EQ(a.ranking[i].knobs, b.ranking[i].knobs) << a.ranking[i].policy;
      }
      EXPECT_EQ(a.sensitivity, b.sensitivity);
    }
  }
}

// A job of the default 5 iterations and 8 workers: the search runs on the 4-worker proxy,
// and the job's own points are simulated for the warm-up and two iterations first (the
// whole run only when those two differ). Every entry's prediction must still be what
// `simulate` prints for the job's whole run, and the first never slower than the best
// default.
TEST(Advise, ProxySearchAndShortRunsKeepSimulatesPredictions) {
  Job j = job("resnet18", Architecture::kPs, 8, Rate::gbps(10));
  j.sim.iterations = 5;
  AdviseOptions o;
  o.sensitivity = false;
  auto a = advise(j, o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  expect_sound(j, *a, false);
  bool tuned = false;  // the search found knobs that beat a default somewhere
  for (const AdvisedPolicy& p : a->ranking) tuned |= p.iteration_time < p.default_time;
  EXPECT_TRUE(tuned);
}

// Stopping the runs that can no longer win (AdviseOptions::stop_losers) is exact: the same
// ranking, knobs, predictions and sweep as simulating every run whole, on jobs where it does
// stop runs (PS on itself and on the search's proxy, all-reduce; sweeps on and off).
TEST(Advise, StoppingTheLosersChangesNothing) {
  struct Case {
    std::string model;
    Architecture arch;
    int workers;
    Rate rate;
    bool sweep;
  };
  for (const Case& c : {Case{"resnet18", Architecture::kPs, 2, Rate::gbps(2), true},
                        Case{"resnet18", Architecture::kPs, 8, Rate::gbps(10), false},
                        Case{"vgg16", Architecture::kPs, 4, Rate::gbps(1), true},
                        Case{"resnet50", Architecture::kAllReduce, 4, Rate::gbps(10), true}}) {
    const Job j = job(c.model, c.arch, c.workers, c.rate);
    const std::string where = c.model + " on " + std::to_string(c.workers);
    std::vector<Advice> advice;
    for (const bool stop : {true, false}) {
      AdviseOptions o;
      o.sensitivity = c.sweep;
      o.stop_losers = stop;
      auto a = advise(j, o);
      ASSERT_TRUE(a.is_ok()) << where << ": " << a.status().to_string();
      advice.push_back(std::move(*a));
    }
    const Advice &a = advice[0], &b = advice[1];
    EXPECT_GT(a.stopped, 0) << where;
    EXPECT_EQ(b.stopped, 0) << where;
    // (The counts of simulations may differ: a finishing step simulates its second
    // direction ahead only when a thread is idle.)
    ASSERT_EQ(a.ranking.size(), b.ranking.size()) << where;
    for (std::size_t i = 0; i < a.ranking.size(); ++i) {
      const AdvisedPolicy &x = a.ranking[i], &y = b.ranking[i];
      EXPECT_EQ(x.policy, y.policy) << where;
      EXPECT_EQ(x.iteration_time, y.iteration_time) << where << ": " << x.policy;
      EXPECT_EQ(x.default_time, y.default_time) << where << ": " << x.policy;
      EXPECT_EQ(x.knobs, y.knobs) << where << ": " << x.policy;
    }
    ASSERT_EQ(a.sweep.size(), b.sweep.size()) << where;
    for (std::size_t i = 0; i < a.sweep.size(); ++i) {
      EXPECT_EQ(a.sweep[i].value, b.sweep[i].value) << where;
      EXPECT_EQ(a.sweep[i].best, b.sweep[i].best) << where << " at " << a.sweep[i].value;
      EXPECT_EQ(a.sweep[i].iteration_time, b.sweep[i].iteration_time) << where;
    }
    EXPECT_EQ(a.sensitivity, b.sensitivity) << where;
  }
}

TEST(Advise, DelayedUpdatesOnlyWhenAllowed) {
  const Job j = job("resnet18", Architecture::kAllReduce, 4, Rate::gbps(10));
  AdviseOptions o;
  o.sensitivity = false;
  auto strict = advise(j, o);
  ASSERT_TRUE(strict.is_ok()) << strict.status().to_string();
  expect_sound(j, *strict, false);
  for (const AdvisedPolicy& p : strict->ranking) EXPECT_NE(p.policy, "deft");
  bool noted = false;
  for (const std::string& n : strict->notes) noted |= n.rfind("deft: left out", 0) == 0;
  EXPECT_TRUE(noted);
  o.allow_stale = true;
  auto stale = advise(j, o);
  ASSERT_TRUE(stale.is_ok());
  bool deft = false;
  for (const AdvisedPolicy& p : stale->ranking) deft |= p.policy == "deft";
  EXPECT_TRUE(deft);
  expect_sound(j, *stale, true);
}

}  // namespace
}  // namespace qs
