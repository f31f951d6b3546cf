#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "quicksilver/core/rng.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/sim/event_queue.h"
#include "quicksilver/sim/simulator.h"
#include "sim/sim_clock.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;

TEST(EventQueue, FiresInTimeThenSchedulingOrder) {
  EventQueue<int> q;
  q.schedule(5, 1);
  q.schedule(3, 2);
  q.schedule(5, 3);
  q.schedule(3, 4);
  std::vector<int> order;
  while (!q.empty()) order.push_back(q.pop().payload);
  EXPECT_EQ(order, (std::vector<int>{2, 4, 1, 3}));
  EXPECT_EQ(q.now(), 5);
  EXPECT_EQ(q.fired(), 4u);
}

// Random schedules of events over `lanes` lanes (-1: none), each lane's mostly in time
// order (sometimes not, which must fall back to the heap), and the order a single queue
// fires them in: (time, scheduling order).
class RandomSchedule {
 public:
  RandomSchedule(Rng& rng, int lanes) : rng_(rng), last_(static_cast<std::size_t>(lanes), 0) {}
  struct Draw {
    int lane;
    TimeNs at;
    int id;  // the scheduling order
  };
  // The next event, scheduled at `now` or later.
  Draw next(TimeNs now) {
    const int lane = static_cast<int>(rng_.uniform_int(-1, static_cast<int>(last_.size()) - 1));
    TimeNs at = now + static_cast<TimeNs>(rng_.uniform_int(0, 20));
    if (lane >= 0) {
      TimeNs& last = last_[static_cast<std::size_t>(lane)];
      if (rng_.uniform_int(0, 9) > 0) at = std::max(at, last);  // mostly monotone
      last = std::max(last, at);
    }
    reference_.emplace_back(at, next_id_);
    return Draw{lane, at, next_id_++};
  }
  std::size_t drawn() const { return reference_.size(); }
  std::vector<int> expected_order() const {
    auto r = reference_;
    std::stable_sort(r.begin(), r.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<int> ids;
    for (const auto& e : r) ids.push_back(e.second);
    return ids;
  }

 private:
  Rng& rng_;
  std::vector<TimeNs> last_;                       // per lane: its latest time
  std::vector<std::pair<TimeNs, int>> reference_;  // (time, id)
  int next_id_ = 0;
};

// Issue 14 (simulator scale): lanes hold events scheduled in time order, a tournament tree
// picks the earliest lane head, and the rest go to the heap; the order must be exactly the
// (time, scheduling order) of one queue. Random schedules against that reference: events
// on lanes, without a lane, and scheduled while popping.
TEST(EventQueue, LanesFireInTimeThenSchedulingOrder) {
  Rng rng(7);
  for (int round = 0; round < 200; ++round) {
    EventQueue<int> q;
    const int lanes = 1 + static_cast<int>(rng.uniform_int(0, 9));
    for (int l = 0; l < lanes; ++l) EXPECT_EQ(q.add_lane(), l);
    RandomSchedule schedule(rng, lanes);
    auto schedule_some = [&](TimeNs now) {
      const int n = static_cast<int>(rng.uniform_int(0, 4));
      for (int i = 0; i < n; ++i) {
        const auto d = schedule.next(now);
        if (d.lane >= 0) {
          q.schedule(d.at, d.id, d.lane);
        } else {
          q.schedule(d.at, d.id);
        }
      }
    };
    schedule_some(0);
    std::vector<int> order;
    while (!q.empty()) {
      EXPECT_EQ(q.size(), schedule.drawn() - order.size());
      const auto e = q.pop();
      order.push_back(e.payload);
      if (order.size() < 300) schedule_some(e.time);
    }
    ASSERT_EQ(order, schedule.expected_order()) << "round " << round;
    EXPECT_EQ(q.fired(), order.size());
  }
}

// The simulator's clock keeps a lane's callbacks in a FIFO of the lane's own (its events
// fire in the order they were scheduled) and the others, those scheduled earlier than
// their lane's last and those without a lane, by slot: every callback must still run as
// itself, in (time, scheduling order), with callbacks scheduling more as they run.
TEST(SimClock, CallbacksOnLanesRunInTimeThenSchedulingOrder) {
  Rng rng(11);
  for (int round = 0; round < 100; ++round) {
    SimClock clock;
    const int lanes = 1 + static_cast<int>(rng.uniform_int(0, 5));
    for (int l = 0; l < lanes; ++l) clock.add_lane();
    RandomSchedule schedule(rng, lanes);
    std::vector<int> order;
    std::function<void()> schedule_some = [&] {
      const int n = order.size() < 300 ? static_cast<int>(rng.uniform_int(0, 3)) : 0;
      for (int i = 0; i < n; ++i) {
        const auto d = schedule.next(clock.now());
        clock.schedule_callback(
            d.at,
            [&order, &schedule_some, id = d.id] {
              order.push_back(id);
              schedule_some();
            },
            d.lane);
      }
    };
    schedule_some();
    while (!clock.empty()) {
      const auto e = clock.pop();
      ASSERT_TRUE(clock.run_callback(e));
    }
    ASSERT_EQ(order, schedule.expected_order()) << "round " << round;
  }
}

TEST(EventQueue, RejectsThePast) {
  EventQueue<int> q;
  q.schedule(10, 0);
  q.pop();
  EXPECT_THROW(q.schedule(9, 0), CheckFailure);
}

TEST(Placement, SplitsLargeTensorsOverAllServersAndBalancesSmallOnes) {
  Profile p;
  p.layers = {layer("big", 1, 1, 4 * kMiB), layer("a", 1, 1, 400), layer("b", 1, 1, 400),
              layer("c", 1, 1, 400)};
  TensorLayout lay(p);
  Placement pl(lay, 4);
  ASSERT_EQ(pl.slices(0).size(), 4u);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(pl.slices(0)[static_cast<std::size_t>(s)].chunk.length, kMiB);
  // The three small tensors land on three different servers.
  EXPECT_NE(pl.slices(1)[0].server, pl.slices(2)[0].server);
  EXPECT_NE(pl.slices(2)[0].server, pl.slices(3)[0].server);
  EXPECT_NE(pl.slices(1)[0].server, pl.slices(3)[0].server);
  EXPECT_EQ(pl.server_of(0, 3 * kMiB + 5), 3);
}

// Server shares (issue 14, Mercury Fig. 21(b)): split tensors in proportion, small ones to
// the server with the least load per share; equal shares are the balanced placement.
TEST(Placement, SharesWeightTheSplitAndTheSmallTensors) {
  Profile p;
  p.layers = {layer("big", 1, 1, 4 * kMiB), layer("a", 1, 1, 400), layer("b", 1, 1, 400),
              layer("c", 1, 1, 400), layer("d", 1, 1, 400)};
  TensorLayout lay(p);
  Placement pl(lay, 2, Placement::kDefaultSplitThreshold, {3, 1});
  ASSERT_EQ(pl.slices(0).size(), 2u);
  EXPECT_EQ(pl.slices(0)[0].chunk.length, 3 * kMiB);
  EXPECT_EQ(pl.slices(0)[1].chunk.length, kMiB);
  // Loads 3 MiB : 1 MiB are equal per share; ties go to server 0, then it is ahead.
  EXPECT_EQ(pl.slices(1)[0].server, 0);
  EXPECT_EQ(pl.slices(2)[0].server, 1);
  EXPECT_EQ(pl.server_bytes(0) + pl.server_bytes(1), 4 * kMiB + 1600);
  Placement equal(lay, 4, Placement::kDefaultSplitThreshold, {2, 2, 2, 2});
  Placement balanced(lay, 4);
  for (TensorId t = 0; t < lay.num_tensors(); ++t) {
    ASSERT_EQ(equal.slices(t).size(), balanced.slices(t).size());
    for (std::size_t i = 0; i < equal.slices(t).size(); ++i) {
      EXPECT_EQ(equal.slices(t)[i].server, balanced.slices(t)[i].server);
      EXPECT_EQ(equal.slices(t)[i].chunk, balanced.slices(t)[i].chunk);
    }
  }
}

TEST(SplitChunk, AlignsAndCovers) {
  auto v = split_chunk(Chunk{0, 100, 1003}, 500, 4);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].offset, 100);
  EXPECT_EQ(v[0].length, 500);
  EXPECT_EQ(v[2].length, 3);
  EXPECT_EQ(v[2].end(), 1103);
}

ClusterConfig cluster(int n, int m, Rate bw) {
  ClusterConfig c;
  c.workers = n;
  c.servers = m;
  c.bandwidth = bw;
  return c;
}

TEST(Simulator, SameSeedGivesIdenticalResults) {
  Rng rng(11);
  Profile p = testing::random_profile(rng);
  SimOptions o;
  o.record_trace = true;
  auto c = cluster(3, 2, Rate::gbps(5));
  c.schedule = *BandwidthSchedule::parse_random("random:1Gbps:10Gbps:1ms", 5, kNsPerSec);
  for (const auto& policy : {"mercury", "bytescheduler", "wfbp"}) {
    auto a = simulate(p, policy, {}, c, o);
    auto b = simulate(p, policy, {}, c, o);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(a->iteration_times, b->iteration_times);
    EXPECT_EQ(a->events, b->events);
    ASSERT_EQ(a->trace.size(), b->trace.size());
    for (std::size_t i = 0; i < a->trace.size(); ++i) {
      EXPECT_EQ(a->trace[i].start, b->trace[i].start);
      EXPECT_EQ(a->trace[i].name, b->trace[i].name);
    }
  }
}

// SimOptions::stop_at_least: a run stops only when its whole run's statistic reaches the
// bound (never below it), and a run that stays below runs whole, unchanged. Both engines,
// random profiles, median and mean.
TEST(Simulator, StopsOnlyOnceItsStatisticReachesTheBound) {
  Rng rng(29);
  for (int trial = 0; trial < 16; ++trial) {
    const Profile p = testing::random_profile(rng);
    const bool ps = trial % 2 == 0;
    const double gbps[] = {0.5, 1, 10, 40};
    ClusterConfig c = cluster(ps ? 3 : 4, 2, Rate::gbps(gbps[trial / 2 % 4]));
    c.architecture = ps ? Architecture::kPs : Architecture::kAllReduce;
    // The PS bound counts the uplink's time for the push: with a token bucket, with
    // compression, with per-frame costs.
    if (ps && trial % 3 == 0) c.link_burst = 64 * kKiB;
    if (ps && trial % 5 == 0) {
      c.compression = "fp16";
      c.wire_element_bytes = 2;
      c.frame_header = 32;
      c.frame_cpu = kNsPerUs;
    }
    SimOptions o;
    o.iterations = 5;
    o.statistic = trial % 4 < 2 ? Statistic::kMedian : Statistic::kMean;
    const std::vector<std::string> policies =
        ps ? std::vector<std::string>{"mercury", "bytescheduler", "p3", "prophet", "wfbp"}
           : std::vector<std::string>{"wfbp", "mgwfbp", "bytescheduler", "ddp"};
    for (const std::string& policy : policies) {
      auto whole = simulate(p, policy, {}, c, o);
      ASSERT_TRUE(whole.is_ok()) << policy << ": " << whole.status().to_string();
      const TimeNs t = whole->iteration_time;
      for (const TimeNs bound : {t / 2, t - 1, t, t + 1, 2 * t}) {
        SimOptions b = o;
        b.stop_at_least = bound;
        auto r = simulate(p, policy, {}, c, b);
        ASSERT_TRUE(r.is_ok()) << policy;
        if (r->at_least) {
          EXPECT_LE(bound, t) << policy << " stopped at " << bound << " but takes " << t;
          EXPECT_EQ(r->iteration_time, bound) << policy;
          EXPECT_LT(r->iteration_times.size(), 5U) << policy;
          EXPECT_LE(r->events, whole->events) << policy;
        } else {
          EXPECT_EQ(r->iteration_times, whole->iteration_times) << policy;
          EXPECT_EQ(r->events, whole->events) << policy;
        }
        if (bound > t) {
          EXPECT_FALSE(r->at_least) << policy;
        }
        // Half the run's time is known long before its end: the bound does stop runs.
        if (bound == t / 2) {
          EXPECT_TRUE(r->at_least) << policy;
        }
      }
    }
  }
  SimOptions o;
  o.stop_at_least = -1;
  EXPECT_FALSE(
      simulate(testing::random_profile(rng), "mercury", {}, cluster(2, 2, Rate::gbps(1)), o)
          .is_ok());
}

// SimOptions::stop_when_steady: a run stops exactly when the cluster's iterations warmup and
// warmup + 1 are equal, and then holds the whole run's first iterations, the same events
// up to there, and the statistic those repeated would give; a run that never repeats runs
// whole, unchanged. Both engines, zoo-like random profiles, and the zoo's ResNet-50 whose
// policies repeat (so the stop is exercised).
TEST(Simulator, StopsWhenSteadyOnlyOnARepeatedIteration) {
  Rng rng(31);
  int stopped = 0, whole_runs = 0;
  auto check = [&](const Profile& p, const ClusterConfig& c, const std::string& policy,
                   int warmup) {
    SimOptions o;
    o.iterations = warmup + 4;
    o.warmup = warmup;
    auto whole = simulate(p, policy, {}, c, o);
    ASSERT_TRUE(whole.is_ok()) << policy << ": " << whole.status().to_string();
    SimOptions s = o;
    s.stop_when_steady = true;
    auto r = simulate(p, policy, {}, c, s);
    ASSERT_TRUE(r.is_ok()) << policy;
    const auto& t = whole->iteration_times;
    const auto k = static_cast<std::size_t>(warmup) + 1;
    ASSERT_EQ(r->steady, t[k] == t[k - 1]) << policy;
    if (r->steady) {
      ++stopped;
      EXPECT_EQ(r->iteration_times, std::vector<TimeNs>(t.begin(), t.begin() + k + 1)) << policy;
      EXPECT_EQ(r->iteration_time, t[k]) << policy;
      EXPECT_LT(r->events, whole->events) << policy;
      EXPECT_EQ(r->messages_per_iteration, whole->messages_per_iteration) << policy;
    } else {
      ++whole_runs;
      EXPECT_EQ(r->iteration_times, t) << policy;
      EXPECT_EQ(r->events, whole->events) << policy;
      EXPECT_EQ(r->iteration_time, whole->iteration_time) << policy;
    }
  };
  for (int trial = 0; trial < 8; ++trial) {
    const Profile p = testing::random_profile(rng);
    const bool ps = trial % 2 == 0;
    ClusterConfig c = cluster(ps ? 3 : 4, 2, Rate::gbps(trial % 4 < 2 ? 1 : 10));
    c.architecture = ps ? Architecture::kPs : Architecture::kAllReduce;
    const std::vector<std::string> policies =
        ps ? std::vector<std::string>{"mercury", "bytescheduler", "p3", "wfbp"}
           : std::vector<std::string>{"wfbp", "mgwfbp", "bytescheduler", "ddp"};
    for (const std::string& policy : policies) check(p, c, policy, trial % 3);
  }
  const Profile resnet = *load_model("resnet50");
  for (const char* policy : {"wfbp", "bytescheduler", "tictac", "mercury"}) {
    check(resnet, cluster(8, 8, Rate::gbps(10)), policy, 1);
  }
  ClusterConfig ar = cluster(8, 1, Rate::gbps(10));
  ar.architecture = Architecture::kAllReduce;
  for (const char* policy : {"wfbp", "mgwfbp", "ddp"}) check(resnet, ar, policy, 1);
  // Workers of unequal speeds: the cluster's iteration is the slowest's, and worker 0 may
  // end every iteration before the slowest ends the one the stop waits for.
  ClusterConfig slow = cluster(3, 3, Rate::gbps(10));
  slow.compute_factor = {1.0, 4.0, 1.0};
  for (const char* policy : {"oracle", "wfbp"}) check(resnet, slow, policy, 1);
  // Rates that change every few milliseconds: no two iterations alike (the engines check
  // the times themselves; advise asks for the stop only at a constant rate).
  for (ClusterConfig c : {cluster(8, 8, Rate::gbps(10)), ar}) {
    std::vector<BandwidthSchedule::Segment> steps;
    for (int i = 0; i < 400; ++i)
      steps.push_back({i * 3 * kNsPerMs, Rate::gbps(i % 3 == 0 ? 2 : 9)});
    c.schedule = BandwidthSchedule(steps);
    check(resnet, c, "wfbp", 1);
  }
  EXPECT_GT(stopped, 0);
  EXPECT_GT(whole_runs, 0);
}
// The push of S bytes over N = M servers with balanced load takes S / B (Mercury eq. 1):
// a single layer with compute times of 0 takes exactly push + pull pipeline time.
TEST(Simulator, BalancedPushTakesSizeOverBandwidth) {
  Profile p;
  p.layers = {layer("fc", 0, 0, 4 * kMiB)};
  PolicyOptions o;
  o.packet_size = 1024;
  auto r = simulate(p, "mercury", o, cluster(4, 4, Rate::gbps(8)), {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // 4 MiB at 1 B/ns plus the last packet's pull (1024 ns) plus incast queueing of the
  // last round (each server receives 4 workers' packets of one round back to back).
  EXPECT_GE(r->iteration_time, 4 * kMiB + 1024);
  EXPECT_LE(r->iteration_time, 4 * kMiB + 5 * 1024);
  EXPECT_GT(r->link_utilisation, 0.99);
}

// Mercury Fig. 21(b): hosts not in a perfect load balance. A slower server NIC, or a
// server holding more of the parameters, is the bottleneck: the iteration is set by the
// busiest server link (issue 14 item 11).
TEST(Simulator, PerHostBandwidthsAndServerSharesSetTheBottleneck) {
  Profile p;
  p.layers = {layer("fc", 0, 0, 4 * kMiB)};
  PolicyOptions o;
  o.packet_size = 1024;
  const TimeNs balanced =
      simulate(p, "mercury", o, cluster(4, 4, Rate::gbps(8)), {})->iteration_time;
  // Server 0 at half the rate: its quarter of every worker's push takes twice as long.
  ClusterConfig slow = cluster(4, 4, Rate::gbps(8));
  slow.server_bandwidth = {Rate::gbps(4), Rate::gbps(8), Rate::gbps(8), Rate::gbps(8)};
  auto r = simulate(p, "mercury", o, slow, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GE(r->iteration_time, 2 * 4 * kMiB);
  EXPECT_LE(r->iteration_time, 2 * 4 * kMiB + 10 * 2048);
  // Equal rates given per host are the plain cluster, exactly.
  ClusterConfig same = cluster(4, 4, Rate::gbps(8));
  same.worker_bandwidth.assign(4, Rate::gbps(8));
  same.server_bandwidth.assign(4, Rate::gbps(8));
  same.server_shares.assign(4, 2.5);
  EXPECT_EQ(simulate(p, "mercury", o, same, {})->iteration_time, balanced);
  // Server 0 holds 2/5 of the tensor: 1.6 times a quarter.
  ClusterConfig shares = cluster(4, 4, Rate::gbps(8));
  shares.server_shares = {2, 1, 1, 1};
  auto s = simulate(p, "mercury", o, shares, {});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_GE(s->iteration_time, 4 * 4 * kMiB * 2 / 5);
  EXPECT_LE(s->iteration_time, 4 * 4 * kMiB * 2 / 5 + 10 * 1024);
  // A slow worker NIC holds everyone back by its push and its pull.
  ClusterConfig worker = cluster(4, 4, Rate::gbps(8));
  worker.worker_bandwidth = {Rate::gbps(8), Rate::gbps(8), Rate::gbps(8), Rate::gbps(2)};
  auto w = simulate(p, "mercury", o, worker, {});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_GE(w->iteration_time, 4 * 4 * kMiB);
  // Validation: one value per host, PS only, not with a time-varying rate.
  ClusterConfig bad = cluster(4, 4, Rate::gbps(8));
  bad.server_shares = {1, 1};
  EXPECT_THAT(bad.validate().message(),
              ::testing::HasSubstr("--server-shares lists 2 values for 4 servers"));
  bad.server_shares = {1, 1, 0, 1};
  EXPECT_THAT(bad.validate().message(), ::testing::HasSubstr("--server-shares values must be in"));
  bad.server_shares.clear();
  bad.worker_bandwidth.assign(4, Rate::gbps(1));
  bad.schedule = *BandwidthSchedule::parse_random("random:1Gbps:10Gbps:1ms", 5, kNsPerSec);
  EXPECT_THAT(bad.validate().message(),
              ::testing::HasSubstr("cannot be combined with --bandwidth-trace"));
}

// Mercury Fig. 20 (issue 14 item 10): several jobs sharing the cluster's links.
TEST(SharedJobs, OneJobIsThePlainSimulationExactly) {
  Rng rng(5);
  for (int round = 0; round < 6; ++round) {
    Profile p = testing::random_profile(rng);
    ClusterConfig c = cluster(3, 2, Rate::gbps(2));
    SimOptions o;
    o.record_trace = true;
    for (const char* policy : {"mercury", "bytescheduler", "wfbp", "prophet"}) {
      auto plain = simulate(p, policy, {}, c, o);
      for (JobSharing sharing :
           {JobSharing::kFair, JobSharing::kStrict, JobSharing::kDeadline, JobSharing::kFlows}) {
        auto shared =
            simulate_shared({SharedJob{p, policy, {}}}, c, o, SharingOptions{sharing, true});
        ASSERT_TRUE(plain.is_ok() && shared.is_ok()) << shared.status().to_string();
        ASSERT_EQ(shared->size(), 1u);
        EXPECT_EQ(shared->front().iteration_times, plain->iteration_times) << policy;
        EXPECT_EQ(shared->front().events, plain->events) << policy;
        EXPECT_EQ(shared->front().trace.size(), plain->trace.size()) << policy;
      }
    }
  }
}

TEST(SharedJobs, TwoJobsShareTheLinks) {
  // A link-bound job: 4 MiB over 1 byte/ns, no compute. Two of them on one cluster each
  // get half the links: twice as long (fair); job 0 first: job 0 as if alone, job 1
  // after it (strict).
  Profile p;
  p.name = "bulk";
  p.layers = {layer("fc", 0, 0, 4 * kMiB)};
  PolicyOptions o;
  o.packet_size = 4096;
  const ClusterConfig c = cluster(2, 2, Rate::gbps(8));
  const TimeNs alone = simulate(p, "mercury", o, c, {})->iteration_time;
  const std::vector<SharedJob> two = {SharedJob{p, "mercury", o}, SharedJob{p, "mercury", o}};
  auto fair = simulate_shared(two, c, {}, SharingOptions{JobSharing::kFair, false});
  ASSERT_TRUE(fair.is_ok()) << fair.status().to_string();
  for (const SimResult& r : *fair) {
    EXPECT_GE(r.iteration_time, 2 * alone - 4 * 4096);
    EXPECT_LE(r.iteration_time, 2 * alone + 4 * 4096);
  }
  // Shared runs run whole: the early stops are simulate()'s, refused here.
  for (const bool steady : {false, true}) {
    SimOptions early;
    early.stop_when_steady = steady;
    early.stop_at_least = steady ? 0 : alone;
    EXPECT_FALSE(simulate_shared(two, c, early, SharingOptions{JobSharing::kFair, false}).is_ok());
  }
  auto strict = simulate_shared(two, c, {}, SharingOptions{JobSharing::kStrict, false});
  ASSERT_TRUE(strict.is_ok()) << strict.status().to_string();
  EXPECT_LE((*strict)[0].iteration_time, alone + 4 * 4096);  // at most a unit of job 1 in its way
  EXPECT_GT((*strict)[1].iteration_time, alone * 3 / 2);
  // Fair sharing is by bytes, not units: a job of 4 KiB units beside one of 64 KiB units
  // still gets half the links (its iteration is as long as the other's).
  PolicyOptions big = o;
  big.packet_size = 64 * kKiB;
  auto mixed = simulate_shared({SharedJob{p, "mercury", o}, SharedJob{p, "mercury", big}}, c, {},
                               SharingOptions{JobSharing::kFair, false});
  ASSERT_TRUE(mixed.is_ok()) << mixed.status().to_string();
  EXPECT_NEAR(static_cast<double>((*mixed)[0].iteration_time),
              static_cast<double>((*mixed)[1].iteration_time),
              0.05 * static_cast<double>((*mixed)[1].iteration_time));
}

TEST(SharedJobs, FlowsShareALinkByteByByte) {
  // One worker, one server, 1 byte/ns. Job 0 pushes one 4 MiB unit and job 1 one of 64 KiB,
  // both at time 0. Unit by unit (fair) job 1's unit waits behind job 0's whole one;
  // as flows (as TCP connections of their own) it has half the link: its push ends after
  // 128 KiB of the link's time, and its pull (the server's uplink is free) 64 KiB later.
  Profile big;
  big.name = "big";
  big.layers = {layer("fc", 0, 0, 4 * kMiB)};
  Profile small;
  small.name = "small";
  small.layers = {layer("s", 0, 0, 64 * kKiB)};
  const ClusterConfig c = cluster(1, 1, Rate::gbps(8));
  SimOptions first;
  first.iterations = 1;
  first.warmup = 0;
  const std::vector<SharedJob> jobs = {SharedJob{big, "wfbp", {}}, SharedJob{small, "wfbp", {}}};
  auto fair = simulate_shared(jobs, c, first, SharingOptions{JobSharing::kFair, false});
  auto flows = simulate_shared(jobs, c, first, SharingOptions{JobSharing::kFlows, false});
  ASSERT_TRUE(fair.is_ok() && flows.is_ok()) << flows.status().to_string();
  EXPECT_GT((*fair)[1].iteration_time, 4 * kMiB);
  EXPECT_GE((*flows)[1].iteration_time, 3 * 64 * kKiB);
  EXPECT_LE((*flows)[1].iteration_time, 3 * 64 * kKiB + kNsPerUs);
  // Job 1 keeps iterating (it runs until job 0 is done too) and so holds half of every
  // link it uses: job 0's 4 MiB push and 4 MiB pull take between once and twice their time.
  EXPECT_GT((*flows)[0].iteration_time, 8 * kMiB);
  EXPECT_LE((*flows)[0].iteration_time, 16 * kMiB + kNsPerUs);
  // Deterministic.
  auto again = simulate_shared(jobs, c, first, SharingOptions{JobSharing::kFlows, false});
  EXPECT_EQ((*again)[0].iteration_times, (*flows)[0].iteration_times);
  EXPECT_EQ((*again)[1].iteration_times, (*flows)[1].iteration_times);
  // Within a job its own model: beside a job that moves no byte, a job runs as alone, for a
  // per-message job (the default link sharing; Mercury's packets) as under LinkSharing::kFair.
  Rng rng(7);
  for (int round = 0; round < 3; ++round) {
    const Profile p = testing::random_profile(rng);
    for (const bool tcp : {false, true}) {
      ClusterConfig cc = cluster(3, 2, Rate::gbps(2));
      if (tcp) cc.link_sharing = LinkSharing::kFair;
      for (const char* policy : {"wfbp", "mercury", "bytescheduler"}) {
        const TimeNs alone = simulate(p, policy, {}, cc, {})->iteration_time;
        auto shared = simulate_shared({SharedJob{p, policy, {}}, SharedJob{small, "oracle", {}}},
                                      cc, {}, SharingOptions{JobSharing::kFlows, false});
        ASSERT_TRUE(shared.is_ok()) << shared.status().to_string();
        EXPECT_NEAR(static_cast<double>((*shared)[0].iteration_time), static_cast<double>(alone),
                    1e-3 * static_cast<double>(alone))
            << policy << (tcp ? " tcp" : "");
      }
    }
  }
}

TEST(SharedJobs, DeadlinesHoldAcrossJobsAndGpusAreShared) {
  // Both jobs push 1 MiB at time 0. Job 0 needs its layer at once (no compute); job 1's
  // waits behind 10 ms of backward and 10 ms of forward. Fair sharing halves job 0's rate;
  // earliest deadline first lets it through as if it were alone, and job 1's megabyte goes
  // when its deadline comes (job 0, link-bound, keeps the links busy until then), so job 1
  // is late by about its own transfer (1 ms), where fair sharing delivered it in time. The
  // first iteration, where both start together.
  Profile urgent;
  urgent.name = "urgent";
  urgent.layers = {layer("a", 0, 0, kMiB)};
  Profile patient;
  patient.name = "patient";
  patient.layers = {layer("b0", 10 * kNsPerMs, 10 * kNsPerMs, 4), layer("b1", 0, 0, kMiB)};
  PolicyOptions o;
  o.packet_size = 4096;
  const ClusterConfig c = cluster(2, 2, Rate::gbps(8));
  SimOptions first;
  first.iterations = 1;
  first.warmup = 0;
  const TimeNs alone = simulate(urgent, "mercury", o, c, first)->iteration_time;
  const std::vector<SharedJob> jobs = {SharedJob{urgent, "mercury", o},
                                       SharedJob{patient, "mercury", o}};
  auto fair = simulate_shared(jobs, c, first, SharingOptions{JobSharing::kFair, false});
  auto edf = simulate_shared(jobs, c, first, SharingOptions{JobSharing::kDeadline, false});
  ASSERT_TRUE(fair.is_ok() && edf.is_ok()) << edf.status().to_string();
  EXPECT_GT((*fair)[0].iteration_time, alone * 3 / 2);
  EXPECT_LE((*edf)[0].iteration_time, alone + 2 * 4096);
  EXPECT_LE((*fair)[1].iteration_time, 20 * kNsPerMs + 10 * kNsPerUs);
  EXPECT_GT((*edf)[1].iteration_time, 20 * kNsPerMs + kMiB / 2);
  EXPECT_LE((*edf)[1].iteration_time, 20 * kNsPerMs + 2 * kMiB);
  // A shared GPU runs both jobs' steps one at a time: two compute-only jobs of 20 ms
  // iterations take 40 ms each; on GPUs of their own 20 ms.
  const std::vector<SharedJob> oracles = {SharedJob{patient, "oracle", o},
                                          SharedJob{patient, "oracle", o}};
  auto gpu = simulate_shared(oracles, c, {}, SharingOptions{JobSharing::kFair, true});
  auto own = simulate_shared(oracles, c, {}, SharingOptions{JobSharing::kFair, false});
  ASSERT_TRUE(gpu.is_ok() && own.is_ok());
  EXPECT_EQ((*own)[0].iteration_time, 20 * kNsPerMs);
  EXPECT_EQ((*gpu)[0].iteration_time, 40 * kNsPerMs);
  EXPECT_EQ((*gpu)[1].iteration_time, 40 * kNsPerMs);
  // Processor sharing, not one step after another: a job of forty 0.5 ms steps beside
  // one of two 10 ms steps gets half the GPU too (taking turns per step, it would wait
  // 10 ms at each of its steps).
  Profile many;
  many.name = "many";
  for (int l = 0; l < 20; ++l)
    many.layers.push_back(layer("m" + std::to_string(l), kNsPerMs / 2, kNsPerMs / 2, 4));
  auto mixed = simulate_shared({SharedJob{patient, "oracle", o}, SharedJob{many, "oracle", o}}, c,
                               {}, SharingOptions{JobSharing::kFair, true});
  ASSERT_TRUE(mixed.is_ok());
  EXPECT_LE((*mixed)[1].iteration_time, 41 * kNsPerMs);
  // Validation.
  EXPECT_THAT(simulate_shared({}, c, {}).status().message(),
              ::testing::HasSubstr("between 1 and 16 jobs"));
  EXPECT_THAT(simulate_shared({SharedJob{urgent, "ddp", o}}, c, {}).status().message(),
              ::testing::HasSubstr("job 0: 'ddp' is not a parameter-server policy"));
  EXPECT_EQ(parse_job_sharing("deadline").value(), JobSharing::kDeadline);
  EXPECT_FALSE(parse_job_sharing("lottery").is_ok());
}

// Link utilisation counts the time some ready gradient is not yet on the wire: a compute
// gap with nothing to send does not count against the link, a scheduler's own waits do.
TEST(Simulator, LinkUtilisationCountsOnlyTimeSpentPushing) {
  Profile p;
  // Backward runs l1 (instant) then l0 (10 ms): l1's 1 MiB goes out at once, then the
  // link has nothing to send for ~9 ms, then l0's 1 MiB.
  p.layers = {layer("l0", 0, 10 * kNsPerMs, kMiB), layer("l1", 0, 0, kMiB)};
  PolicyOptions o;
  o.packet_size = 4096;
  SimOptions s;
  s.iterations = 3;
  auto m = simulate(p, "mercury", o, cluster(1, 1, Rate::gbps(8)), s);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_GT(m->link_utilisation, 0.99);  // busy / span would be about 2 / 11
  // p3's stop-and-wait: each 64 KiB slice (65.5 us) waits 2 x 100 us for its ack, so
  // the link is busy 65.5 / 265.5 of the time it has gradients to send.
  o.slice_size = 64 * kKiB;
  o.startup_time = 0;
  ClusterConfig c = cluster(1, 1, Rate::gbps(8));
  c.latency = 100 * kNsPerUs;
  auto p3 = simulate(p, "p3", o, c, s);
  ASSERT_TRUE(p3.is_ok()) << p3.status().to_string();
  EXPECT_GT(p3->link_utilisation, 0.23);
  EXPECT_LT(p3->link_utilisation, 0.26);
}

TEST(Simulator, FewerServersThanWorkersMakesServerLinksTheBottleneck) {
  Profile p;
  p.layers = {layer("fc", 0, 0, 4 * kMiB)};
  PolicyOptions o;
  o.packet_size = 4096;
  auto r = simulate(p, "mercury", o, cluster(4, 1, Rate::gbps(8)), {});
  ASSERT_TRUE(r.is_ok());
  // One server receives 4 x 4 MiB through one 1 B/ns link.
  EXPECT_GE(r->iteration_time, 16 * kMiB);
  EXPECT_LE(r->iteration_time, 16 * kMiB + 16 * 4096);
}

TEST(Simulator, SlowWorkerGatesEveryone) {
  Profile p;
  p.layers = {layer("a", 1000, 2000, 4000), layer("b", 1000, 2000, 4000)};
  auto c = cluster(3, 3, Rate::gbps(100));
  c.compute_factor = {1.0, 3.0, 1.0};
  SimOptions s;
  s.verify_bytes = true;
  auto r = simulate(p, "mercury", {}, c, s);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // The slow worker needs 3 x 6 us of compute per iteration; worker 0 cannot be faster.
  EXPECT_GE(r->iteration_time, 18'000);
  EXPECT_LE(r->iteration_time, 20'000);
  EXPECT_NEAR(r->scaling_efficiency, 18.0 / to_us(r->iteration_time), 1e-9);
}

TEST(Simulator, TimeVaryingBandwidthSlowsThePush) {
  Profile p;
  p.layers = {layer("fc", 0, 0, 1'000'000)};
  auto c = cluster(1, 1, Rate::gbps(8));
  c.schedule = BandwidthSchedule({{0, Rate::gbps(8)}, {500'000, Rate::gbps(4)}});
  SimOptions s;
  s.iterations = 1;
  s.warmup = 0;
  auto r = simulate(p, "wfbp", {}, c, s);
  ASSERT_TRUE(r.is_ok());
  // 500 KB at 1 B/ns, 500 KB at 0.5 B/ns = 1.5 ms push; the pull runs at 0.5 B/ns: 2 ms.
  EXPECT_EQ(r->iteration_time, 3'500'000);
}

TEST(Simulator, RejectsBadConfigurations) {
  Profile p = testing::mercury_fig2();
  auto c = cluster(0, 1, Rate::gbps(1));
  EXPECT_FALSE(simulate(p, "wfbp", {}, c, {}).is_ok());
  c = cluster(2, 1, Rate::gbps(1));
  c.compute_factor = {1.0};
  auto r = simulate(p, "wfbp", {}, c, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--compute-factor"), std::string::npos);
  SimOptions s;
  s.iterations = 0;
  EXPECT_FALSE(simulate(p, "wfbp", {}, cluster(1, 1, Rate::gbps(1)), s).is_ok());
}

TEST(Simulator, TraceHasComputeAndLinkTracks) {
  SimOptions s;
  s.record_trace = true;
  s.iterations = 1;
  s.warmup = 0;
  auto r = simulate(testing::mercury_fig2(), "mercury", {}, cluster(1, 1, Rate::gbps(8)), s);
  ASSERT_TRUE(r.is_ok());
  int tracks[3] = {0, 0, 0};
  for (const auto& span : r->trace) ++tracks[span.track];
  EXPECT_EQ(tracks[0], 6);  // 3 bp + 3 fp
  EXPECT_GT(tracks[1], 0);
  EXPECT_GT(tracks[2], 0);
}

}  // namespace
}  // namespace qs

namespace qs {
namespace {

// With one slow worker, the oracle's iteration is the slowest worker's compute: its
// scaling efficiency is exactly 1, never above.
TEST(Simulator, OracleWithASlowWorkerHasEfficiencyOne) {
  Profile p = testing::mercury_fig2();
  ClusterConfig c;
  c.workers = 4;
  c.servers = 4;
  c.compute_factor = {1, 1, 1, 2};
  auto r = simulate(p, "oracle", {}, c, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->iteration_time, 2 * p.compute_time());
  EXPECT_DOUBLE_EQ(r->scaling_efficiency, 1.0);
}

// A bandwidth of a few bits per second would take longer than the simulated horizon:
// a clear error, not an overflow.
TEST(Simulator, AbsurdlyLowBandwidthIsAClearError) {
  ClusterConfig c;
  c.bandwidth = Rate{1};
  Profile p;
  p.layers = {testing::layer("fc", 1000, 1000, 1'000'000'000)};  // 8e9 s at 1 bit/s
  auto r = simulate(p, "wfbp", {}, c, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--bandwidth too low"), std::string::npos);
}

}  // namespace
}  // namespace qs

namespace qs {
namespace {

TEST(CheckExactCover, AcceptsAnExactCoverAndNamesGapsAndOverlaps) {
  Profile p;
  p.layers = {testing::layer("a", 1, 1, 400), testing::layer("b", 1, 1, 800)};
  TensorLayout lay(p);
  EXPECT_TRUE(check_exact_cover({{1, 400, 400}, {0, 0, 400}, {1, 0, 400}}, lay).is_ok());
  auto gap = check_exact_cover({{0, 0, 400}, {1, 0, 300}, {1, 400, 400}}, lay);
  ASSERT_FALSE(gap.is_ok());
  EXPECT_NE(gap.message().find("tensor 1 byte 300 missing"), std::string::npos);
  auto twice = check_exact_cover({{0, 0, 400}, {0, 0, 400}, {1, 0, 800}}, lay);
  ASSERT_FALSE(twice.is_ok());
  EXPECT_NE(twice.message().find("covered twice"), std::string::npos);
  auto short_cover = check_exact_cover({{0, 0, 400}, {1, 0, 400}}, lay);
  ASSERT_FALSE(short_cover.is_ok());
  EXPECT_NE(short_cover.message().find("400 of 800 bytes"), std::string::npos);
}

}  // namespace
}  // namespace qs
