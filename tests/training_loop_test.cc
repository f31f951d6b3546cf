// The one training loop (engine/training_loop.h) against its contract, with scripted
// seams: a plain Timer, the emulated GPU, and an Exchange whose deliveries the test
// decides. What a new Compute or Exchange may rely on is checked here, apart from the
// simulator's and the runtime's own implementations.
#include "quicksilver/engine/training_loop.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "quicksilver/engine/result.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;

// Callbacks in (time, scheduling order).
class ScriptTimer final : public Timer {
 public:
  TimeNs now() const override { return now_; }
  void schedule_at(TimeNs when, Callback fn) override {
    q_.emplace(std::make_pair(std::max(when, now_), seq_++), std::move(fn));
  }
  // Runs callbacks up to and including `until`.
  void run_until(TimeNs until) {
    while (!q_.empty() && q_.begin()->first.first <= until) {
      auto node = q_.extract(q_.begin());
      now_ = node.key().first;
      node.mapped()();
    }
    now_ = std::max(now_, until);
  }
  void run_all() { run_until(kTimeNever / 2); }

 private:
  std::map<std::pair<TimeNs, std::uint64_t>, Callback> q_;
  std::uint64_t seq_ = 0;
  TimeNs now_ = 0;
};

// Pushes each layer's tensor whole to server 0 when its gradient is ready, with a startup
// delay for layer 0's (the most urgent one).
class WholeTensors final : public PsPolicy {
 public:
  explicit WholeTensors(const TensorLayout& l) : layout_(l) {}
  TimeNs startup = 0;  // layer 0's user-level startup delay
  // If given, layer 0's tensor goes in as many equal pieces instead, each with its delay.
  std::vector<TimeNs> piece_delays;
  std::string_view name() const override { return "whole-tensors"; }
  QueueDiscipline discipline() const override { return QueueDiscipline::kPriority; }
  void on_gradient_ready(int l, TimeNs, PushSink& out) override {
    const TensorInfo& t = layout_.tensor(layout_.first_tensor(l));
    if (l == 0 && !piece_delays.empty()) {
      const Bytes piece = t.bytes / static_cast<Bytes>(piece_delays.size());
      for (std::size_t i = 0; i < piece_delays.size(); ++i) {
        out.push(PushUnit{Chunk{t.id, static_cast<Bytes>(i) * piece, piece}, 0, t.id},
                 piece_delays[i]);
      }
      return;
    }
    out.push(PushUnit{Chunk{t.id, 0, t.bytes}, 0, t.id}, l == 0 ? startup : 0);
  }
  std::vector<std::int64_t> estimates;  // bandwidth estimates received, bit/s
  void on_bandwidth_estimate(Rate r, TimeNs) override { estimates.push_back(r.bits_per_second); }

 private:
  const TensorLayout& layout_;
};

// Records what it is handed; the test delivers acknowledgements and pulls.
class ScriptExchange final : public PsExchange {
 public:
  explicit ScriptExchange(const Placement& p) : placement_(p) {}
  void push(const PushUnit& u) override { queued.push_back(u); }
  void flush() override { ++flushes; }
  Status check(const PushUnit& u) const override {
    if (reject_tensor == u.chunk.tensor)
      return internal_error("tensor " + std::to_string(u.chunk.tensor) + " refused");
    return Status::ok();
  }
  Traffic take_traffic(TimeNs) override {
    Traffic t = traffic;
    traffic = {};
    return t;
  }
  const Placement& placement_;
  std::vector<PushUnit> queued;
  int flushes = 0;
  TensorId reject_tensor = -1;
  Traffic traffic;
};

Profile two_layers() {
  Profile p;
  p.name = "two";
  p.batch_size = 1;
  p.layers = {layer("a", 1000, 2000, 400), layer("b", 3000, 4000, 800)};
  return p;
}

// The two-layer job, one worker's loop over scripted seams, started by start().
struct Rig {
  Profile profile = two_layers();
  TensorLayout layout{profile};
  Placement placement{layout, 1};
  ScriptTimer timer;
  EmulatedCompute gpu{profile, 1.0, timer};
  ScriptExchange exchange{placement};
  WholeTensors policy{layout};
  LoopOptions options;
  std::unique_ptr<TrainingLoop> loop;

  TrainingLoop& start(int iterations) {
    options.iterations = iterations;
    loop = std::make_unique<TrainingLoop>(profile, layout, policy, timer, gpu, exchange, options);
    loop->start();
    return *loop;
  }
};

// One loop, typed on its exchange: a PS policy with an all-reduce exchange (or the
// reverse) does not compile.
static_assert(std::is_constructible_v<TrainingLoop, const Profile&, const TensorLayout&, PsPolicy&,
                                      Timer&, Compute&, PsExchange&, LoopOptions>);
static_assert(
    std::is_constructible_v<TrainingLoop, const Profile&, const TensorLayout&, AllReducePolicy&,
                            Timer&, Compute&, CollectiveExchange&, LoopOptions>);
static_assert(!std::is_constructible_v<TrainingLoop, const Profile&, const TensorLayout&, PsPolicy&,
                                       Timer&, Compute&, CollectiveExchange&, LoopOptions>);
static_assert(
    !std::is_constructible_v<TrainingLoop, const Profile&, const TensorLayout&, AllReducePolicy&,
                             Timer&, Compute&, PsExchange&, LoopOptions>);

TEST(TrainingLoop, ForwardOfALayerWaitsForItsOwnSumsAndStartsWhenTheyArrived) {
  Rig r;
  TrainingLoop& loop = r.start(1);
  // Backward: layer b (4 us), then layer a (2 us); each hands its unit over at its end.
  r.timer.run_until(6000);
  ASSERT_EQ(r.exchange.queued.size(), 2u);
  EXPECT_EQ(r.exchange.queued[0].chunk.tensor, 1);
  EXPECT_EQ(r.exchange.queued[1].chunk.tensor, 0);
  EXPECT_GE(r.exchange.flushes, 2);  // once per policy callback
  EXPECT_TRUE(loop.blocked());       // forward of layer a waits: nothing pulled
  EXPECT_EQ(loop.layer(), 0);
  // Layer b's sum first: layer a still waits.
  r.timer.run_until(7000);
  loop.on_pulled(r.exchange.queued[0], 7000);
  EXPECT_TRUE(loop.blocked());
  // Layer a's sum at 9 us: its forward (1 us) starts then, b's (3 us) follows: 13 us.
  r.timer.run_until(9000);
  loop.on_pulled(r.exchange.queued[1], 9000);
  EXPECT_FALSE(loop.blocked());
  r.timer.run_all();
  ASSERT_TRUE(loop.finished());
  ASSERT_TRUE(loop.error().is_ok()) << loop.error().to_string();
  EXPECT_EQ(loop.records()[0].time, 13000);
}

TEST(TrainingLoop, StartupDelayHandsTheUnitOverLaterAndFlushesOnItsOwn) {
  Rig r;
  r.policy.startup = 500;
  TrainingLoop& loop = r.start(1);
  r.timer.run_until(6000);
  ASSERT_EQ(r.exchange.queued.size(), 1u);  // layer a's unit waits out its startup
  const int flushes = r.exchange.flushes;
  r.timer.run_until(6500);
  ASSERT_EQ(r.exchange.queued.size(), 2u);
  EXPECT_EQ(r.exchange.flushes, flushes + 1);
  EXPECT_TRUE(loop.all_ready_handed());
}

// Delayed pushes due in the order they were made wait in a FIFO, the others by slot
// (TrainingLoop::push_decision): either way each unit is handed over at its own time.
TEST(TrainingLoop, DelayedPushesAreHandedOverInTheOrderTheyAreDue) {
  Rig r;
  // Layer a's gradient is ready at 6 us, in four pieces: due at +300 (queued first), +100
  // and +200 (earlier than the first: by slot), +400 (after it: queued).
  r.policy.piece_delays = {300, 100, 200, 400};
  TrainingLoop& loop = r.start(2);
  r.timer.run_until(6000);
  ASSERT_EQ(r.exchange.queued.size(), 1u);  // layer b's, undelayed
  auto offsets_after = [&](TimeNs t) {
    r.timer.run_until(t);
    std::vector<Bytes> o;
    for (std::size_t i = 1; i < r.exchange.queued.size(); ++i)
      o.push_back(r.exchange.queued[i].chunk.offset);
    return o;
  };
  EXPECT_EQ(offsets_after(6099), (std::vector<Bytes>{}));
  EXPECT_EQ(offsets_after(6100), (std::vector<Bytes>{100}));
  EXPECT_EQ(offsets_after(6250), (std::vector<Bytes>{100, 200}));
  EXPECT_EQ(offsets_after(6300), (std::vector<Bytes>{100, 200, 0}));
  EXPECT_EQ(offsets_after(6399), (std::vector<Bytes>{100, 200, 0}));
  EXPECT_EQ(offsets_after(6400), (std::vector<Bytes>{100, 200, 0, 300}));
  EXPECT_TRUE(loop.all_ready_handed());
  // Again in the next iteration, the FIFO and the slots reused.
  for (std::size_t i = 0; i < 5; ++i) loop.on_pulled(r.exchange.queued[i], 6500);
  r.timer.run_until(20000);  // forward to 10.5 us, backward to 16.5 us, the pieces after
  ASSERT_EQ(r.exchange.queued.size(), 10u);
  std::vector<Bytes> second;
  for (std::size_t i = 6; i < 10; ++i) second.push_back(r.exchange.queued[i].chunk.offset);
  EXPECT_EQ(second, (std::vector<Bytes>{100, 200, 0, 300}));
  for (std::size_t i = 5; i < 10; ++i) loop.on_pulled(r.exchange.queued[i], 20000);
  r.timer.run_all();
  ASSERT_TRUE(loop.finished());
  ASSERT_TRUE(loop.error().is_ok()) << loop.error().to_string();
}

TEST(TrainingLoop, WhilePushingUtilisationAndTheBandwidthMonitor) {
  Rig r;
  TrainingLoop& loop = r.start(2);
  r.timer.run_until(6000);
  EXPECT_TRUE(loop.pushing());  // some ready gradient is not yet on the wire
  // Everything handed over was on the wire at 6.5 us: pushing ran from 4 us (b's
  // gradient ready) to 6.5 us.
  loop.on_drained(6500);
  EXPECT_FALSE(loop.pushing());
  r.exchange.traffic = Traffic{1200, 2, 1250, 2000, 0};  // bytes, units, wire bytes, busy
  loop.on_pulled(r.exchange.queued[0], 7000);
  loop.on_pulled(r.exchange.queued[1], 7000);
  r.timer.run_until(20000);
  ASSERT_EQ(loop.records().size(), 1u);
  const IterationRecord& rec = loop.records()[0];
  EXPECT_EQ(rec.pushing, 2500);
  EXPECT_DOUBLE_EQ(rec.utilisation, 2000.0 / 2500.0);
  EXPECT_DOUBLE_EQ(rec.gbps, 8.0 * 1250 / 2500);
  EXPECT_EQ(rec.traffic.bytes, 1200);
  // The next iteration's policy hears the monitor: 1250 bytes over 2 us = 5 Gbit/s.
  ASSERT_EQ(r.policy.estimates.size(), 1u);
  EXPECT_EQ(r.policy.estimates[0], 5'000'000'000);
}

TEST(TrainingLoop, AUnitTheExchangeRefusesStopsTheLoopNamingThePolicy) {
  Rig r;
  r.exchange.reject_tensor = 1;
  Status seen;
  r.options.failed = [&](const Status& s) { seen = s; };
  TrainingLoop& loop = r.start(1);
  r.timer.run_all();
  ASSERT_FALSE(loop.error().is_ok());
  EXPECT_NE(loop.error().to_string().find("whole-tensors"), std::string::npos)
      << loop.error().to_string();
  EXPECT_NE(loop.error().to_string().find("tensor 1 refused"), std::string::npos);
  EXPECT_EQ(seen.to_string(), loop.error().to_string());
  EXPECT_TRUE(r.exchange.queued.empty());  // never handed over
  EXPECT_FALSE(loop.finished());
}

TEST(TrainingLoop, PullingMoreThanALayerHoldsIsAnError) {
  Rig r;
  TrainingLoop& loop = r.start(1);
  r.timer.run_until(6000);
  loop.on_pulled(r.exchange.queued[0], 6000);
  loop.on_pulled(r.exchange.queued[0], 6000);
  EXPECT_NE(loop.error().to_string().find("pulled more bytes than it has"), std::string::npos);
}

// All-reduce: under kAfterAll the first forward waits for every collective of the
// iteration; the hooks see each iteration end and the training end.
class TwoBuckets final : public AllReducePolicy {
 public:
  explicit TwoBuckets(const TensorLayout& l) : layout_(l) {}
  std::string_view name() const override { return "two-buckets"; }
  ForwardGate forward_gate() const override { return ForwardGate::kAfterAll; }
  void on_gradient_ready(int l, TimeNs, CollectiveSink& out) override {
    const TensorInfo& t = layout_.tensor(layout_.first_tensor(l));
    CollectiveBucket b;
    b.chunks = {Chunk{t.id, 0, t.bytes}};
    b.first_iteration = b.last_iteration = it_;
    b.id = next_id_++;
    out.all_reduce(b, 0);
  }
  void on_iteration_start(std::int64_t it, TimeNs, CollectiveSink&) override { it_ = it; }

 private:
  const TensorLayout& layout_;
  std::int64_t it_ = 0;
  std::uint64_t next_id_ = 0;
};

class ScriptCollectives final : public CollectiveExchange {
 public:
  void all_reduce(const CollectiveBucket& b) override { issued.push_back(b); }
  void flush() override {}
  Status check(const CollectiveBucket&) const override { return Status::ok(); }
  Traffic take_traffic(TimeNs) override { return Traffic{0, 0, 0, 300, 600}; }
  std::vector<CollectiveBucket> issued;
};

TEST(TrainingLoop, AfterAllGateWaitsForEveryCollectiveOfTheIteration) {
  Profile p = two_layers();
  TensorLayout layout(p);
  ScriptTimer timer;
  EmulatedCompute gpu(p, 1.0, timer);
  ScriptCollectives links;
  TwoBuckets policy(layout);
  LoopOptions o;
  o.iterations = 1;
  int ended = 0, finished = 0;
  o.iteration_ended = [&](std::int64_t) { ++ended; };
  o.finished = [&] { ++finished; };
  TrainingLoop loop(p, layout, policy, timer, gpu, links, o);
  loop.start();
  timer.run_until(6000);
  ASSERT_EQ(links.issued.size(), 2u);
  loop.on_collective_done(links.issued[1]);  // layer a's: the first forward's own layer
  EXPECT_TRUE(loop.blocked());               // kAfterAll: b's is still running
  timer.run_until(8000);
  loop.on_collective_done(links.issued[0]);
  EXPECT_FALSE(loop.blocked());
  timer.run_all();
  ASSERT_TRUE(loop.finished());
  EXPECT_EQ(loop.records()[0].time, 8000 + 1000 + 3000);
  EXPECT_DOUBLE_EQ(loop.records()[0].utilisation, 0.5);  // busy over the collectives' window
  EXPECT_EQ(ended, 1);
  EXPECT_EQ(finished, 1);
  EXPECT_TRUE(loop.check_complete().is_ok()) << loop.check_complete().to_string();
}

// SimOptions::stop_at_least's arithmetic (result.h): when the statistic over the whole run
// is known to reach the bound, from the iterations that ended, the one going (begun at
// `start`) and the least any iteration takes.
TEST(KnownAtLeast, TheStatisticFromWhatEndedAndTheLeastTheRestTake) {
  SimOptions o;
  o.iterations = 3;  // a warm-up and two measured: the median is their mean
  o.warmup = 1;
  o.stop_at_least = 100;
  EXPECT_EQ(known_at_least_from({}, 0, 0, o), kTimeNever);                // the warm-up is going
  EXPECT_EQ(known_at_least_from({50}, 50, 0, o), 250);                    // (x + 0) / 2 >= 100
  EXPECT_EQ(known_at_least_from({50}, 50, 40, o), 210);                   // (x + 40) / 2 >= 100
  EXPECT_EQ(known_at_least_from({50, 120}, 170, 40, o), 250);             // (120 + x) / 2 >= 100
  EXPECT_EQ(known_at_least_from({50, 300}, 350, 40, o), 350);             // reached already
  EXPECT_EQ(known_at_least_from({50, 120, 90}, 260, 40, o), kTimeNever);  // all ended
  o.statistic = Statistic::kMean;  // rounded to the ns: 99.5 is 100
  EXPECT_EQ(known_at_least_from({50, 120}, 170, 40, o), 249);
  o.iterations = 4;  // three measured: the median is the middle one
  o.statistic = Statistic::kMedian;
  EXPECT_EQ(known_at_least_from({50}, 50, 0, o), kTimeNever);  // [x, 0, 0]: never
  EXPECT_EQ(known_at_least_from({50}, 50, 100, o), 50);        // [x, 100, 100]: now
  EXPECT_EQ(known_at_least_from({50, 150}, 200, 0, o), 300);   // [150, x, 0]
  o.statistic = Statistic::kMean;
  EXPECT_EQ(known_at_least_from({50, 150}, 200, 0, o), 349);  // (150 + x + 0) / 3 >= 99.5
  o.stop_at_least = 0;
  EXPECT_EQ(known_at_least_from({50, 150}, 200, 0, o), kTimeNever);  // no bound
}

}  // namespace
}  // namespace qs
