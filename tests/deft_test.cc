// DeFT: knapsacks, the loss model, the queue transitions of Fig. 4 worked by hand, the
// Preserver, and the exactly-once property of merged, delayed buckets.
#include "policy/deft.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>

#include "quicksilver/core/rng.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;

TEST(DeftKnapsack, GreedyFollowsThePaperAndCanLose) {
  // One knapsack of 10: the greedy takes the longest first (6) and then nothing fits.
  std::vector<KnapsackItem> items = {{0, 6}, {1, 5}, {2, 5}};
  EXPECT_EQ(greedy_knapsack(items, 10, -1).total, 6);
  EXPECT_EQ(exact_knapsack(items, 10, -1).total, 10);
  // Two knapsacks (10 and 6): the smaller first takes 6, the larger 5 + 5: optimal.
  KnapsackSolution g = greedy_knapsack(items, 10, 6);
  EXPECT_EQ(g.total, 16);
  EXPECT_EQ(g.links, (std::vector<int>{1, 0, 0}));
}

TEST(DeftKnapsack, ExactMatchesBruteForceOnRandomInstances) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<KnapsackItem> items;
    const int n = static_cast<int>(rng.uniform_int(0, 9));
    for (int i = 0; i < n; ++i) items.push_back({i, rng.uniform_int(1, 100)});
    const TimeNs c0 = rng.uniform_int(0, 300),
                 c1 = rng.uniform() < 0.5 ? -1 : rng.uniform_int(0, 200);
    TimeNs best = 0;
    int combos = 1;
    for (int i = 0; i < n; ++i) combos *= 3;
    for (int m = 0; m < combos; ++m) {
      TimeNs s0 = 0, s1 = 0;
      int x = m;
      bool ok = true;
      for (int i = 0; i < n; ++i, x /= 3) {
        if (x % 3 == 1) s0 += items[static_cast<std::size_t>(i)].time;
        if (x % 3 == 2) {
          if (c1 < 0) ok = false;
          s1 += items[static_cast<std::size_t>(i)].time;
        }
      }
      if (ok && s0 <= c0 && s1 <= std::max<TimeNs>(c1, 0)) best = std::max(best, s0 + s1);
    }
    const KnapsackSolution e = exact_knapsack(items, c0, c1);
    ASSERT_EQ(e.total, best) << trial;
    EXPECT_LE(greedy_knapsack(items, c0, c1).total, best);
  }
}

TEST(DeftLossModel, ReproducesTableVRatio) {
  LossModel m;  // Table V's setting: s_A = 0.2103, S* = 0, eta = 0.01, B = 256
  m.batch = 256;
  // O_D = (B, 2B, B) over N = 4 iterations against O_B = four steps of B: ~0.993.
  EXPECT_NEAR(m.ratio({1, 2, 1}), 0.993, 0.001);
  EXPECT_DOUBLE_EQ(m.ratio({1, 1, 1}), 1.0);
  EXPECT_LT(m.ratio({4}), m.ratio({2, 2}));  // fewer updates, further from the baseline
}

// What the Preserver's test amounts to with the fitted constants (issue 14). With sigma =
// 40 and eta = 0.01 the step's deviation eta sigma / sqrt(kB) is tiny beside the distance
// to the objective, so Phi(a) - Phi(-a) = 1 and the rebound term vanishes: every update
// lowers the expected loss by eta mu = 0.00144 whatever its batch. Then
// E_OB / E_OD = (s0 - N eta mu) / (s0 - m eta mu) for m updates in N iterations, about
// 1 - 0.007 (N - m): epsilon 0.01 admits exactly one skipped update per judged cycle, for
// every batch size. The cycle is one period of the sequence (the paper's N, IV-C2: DeFT
// "loops every N iterations"): batch_cycle returns the shortest, so [2, 2] is judged as
// [2]; judged as written, [2, 2] (two skips in four iterations) would fail.
TEST(DeftLossModel, FittedConstantsAllowOneSkippedUpdatePerCycle) {
  const double eps = DeftOptions{}.deft_epsilon;
  for (double batch : {32.0, 256.0, 4096.0}) {
    LossModel m;
    m.batch = batch;
    auto passes = [&](const std::vector<int>& ks) { return std::abs(m.ratio(ks) - 1.0) <= eps; };
    EXPECT_TRUE(passes({2})) << batch;
    EXPECT_TRUE(passes({1, 1, 1, 2})) << batch;
    EXPECT_FALSE(passes({3})) << batch;
    EXPECT_FALSE(passes({2, 2})) << batch;
    EXPECT_NEAR(m.ratio({2}), (0.2103 - 2 * 0.00144) / (0.2103 - 0.00144), 1e-3) << batch;
  }
  EXPECT_EQ(batch_cycle({2, 2, 2, 2, 2, 2}), (std::vector<int>{2}));
  EXPECT_EQ(batch_cycle({1, 2, 2, 1, 2, 2}), (std::vector<int>{1, 2, 2}));
}

TEST(DeftLossModel, BatchCycle) {
  EXPECT_EQ(batch_cycle({1, 1, 2, 1, 2, 1, 2}), (std::vector<int>{1, 2}));
  EXPECT_EQ(batch_cycle({3, 1, 1, 1, 1}), (std::vector<int>{1}));
  EXPECT_EQ(batch_cycle({}), (std::vector<int>{}));
}

// Fig. 4's transitions, worked by hand. Eight layers = eight buckets of 10 us each
// (T_ar = 1 ns/B, 10,000 B); backward 5 us per layer (40 us; the first bucket is ready at
// 5 us), forward 3.75 us per layer (30 us); one link; every collective ends by the end of
// its stage. Iterations 0..5 here are the paper's 1st..6th.
//  it 0 bwd  Case 4 (nothing pending): Algorithm 1, capacity 40 - 5 = 35: 3 buckets; 5 to CQ.
//  it 0 fwd  Case 1: knapsack of 30 over CQ: 3; CQ keeps 2 ("two yellow buckets").
//  it 1 bwd  Case 3: the 2 old ones (20 us) fit in 40: sent first; Algorithm 1 on the 8 new
//            with 40 - 20 - 5 = 15: 1 bucket; 7 to CQ. Update of iteration 0 (1B).
//  it 1 fwd  Case 1: 3; CQ keeps 4.
//  it 2 bwd  Case 3: 4 old = 40 us fit exactly; nothing left for the new: 8 to CQ.
//            Update of iteration 1.
//  it 2 fwd  Case 1: 3; CQ keeps 5.
//  it 3 bwd  Case 2: 5 old = 50 us > 40: the knapsack takes 4; 1 stays; iteration 3's
//            buckets go to the future task queue.
//  it 3 fwd  Case 1: the last old one. Update of iteration 2.
//  it 4 bwd  Case 4 with a future task queue: iterations 3 and 4 merged; Algorithm 1 takes 3.
//  it 4 fwd  Case 1: 3; CQ keeps 2.
//  it 5 bwd  Case 3: the 2 merged ones first: iterations 3 and 4 are updated together (2B).
TEST(DeftQueues, Fig4TransitionsByHand) {
  Profile p;
  p.name = "fig4";
  p.batch_size = 1;
  for (int l = 0; l < 8; ++l)
    p.layers.push_back(layer("l" + std::to_string(l), 3750, 5000, 10'000));
  TensorLayout lay(p);
  AllReduceContext ctx;
  ctx.profile = &p;
  ctx.layout = &lay;
  ctx.workers = 2;
  ctx.links = {AllReduceCost{0, 1.0}};
  PolicyOptions o;
  std::vector<Block> buckets = cut_blocks(lay, 10'000);
  ASSERT_EQ(buckets.size(), 8u);
  DeftPolicy pol(ctx, o, buckets, 1.0);

  struct Sink final : CollectiveSink {
    void all_reduce(const CollectiveBucket& b, TimeNs) override { issued.push_back(b); }
    std::vector<CollectiveBucket> issued;
  } sink;
  TimeNs now = 0;
  auto complete = [&]() {
    std::vector<CollectiveBucket> done;
    done.swap(sink.issued);
    for (const CollectiveBucket& b : done) pol.on_collective_done(b, now, sink);
  };
  for (int it = 0; it < 6; ++it) {
    complete();
    ASSERT_TRUE(pol.backward_ready());
    pol.on_iteration_start(it, now, sink);
    for (int l = 7; l >= 0; --l) pol.on_gradient_ready(l, now + (8 - l) * 5000, sink);
    now += 40'000;
    complete();
    ASSERT_TRUE(pol.forward_ready(0));
    pol.on_forward_start(0, now, sink);
    now += 30'000;
  }
  complete();
  struct Want {
    int c, old_, new_, cq;
    bool fq;
  };
  const std::vector<Want> want = {
      {4, 0, 3, 5, false}, {1, 3, 0, 2, false},  // it 0
      {3, 2, 1, 7, false}, {1, 3, 0, 4, false},  // it 1
      {3, 4, 0, 8, false}, {1, 3, 0, 5, false},  // it 2
      {2, 4, 0, 1, true},  {1, 1, 0, 0, true},   // it 3
      {4, 0, 3, 5, false}, {1, 3, 0, 2, false},  // it 4
      {3, 2, 1, 7, false}, {1, 3, 0, 4, false},  // it 5
  };
  ASSERT_EQ(pol.stages().size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const DeftStage& s = pol.stages()[i];
    EXPECT_EQ(s.forward, i % 2 == 1) << i;
    EXPECT_EQ(s.which_case, want[i].c) << "stage " << i;
    EXPECT_EQ(s.issued_old, want[i].old_) << "stage " << i;
    EXPECT_EQ(s.issued_new, want[i].new_) << "stage " << i;
    EXPECT_EQ(s.current_after, want[i].cq) << "stage " << i;
    EXPECT_EQ(s.future_after, want[i].fq) << "stage " << i;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const DeftUpdate& u : pol.updates()) ranges.emplace_back(u.first, u.last);
  EXPECT_EQ(ranges,
            (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {1, 1}, {2, 2}, {3, 4}}));
  EXPECT_EQ(pol.updates()[3].time, 5 * 70'000 + 40'000);  // end of the 6th backward stage
}

// The exactly-once property across iterations: with communication far beyond the
// computation (so that buckets are delayed and iterations merged), one or two links, every
// byte of every iteration is reduced exactly once (the engine's verify_bytes), and DeFT's
// iteration is never below the compute-only bound.
TEST(DeftProperty, EveryBucketOfEveryIterationReducedExactlyOnce) {
  Rng rng(2024);
  int merged_runs = 0;
  for (int trial = 0; trial < 120; ++trial) {
    Profile p = testing::random_profile(rng, 10, 300'000, 2 * kNsPerMs);
    ClusterConfig c =
        testing::allreduce_cluster(static_cast<int>(rng.uniform_int(2, 16)),
                                   Rate::mbps(rng.uniform(50, 5000)), rng.uniform_int(0, 50'000));
    if (trial % 2) c.second_link_slowdown = rng.uniform(1.0, 2.5);
    PolicyOptions o;
    o.deft_partition_size = rng.uniform_int(50'000, 1'000'000);
    o.deft_max_retries = static_cast<int>(rng.uniform_int(0, 3));
    o.deft_exact_max_items = static_cast<int>(rng.uniform_int(0, 10));
    SimOptions so;
    so.iterations = 8;
    so.verify_bytes = true;
    auto r = simulate(p, "deft", o, c, so);
    ASSERT_TRUE(r.is_ok()) << trial << ": " << r.status().to_string();
    auto oracle = simulate(p, "oracle", o, c, so);
    EXPECT_GE(r->iteration_time, oracle->iteration_time);
    for (const std::string& n : r->notes) {
      if (n.find("2B") != std::string::npos && n.find("effective batch") != std::string::npos)
        ++merged_runs;
    }
  }
  EXPECT_GT(merged_runs, 0);  // the merging path was exercised
}

// Six layers of 4 MB, 1 ms forward and 2 ms backward each: 18 ms of compute per iteration.
Profile slow_profile() {
  Profile p;
  p.name = "slow";
  p.batch_size = 32;
  for (int l = 0; l < 6; ++l)
    p.layers.push_back(layer("l" + std::to_string(l), 1'000'000, 2'000'000, 4'000'000));
  return p;
}

TEST(DeftPreserver, RaisesCapacityUntilTheRatioPasses) {
  Profile p = slow_profile();
  TensorLayout lay(p);
  AllReduceContext ctx;
  ctx.profile = &p;
  ctx.layout = &lay;
  ctx.workers = 8;
  ctx.links = {AllReduceCost{100'000, 2.0}};  // 24 MB at 2 ns/B ~ 48 ms vs 18 ms compute
  PolicyOptions o;
  o.deft_partition_size = 4'000'000;
  auto strict = make_allreduce_policy("deft", o, ctx);
  ASSERT_TRUE(strict.is_ok());
  const auto* d = dynamic_cast<const DeftPolicy*>(strict->get());
  ASSERT_NE(d, nullptr);
  const std::string report = (*strict)->report().back();
  // The capacity at 1.0 fails the test; it is raised until the ratio passes, within the
  // retries allowed.
  EXPECT_GT(d->preserver_retries(), 0) << report;
  EXPECT_LE(d->preserver_retries(), o.deft_max_retries) << report;
  EXPECT_LE(std::abs(d->preserver_ratio() - 1.0), o.deft_epsilon) << report;
  EXPECT_GT(d->capacity_scale(), 1.0) << report;
  EXPECT_EQ(report.find("after 0 retries"), std::string::npos) << report;
  o.deft_epsilon = 0.9;  // anything passes
  auto lax = make_allreduce_policy("deft", o, ctx);
  ASSERT_TRUE(lax.is_ok());
  EXPECT_NE((*lax)->report().back().find("after 0 retries"), std::string::npos);
  o.deft_epsilon = 0.01;
  o.deft_max_retries = 0;
  auto none = make_allreduce_policy("deft", o, ctx);
  EXPECT_NE((*none)->report().back().find("capacity x1.000"), std::string::npos);
}

// DeFT on the slow profile, 2 workers, judged on measured training (PyTorch,
// deft_loss_feedback) every 4 iterations; `feed` gives it iterations first..first+n-1 of
// loss 2.3, noise 0.5, lr 0.05, batch 16 and the given |g|^2.
struct MeasuredPreserver {
  Profile p = slow_profile();
  TensorLayout lay{p};
  AllReduceContext ctx;
  PolicyOptions o;
  std::unique_ptr<AllReducePolicy> made;
  DeftPolicy* d = nullptr;
  struct Drop : CollectiveSink {
    void all_reduce(const CollectiveBucket&, TimeNs) override {}
  } sink;

  MeasuredPreserver(double capacity_scale, int max_retries) {
    ctx.profile = &p;
    ctx.layout = &lay;
    ctx.workers = 2;
    ctx.links = {AllReduceCost{100'000, 2.0}};
    o.deft_partition_size = 4'000'000;
    o.deft_loss_feedback = true;
    o.deft_horizon = 4;
    o.deft_capacity_scale = capacity_scale;
    o.deft_max_retries = max_retries;
    auto r = make_allreduce_policy("deft", o, ctx);
    if (r.is_ok()) made = std::move(*r);
    d = dynamic_cast<DeftPolicy*>(made.get());
  }
  void feed(std::int64_t first, int n, double grad_sq) {
    for (std::int64_t it = first; it < first + n; ++it) {
      d->on_feedback(TrainingFeedback{it, 2.3, grad_sq, 0.5, 0.05, 16}, 0, sink);
    }
  }
};

// Measured training: no dry run; every horizon the Preserver judges what ran with the
// measured loss, |g|^2, noise and lr. Nothing updated yet counts as one update of every
// iteration so far, which slows convergence when a step moves the loss (raised), and not
// when the gradient is zero (kept).
TEST(DeftPreserver, JudgesMeasuredTrainingEveryHorizon) {
  MeasuredPreserver m(0.5, PolicyOptions{}.deft_max_retries);
  ASSERT_NE(m.d, nullptr);
  DeftPolicy* d = m.d;
  const PolicyOptions& o = m.o;
  EXPECT_DOUBLE_EQ(d->capacity_scale(), 0.5);  // no dry run: the Solver's schedule runs first
  EXPECT_NE(d->report().back().find("no judgement yet"), std::string::npos) << d->report().back();
  auto feed = [&](std::int64_t first, int n, double grad_sq) { m.feed(first, n, grad_sq); };
  feed(0, 3, 0.2);
  EXPECT_TRUE(d->judgements().empty());  // a horizon is 4 iterations
  feed(3, 1, 0.2);
  ASSERT_EQ(d->judgements().size(), 1u);
  const auto& j = d->judgements()[0];
  EXPECT_EQ(j.cycle, (std::vector<int>{4}));  // iterations 0..3, none updated
  EXPECT_DOUBLE_EQ(j.loss, 2.3);
  EXPECT_DOUBLE_EQ(j.lr, 0.05);
  EXPECT_LT(j.ratio, 1.0 - o.deft_epsilon);  // 4 steps of eta mu beat 1
  EXPECT_TRUE(j.raised);
  // IV-C3: the Solver re-solved with raised capacities until the schedule it would run
  // passed the test with these measurements, within the ten raises.
  const int raises = d->preserver_retries();
  EXPECT_GT(raises, 1);
  EXPECT_LT(raises, o.deft_max_retries);
  EXPECT_LE(std::abs(j.resolved_ratio - 1.0), o.deft_epsilon);
  EXPECT_NEAR(d->capacity_scale(), 0.5 * std::pow(1.1, raises), 1e-9);
  const double scale = d->capacity_scale();
  feed(4, 4, 0.0);  // a zero gradient: merged or not, nothing moves
  ASSERT_EQ(d->judgements().size(), 2u);
  EXPECT_NEAR(d->judgements()[1].ratio, 1.0, 1e-12);
  EXPECT_FALSE(d->judgements()[1].raised);
  EXPECT_DOUBLE_EQ(d->capacity_scale(), scale);
  const std::string said = "2 judgements, capacity raised " + std::to_string(raises) + " times";
  std::string report;
  for (const std::string& line : d->report()) report += line + "\n";
  EXPECT_NE(report.find(said), std::string::npos) << report;
}

// The loss model cannot pass the executed schedule and no raise helps within the limit:
// the Preserver spends its raises at the first failed judgement and stops there.
TEST(DeftPreserver, StopsRaisingAtTheRetryLimit) {
  // 0.01 x 1.1^3: still far too small a capacity to update every iteration.
  MeasuredPreserver m(0.01, 3);
  ASSERT_NE(m.d, nullptr);
  DeftPolicy* d = m.d;
  const PolicyOptions& o = m.o;
  m.feed(0, 8, 0.2);
  ASSERT_EQ(d->judgements().size(), 2u);
  EXPECT_TRUE(d->judgements()[0].raised);
  EXPECT_GT(std::abs(d->judgements()[0].resolved_ratio - 1.0), o.deft_epsilon);
  EXPECT_FALSE(d->judgements()[1].raised);  // no raise left
  EXPECT_EQ(d->preserver_retries(), 3);
  EXPECT_NEAR(d->capacity_scale(), 0.01 * 1.1 * 1.1 * 1.1, 1e-12);
}

// The Preserver judges the schedule the engine runs (issue 14: its dry run let every
// collective end with its stage, so it certified [2B] here while the run, whose
// collectives spill over and hold the next stage, merged three iterations at a time and
// updated at 0.40). Two links' worth of communication per iteration on one link: the
// run's updates are never larger than the certified cycle's and come as often.
TEST(DeftPreserver, CertifiesTheScheduleTheEngineRuns) {
  const Profile p = slow_profile();
  for (double b : {2.0, 2.5}) {
    ClusterConfig c = testing::allreduce_cluster(8);
    c.allreduce_a = 100'000;
    c.allreduce_b_ns_per_byte = b;
    PolicyOptions o;
    o.deft_partition_size = 4'000'000;
    SimOptions so;
    so.iterations = 20;
    auto r = simulate(p, "deft", o, c, so);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    std::vector<int> run, cycle;
    double frequency = -1;
    for (const std::string& n : r->notes) {
      auto read_ks = [&](std::size_t from, char stop) {
        std::vector<int> ks;
        for (std::size_t i = from; i < n.size() && n[i] != stop; ++i) {
          if (n[i] == 'B' && i > 0 && std::isdigit(static_cast<unsigned char>(n[i - 1]))) {
            std::size_t j = i;
            while (j > 0 && std::isdigit(static_cast<unsigned char>(n[j - 1]))) --j;
            ks.push_back(std::stoi(n.substr(j, i - j)));
          }
        }
        return ks;
      };
      if (n.starts_with("update frequency")) {
        frequency = std::stod(n.substr(std::string("update frequency ").size()));
        run = read_ks(n.find("batch sizes:"), '\0');
      }
      if (n.starts_with("Preserver")) cycle = read_ks(n.find('['), ']');
    }
    ASSERT_FALSE(run.empty());
    ASSERT_FALSE(cycle.empty());
    int sum = 0;
    for (int k : cycle) sum += k;
    const int largest = *std::max_element(cycle.begin(), cycle.end());
    run.pop_back();  // the last update reduces what training's end flushes
    for (int k : run) EXPECT_LE(k, largest) << "b " << b;
    EXPECT_NEAR(frequency, static_cast<double>(cycle.size()) / sum, 0.08) << "b " << b;
  }
}

}  // namespace
}  // namespace qs
