// The all-reduce runtime on gloo (quicksilver/runtime/collective.h): the rendezvous store,
// and whole jobs of in-process workers (each on its own thread and event loop, real gloo
// contexts over loopback) whose every reduced element is checked exactly.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/store.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"
#include "test_profiles.h"

#ifdef QS_HAVE_GLOO
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include "checked_allreduce.h"
#endif

namespace qs::runtime {
namespace {

TEST(Store, ParsesTheThreeRequestsAndRefusesTheRest) {
  auto set = parse_store_request("set rank_0/x " + hex_encode(std::string("\x00\xff", 2)));
  ASSERT_TRUE(set.is_ok()) << set.status().message();
  EXPECT_EQ(set->kind, StoreRequest::Kind::kSet);
  EXPECT_EQ(set->value, std::string("\x00\xff", 2));
  auto get = parse_store_request("get link0/1");
  ASSERT_TRUE(get.is_ok());
  EXPECT_EQ(get->key, "link0/1");
  auto done = parse_store_request("done 3");
  ASSERT_TRUE(done.is_ok());
  EXPECT_EQ(done->rank, 3);
  for (const char* bad : {"", "set", "set k", "set k 0", "set k zz", "get", "get a b", "get ../\n",
                          "done", "done -1", "done 12x", "put k 00"}) {
    EXPECT_FALSE(parse_store_request(bad).is_ok()) << bad;
  }
  EXPECT_FALSE(parse_store_request("get " + std::string(200, 'k')).is_ok());
  EXPECT_FALSE(parse_store_request("set k " + std::string(2 * kMaxStoreValue + 2, '0')).is_ok());
}

TEST(Store, AnswersAGetOnceTheKeyIsSetAndEndsWhenEveryRankIsDone) {
  auto server = StoreServer::create(Endpoint{"127.0.0.1", 0}, 2, 20 * kNsPerSec);
  ASSERT_TRUE(server.is_ok()) << server.status().message();
  const Endpoint at{"127.0.0.1", (*server)->port()};
  auto served = std::async(std::launch::async, [&] { return (*server)->run(); });
  auto waiter = std::async(std::launch::async, [&]() -> Result<std::string> {
    QS_ASSIGN_OR_RETURN(auto c, StoreClient::connect(at, 5 * kNsPerSec));
    QS_ASSIGN_OR_RETURN(std::string v, c->get("k", 5 * kNsPerSec));  // asked before it is set
    QS_RETURN_IF_ERROR(c->done(0));
    return v;
  });
  auto setter = StoreClient::connect(at, 5 * kNsPerSec);
  ASSERT_TRUE(setter.is_ok());
  ASSERT_TRUE((*setter)->set("k", std::string("v\n\0", 3)).is_ok());
  auto v = waiter.get();
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(*v, std::string("v\n\0", 3));
  EXPECT_FALSE((*setter)->done(7).is_ok());  // out of range: refused and closed
  auto again = StoreClient::connect(at, 5 * kNsPerSec);
  ASSERT_TRUE(again.is_ok());
  ASSERT_TRUE((*again)->done(1).is_ok());
  EXPECT_TRUE(served.get().is_ok());
}

// A client that keeps sending while its get waits is cut off at one line's worth, not
// buffered without bound.
TEST(Store, AClientWithAGetPendingCannotGrowItsBuffer) {
  auto server = StoreServer::create(Endpoint{"127.0.0.1", 0}, 1, 20 * kNsPerSec);
  ASSERT_TRUE(server.is_ok());
  auto served = std::async(std::launch::async, [&] { return (*server)->run(); });
  auto fd = transport::connect_tcp("127.0.0.1", (*server)->port(),
                                   transport::SteadyClock::instance().now() + kNsPerSec);
  ASSERT_TRUE(fd.is_ok());
  const std::string get = "get never-set\n";
  ASSERT_EQ(::send(fd->get(), get.data(), get.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(get.size()));
  const std::string junk(64 * 1024, 'x');
  std::size_t sent = 0;
  bool closed = false;
  for (int i = 0; i < 4096 && !closed; ++i) {  // up to 256 MiB, far past the bound
    const ssize_t n = ::send(fd->get(), junk.data(), junk.size(), MSG_NOSIGNAL);
    if (n <= 0)
      closed = true;
    else
      sent += static_cast<std::size_t>(n);
  }
  EXPECT_TRUE(closed) << "the store took " << sent << " bytes from a client whose get waits";
  EXPECT_LT(sent, 16u * 1024 * 1024);
  auto c = StoreClient::connect(Endpoint{"127.0.0.1", (*server)->port()}, kNsPerSec);
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE((*c)->done(0).is_ok());
  EXPECT_TRUE(served.get().is_ok());
}

TEST(Store, NamesTheRanksThatNeverFinished) {
  auto server = StoreServer::create(Endpoint{"127.0.0.1", 0}, 3, 300 * kNsPerMs);
  ASSERT_TRUE(server.is_ok());
  auto c = StoreClient::connect(Endpoint{"127.0.0.1", (*server)->port()}, kNsPerSec);
  auto served = std::async(std::launch::async, [&] { return (*server)->run(); });
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE((*c)->done(1).is_ok());
  Status s = served.get();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank(s) 0, 2"), std::string::npos) << s.message();
}

// A small job: four layers, ~1.3 MB of gradients, a few ms of compute.
Profile small_profile() {
  Profile p;
  p.name = "small";
  p.batch_size = 8;
  p.layers = {testing::layer("c1", 500'000, 1'000'000, 80'000),
              testing::layer("c2", 500'000, 1'000'000, 400'000),
              testing::layer("f1", 200'000, 400'000, 800'000),
              testing::layer("f2", 100'000, 200'000, 20'000)};
  return p;
}

// Compute of a few hundred microseconds: every collective (a startup of milliseconds on
// loopback) costs more than the compute it could hide behind, so DeFT merges iterations.
Profile light_profile() {
  Profile p = small_profile();
  for (LayerSpec& l : p.layers) l.forward /= 10, l.backward /= 10;
  return p;
}

// Runs `workers` workers of `policy` on loopback; returns their reports. `sources`: each
// worker's tensor source (default: known content, checked exactly).
std::vector<Result<WorkerReport>> run_job(
    const std::string& policy, int workers, int iterations, int links, PolicyOptions knobs = {},
    const Profile& profile = small_profile(), std::vector<double> compute_factors = {},
    const std::vector<TensorSource*>& sources = {},
    const std::function<void(CollectiveOptions&)>& adjust = {}) {
  auto server = StoreServer::create(Endpoint{"127.0.0.1", 0}, workers, 60 * kNsPerSec);
  EXPECT_TRUE(server.is_ok());
  auto served = std::async(std::launch::async, [&] { return (*server)->run(); });
  std::vector<std::future<Result<WorkerReport>>> running;
  for (int w = 0; w < workers; ++w) {
    CollectiveOptions o;
    o.job.profile = profile;
    o.job.policy = policy;
    o.job.policy_options = knobs;
    o.job.workers = workers;
    o.job.iterations = iterations;
    o.job.bandwidth = Rate::gbps(1);
    o.job.peer_timeout = 20 * kNsPerSec;
    o.rank = w;
    if (static_cast<std::size_t>(w) < compute_factors.size())
      o.compute_factor = compute_factors[static_cast<std::size_t>(w)];
    o.store = Endpoint{"127.0.0.1", (*server)->port()};
    o.links = links == 2 ? std::vector<std::string>{"127.0.0.1", "127.0.0.2"}
                         : std::vector<std::string>{"127.0.0.1"};
    o.calibration_repeats = 2;
    o.record_trace = sources.empty();
    if (!sources.empty()) o.tensors = sources[static_cast<std::size_t>(w)];
    if (adjust) adjust(o);
    running.push_back(std::async(std::launch::async, [o] { return run_collective_worker(o); }));
  }
  std::vector<Result<WorkerReport>> out;
  for (auto& r : running) out.push_back(r.get());
  EXPECT_TRUE(served.get().is_ok());
  return out;
}

class EveryPolicy : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryPolicy, ReducesEveryElementExactlyOnEveryWorker) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  const int iterations = 4;
  auto reports = run_job(GetParam(), 3, iterations, 1);
  for (const auto& r : reports) {
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->iterations_verified, iterations) << "worker " << r->worker_id;
    EXPECT_EQ(r->iteration_times.size(), static_cast<std::size_t>(iterations));
    if (GetParam() == "deft") {  // a bucket merging iterations carries their bytes once
      EXPECT_GT(r->bytes_pushed_per_iteration, 0);
      EXPECT_LE(r->bytes_pushed_per_iteration, small_profile().total_bytes());
    } else {
      EXPECT_EQ(r->bytes_pushed_per_iteration,
                small_profile().total_bytes());  // every byte, once per iteration
    }
    ASSERT_EQ(r->allreduce_fit.size(), 1u);
    EXPECT_GT(r->allreduce_fit[0].b_ns_per_byte, 0);
  }
  // Every worker fits the same numbers (the policies must cut the same buckets).
  for (const auto& r : reports) {
    EXPECT_EQ(r->allreduce_fit[0].a, reports[0]->allreduce_fit[0].a);
    EXPECT_EQ(r->allreduce_fit[0].b_ns_per_byte, reports[0]->allreduce_fit[0].b_ns_per_byte);
  }
}

INSTANTIATE_TEST_SUITE_P(Collective, EveryPolicy,
                         ::testing::Values("wfbp", "synceasgd", "mgwfbp", "mgwfbp-opt", "ddp",
                                           "bytescheduler", "usbyte", "deft"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::erase(n, '-');
                           return n;
                         });

// DeFT's delayed and merged updates on two links, on 3 workers: gradients staged per
// iteration, a bucket of several iterations summed locally before it is reduced, each
// checked exactly against the sum over its iterations and workers; workers 1 and 2 replay
// worker 0's decisions, so every worker reports the same schedule.
TEST(CollectiveDeft, MergedIterationsOnTwoLinksSumExactlyAndEveryWorkerFollowsWorkerZero) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  PolicyOptions knobs;
  knobs.deft_partition_size = 64 * kKiB;  // buckets enough that one per stage cannot keep up
  auto reports = run_job("deft", 3, 6, 2, knobs, light_profile());
  // Some update merged iterations (an update frequency below 1), and was still exact.
  double frequency = 1;
  for (const std::string& n : reports[0].is_ok() ? reports[0]->notes : std::vector<std::string>{}) {
    if (n.rfind("update frequency ", 0) == 0) frequency = std::stod(n.substr(17));
  }
  EXPECT_LT(frequency, 1.0) << "DeFT merged no iterations: the test checks no merged sum";
  for (const auto& r : reports) {
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->iterations_verified, 6);
    ASSERT_EQ(r->allreduce_fit.size(), 2u);
    bool link1 = false;
    for (const TraceSpan& s : r->trace) link1 |= s.track == 2;
    EXPECT_TRUE(link1) << "no collective ran on the second link";
    EXPECT_EQ(r->notes, reports[0]->notes) << "worker " << r->worker_id << " decided differently";
  }
}

// A real model's side of delayed updates (as the PyTorch Session is): gradients written
// at each backward, merged sums in buffers of its own per range of iterations, and the
// updates handed over, each checked exactly against the sum over its workers and
// iterations when it is ready.
class DelayedSource final : public TensorSource, public DelayedUpdateTarget {
 public:
  DelayedSource(const Profile& p, int worker, int workers)
      : layout_(p), worker_(worker), workers_(workers) {
    std::size_t at = 0;
    for (const TensorInfo& t : layout_.tensors()) {
      base_.push_back(at);
      at += static_cast<std::size_t>(t.bytes / 4);
    }
    total_ = at;
    gradients_.assign(at, 0.0f);
  }
  static float value(int w, std::int64_t it, TensorId t, std::size_t i) {
    return static_cast<float>(((7 * w + 3 * it + 5 * t) & 255) +
                              static_cast<std::int64_t>(i & 255));
  }
  std::vector<TensorBuffer> tensors() override {
    std::vector<TensorBuffer> out;
    for (const TensorInfo& t : layout_.tensors()) {
      float* g = gradients_.data() + base_[static_cast<std::size_t>(t.id)];
      out.push_back(TensorBuffer{t.id, g, g, t.bytes / 4, static_cast<int>(t.id)});
    }
    return out;
  }
  void on_backward(int layer, std::int64_t it) override {
    for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
      for (std::int64_t i = 0; i < layout_.tensor(t).bytes / 4; ++i) {
        gradients_[base_[static_cast<std::size_t>(t)] + static_cast<std::size_t>(i)] =
            value(worker_, it, t, static_cast<std::size_t>(i));
      }
    }
  }
  DelayedUpdateTarget* delayed_updates() override { return this; }
  float* merged_sum(TensorId t, std::int64_t first, std::int64_t last) override {
    std::lock_guard lock(mu_);
    auto& m = merged_[{first, last}];
    if (m.empty()) m.assign(total_, -1.0f);
    return m.data() + base_[static_cast<std::size_t>(t)];
  }
  Status on_updates(std::int64_t before, const std::vector<LayerUpdate>& due) override {
    if (before < last_before_) return internal_error("on_updates: before went back");
    last_before_ = before;
    for (const LayerUpdate& u : due) {
      log.push_back({before, u.layer, u.first, u.last, u.ready});
      if (u.ready) QS_RETURN_IF_ERROR(check(u));
    }
    return Status::ok();
  }
  Status on_update_ready(const LayerUpdate& u) override {
    ++late_ready;
    return check(u);
  }
  struct Entry {
    std::int64_t before;
    int layer;
    std::int64_t first, last;
    bool ready;
    bool operator==(const Entry&) const = default;
  };
  std::vector<Entry> log;
  int late_ready = 0;
  std::map<std::pair<int, std::int64_t>, int> applied;  // (layer, iteration) -> times

 private:
  Status check(const LayerUpdate& u) {
    std::lock_guard lock(mu_);
    const auto& m = merged_[{u.first, u.last}];
    for (TensorId t = layout_.first_tensor(u.layer); t < layout_.end_tensor(u.layer); ++t) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(layout_.tensor(t).bytes / 4); ++i) {
        float want = 0;
        for (int w = 0; w < workers_; ++w) {
          for (std::int64_t it = u.first; it <= u.last; ++it) want += value(w, it, t, i);
        }
        const float got = m[base_[static_cast<std::size_t>(t)] + i];
        if (got != want) {
          return internal_error("layer " + std::to_string(u.layer) + " iterations " +
                                std::to_string(u.first) + ".." + std::to_string(u.last) +
                                " tensor " + std::to_string(t) + "[" + std::to_string(i) +
                                "]: " + std::to_string(got) + ", want " + std::to_string(want));
        }
      }
    }
    for (std::int64_t it = u.first; it <= u.last; ++it) ++applied[{u.layer, it}];
    return Status::ok();
  }
  TensorLayout layout_;
  int worker_, workers_;
  std::vector<std::size_t> base_;
  std::size_t total_ = 0;
  std::vector<float> gradients_;
  std::mutex mu_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<float>> merged_;
  std::int64_t last_before_ = 0;
};

// Delayed updates handed to a real model's source (the PyTorch path, here with emulated
// compute): every worker is handed the same updates at the same points; each update's
// merged sums are exact; every iteration of every layer is applied exactly once; an update
// handed over before its sums were in is one of the iteration just computed, due before
// the next forward pass.
struct Handed {
  int updates = 0, merged = 0, early = 0;
};

Handed delayed_job(const Profile& profile, double capacity_scale, Bytes partition = 26'000'000) {
  const int workers = 2, iterations = 8;
  std::vector<std::unique_ptr<DelayedSource>> sources;
  std::vector<TensorSource*> views;
  for (int w = 0; w < workers; ++w) {
    sources.push_back(std::make_unique<DelayedSource>(profile, w, workers));
    views.push_back(sources.back().get());
  }
  PolicyOptions knobs;
  knobs.deft_capacity_scale = capacity_scale;
  knobs.deft_partition_size = partition;
  for (const auto& r : run_job("deft", workers, iterations, 1, knobs, profile, {}, views)) {
    EXPECT_TRUE(r.is_ok()) << r.status().message();
  }
  const auto& log = sources[0]->log;
  EXPECT_FALSE(log.empty());
  int merged = 0, early = 0;
  for (const auto& e : log) {
    merged += e.last > e.first;
    if (!e.ready) {
      ++early;
      EXPECT_EQ(e.before, e.last + 1) << "layer " << e.layer;
    } else {
      EXPECT_GE(e.before, e.last + 1) << "layer " << e.layer;
    }
  }
  for (int w = 0; w < workers; ++w) {
    const DelayedSource& s = *sources[static_cast<std::size_t>(w)];
    EXPECT_EQ(s.log, log) << "worker " << w << " was handed other updates";
    EXPECT_EQ(s.late_ready, early) << "worker " << w;
    for (int l = 0; l < profile.num_layers(); ++l) {
      for (int it = 0; it < iterations; ++it) {
        auto a = s.applied.find({l, it});
        EXPECT_TRUE(a != s.applied.end() && a->second == 1)
            << "worker " << w << " layer " << l << " iteration " << it;
      }
    }
  }
  std::printf(
      "capacity x%.1f: %zu updates handed over: %d merging iterations, %d before their sums were "
      "in\n",
      capacity_scale, log.size(), merged, early);
  return Handed{static_cast<int>(log.size()), merged, early};
}

TEST(CollectiveDeft, DelayedUpdatesAreHandedOverAtWorkerZerosPointsExactly) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  // Little compute, half the knapsacks and 64 KiB buckets: DeFT merges iterations.
  const Handed merging = delayed_job(light_profile(), 0.5, 64 * kKiB);
  EXPECT_GT(merging.merged, 0) << "DeFT merged no iterations: the test checks no merged sum";
  // Tens of milliseconds of compute and large knapsacks: iterations whose every bucket was
  // issued in their backward pass, due before the next forward while their sums are on
  // the way.
  Profile heavy = small_profile();
  for (LayerSpec& l : heavy.layers) l.forward *= 10, l.backward *= 10;
  const Handed prompt = delayed_job(heavy, 8.0);
  EXPECT_GT(prompt.early, 0)
      << "no update was handed over before its sums: the test checks no wait";
}

// A replica ahead of worker 0 waits for it before another iteration. Worker 0
// computes 4 times slower here; before, worker 1's replica let it start backward after
// backward (its copy of worker 0's gate was behind its own progress), staging a copy of
// its gradients each time: it held 23 iterations at once in a run of 30, worker 0 1-2 (a
// soak grew a replica to 421 MB so). Now both hold 2.
TEST(CollectiveDeft, AReplicaAheadOfWorkerZeroStagesNoMoreThanWorkerZero) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  auto reports = run_job("deft", 2, 30, 1, {}, small_profile(), {4.0, 1.0});
  for (const auto& r : reports) ASSERT_TRUE(r.is_ok()) << r.status().message();
  std::printf("[ detail ] most staging buffers at once: worker 0 %lld, worker 1 %lld\n",
              static_cast<long long>(reports[0]->staging_buffers_max),
              static_cast<long long>(reports[1]->staging_buffers_max));
  EXPECT_EQ(reports[1]->iterations_verified, 30);
  EXPECT_GT(reports[0]->staging_buffers_max, 0);
  EXPECT_LE(reports[1]->staging_buffers_max, reports[0]->staging_buffers_max + 2);
}

// Staging holds a running sum per range of iterations, not a copy of each iteration: with
// little compute and a tenth of the knapsacks DeFT merges many iterations per update, and
// the workers hold a few buffers of the model's size, exactly summed (before: one per
// iteration of the longest range still being reduced; a VGG-11 run from PyTorch ran out
// of memory so).
TEST(CollectiveDeft, StagingHoldsAFewBuffersHoweverManyIterationsAnUpdateMerges) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  PolicyOptions knobs;
  knobs.deft_partition_size = 64 * kKiB;
  knobs.deft_capacity_scale = 0.1;
  const int iterations = 40;
  auto reports = run_job("deft", 2, iterations, 1, knobs, light_profile());
  std::int64_t longest = 1;
  for (const std::string& n : reports[0].is_ok() ? reports[0]->notes : std::vector<std::string>{}) {
    const std::string key = "effective batch sizes: ";  // "... sizes: 1B 3B 7B ..."
    const std::size_t from = n.find(key);
    if (from == std::string::npos) continue;
    std::istringstream sizes(n.substr(from + key.size()));
    for (std::string word; sizes >> word;) {
      if (word != "...") longest = std::max<std::int64_t>(longest, std::stoll(word));
    }
  }
  for (const auto& r : reports) {
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->iterations_verified, iterations) << "worker " << r->worker_id;
    std::printf(
        "[ detail ] worker %d: at most %lld staging buffers; the longest update merged %lld "
        "iterations\n",
        r->worker_id, static_cast<long long>(r->staging_buffers_max),
        static_cast<long long>(longest));
    EXPECT_LE(r->staging_buffers_max, 4) << "worker " << r->worker_id;
  }
  EXPECT_GE(longest, 6)
      << "DeFT merged few iterations: the test does not tell a copy per iteration from a sum";
}

// ---- every all-reduce message checked (checked_allreduce.h; docs/reliability.md) ----

#ifdef QS_HAVE_GLOO
// N ranks as threads over loopback, their contexts met through an in-memory store (as
// gloo's own tests do).
std::vector<std::shared_ptr<gloo::Context>> connect_ranks(int n,
                                                          std::chrono::milliseconds timeout) {
  ignore_sigpipe();  // as the runtime does: a rank writing to one that failed gets EPIPE
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::Context>> out(static_cast<std::size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) {
    t.emplace_back([&, r] {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(r, n);
      ctx->setTimeout(timeout);
      auto dev = gloo::transport::tcp::CreateDevice("127.0.0.1");
      ctx->connectFullMesh(store, dev);
      out[static_cast<std::size_t>(r)] = ctx;
    });
  }
  for (auto& th : t) th.join();
  return out;
}

// Small integers: every float sum is exact.
float element(int rank, std::size_t i) {
  return static_cast<float>((7 * rank + static_cast<int>(i % 251)) % 256);
}

struct Outcome {
  std::vector<std::vector<float>> data;  // per rank, after the collective
  std::vector<std::string> error;        // per rank ("" when it succeeded)
  std::vector<int> peer;                 // per rank: PeerError::peer(), or -1
};

// One checked all-reduce of `elements` floats on `n` ranks. `tamper(rank)`: that rank's
// hook on received messages; `absent`: a rank that never takes part.
Outcome run_checked(
    int n, GlooAlgorithm algo, std::size_t elements, bool checksums,
    const std::function<std::function<void(int, std::byte*, std::size_t)>(int)>& tamper = {},
    int absent = -1, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto ctx = connect_ranks(n, timeout);
  Outcome o;
  o.data.resize(static_cast<std::size_t>(n));
  o.error.resize(static_cast<std::size_t>(n));
  o.peer.assign(static_cast<std::size_t>(n), -1);
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) {
    auto& d = o.data[static_cast<std::size_t>(r)];
    d.resize(elements);
    for (std::size_t i = 0; i < elements; ++i) d[i] = element(r, i);
    if (r == absent) continue;
    t.emplace_back([&, r] {
      CheckedAllreduceOptions opt;
      opt.context = ctx[static_cast<std::size_t>(r)];
      opt.algorithm = algo;
      opt.checksums = checksums;
      opt.segment_bytes = 4096;  // many segments per rank: the ring's pipeline
      if (tamper) opt.tamper = tamper(r);
      try {
        checked_allreduce(opt, o.data[static_cast<std::size_t>(r)].data(), elements, sizeof(float),
                          static_cast<ReduceFn>(&gloo::sum<float>));
      } catch (const PeerError& e) {
        o.error[static_cast<std::size_t>(r)] = e.what();
        o.peer[static_cast<std::size_t>(r)] = e.peer();
      } catch (const std::exception& e) {
        o.error[static_cast<std::size_t>(r)] = std::string("(not a PeerError) ") + e.what();
      }
    });
  }
  for (auto& th : t) th.join();
  return o;
}

// The first element of `d` that is not the sum over n ranks, or -1.
std::ptrdiff_t first_wrong(const std::vector<float>& d, int n) {
  for (std::size_t i = 0; i < d.size(); ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += element(r, i);
    if (d[i] != want) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

// The ring (also ring-chunked's) and bcube (also halving-doubling's) sum exactly, with
// and without checksums, on 2 to 5 ranks and sizes that leave segments, chunks and
// groups empty or uneven.
TEST(CheckedAllreduce, SumsExactlyWithAndWithoutChecksums) {
  for (GlooAlgorithm algo : {GlooAlgorithm::kRing, GlooAlgorithm::kBcube}) {
    for (int n : {2, 3, 4, 5}) {
      for (std::size_t elements :
           {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{30'001}}) {
        for (bool checksums : {true, false}) {
          const Outcome o = run_checked(n, algo, elements, checksums);
          for (int r = 0; r < n; ++r) {
            EXPECT_EQ(o.error[static_cast<std::size_t>(r)], "");
            EXPECT_EQ(first_wrong(o.data[static_cast<std::size_t>(r)], n), -1)
                << gloo_algorithm_name(algo) << " n " << n << " elements " << elements << " rank "
                << r;
          }
        }
      }
    }
  }
}

// Flips one bit of the `nth` message (counting from 0) that rank `at` receives from rank
// `from`.
std::function<std::function<void(int, std::byte*, std::size_t)>(int)> flip(int at, int from,
                                                                           int nth) {
  auto count = std::make_shared<int>(0);
  return [=](int rank) -> std::function<void(int, std::byte*, std::size_t)> {
    if (rank != at) return {};
    return [=](int sender, std::byte* p, std::size_t n) {
      if (sender == from && n > 0 && (*count)++ == nth) p[n / 2] ^= std::byte{0x10};
    };
  };
}

// A bit flipped in one message (as tools/faultproxy.py flips one above TCP) is caught by
// its receiver, which names the sender and sums none of it; every other rank ends too
// (naming the peer it lost), so nobody is left with a result. In the reduce-scatter (the
// ring's 3rd message, bcube's 1st) and in the all-gather (the ring's 10th of 12 with
// 3 ranks and 4 KiB segments; bcube's 3rd of 4 ranks: the last step).
TEST(CheckedAllreduce, ACorruptedMessageIsCaughtNamingItsSender) {
  struct Case {
    GlooAlgorithm algo;
    int n, at, from, nth;
  };
  const std::size_t elements = 12 * 1024;  // 48 KiB: 4 KiB segments, 4 per rank on 3 ranks
  for (const Case& c :
       {Case{GlooAlgorithm::kRing, 3, 1, 2, 2}, Case{GlooAlgorithm::kRing, 3, 1, 2, 9},
        Case{GlooAlgorithm::kBcube, 4, 2, 3, 0}, Case{GlooAlgorithm::kBcube, 4, 2, 0, 0}}) {
    const Outcome o = run_checked(c.n, c.algo, elements, true, flip(c.at, c.from, c.nth), -1,
                                  std::chrono::seconds(1));
    const std::string& caught = o.error[static_cast<std::size_t>(c.at)];
    EXPECT_NE(caught.find("corrupted data from rank " + std::to_string(c.from) + ": a "),
              std::string::npos)
        << gloo_algorithm_name(c.algo) << ": " << caught;
    EXPECT_NE(caught.find("failed its CRC32C check"), std::string::npos) << caught;
    EXPECT_EQ(o.peer[static_cast<std::size_t>(c.at)], c.from);
    for (int r = 0; r < c.n; ++r) {
      EXPECT_NE(o.error[static_cast<std::size_t>(r)], "")
          << "rank " << r << " finished with a result";
      EXPECT_EQ(o.error[static_cast<std::size_t>(r)].find("(not a PeerError)"), std::string::npos)
          << o.error[static_cast<std::size_t>(r)];
    }
  }
}

// The same flip without checksums is summed: a wrong result on every rank, which no
// comparison between ranks would reveal. What the checksums are for.
TEST(CheckedAllreduce, WithoutChecksumsTheSameFlipIsAWrongSumOnEveryRank) {
  const Outcome o = run_checked(3, GlooAlgorithm::kRing, 12 * 1024, false, flip(1, 2, 2));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(o.error[static_cast<std::size_t>(r)], "");
    EXPECT_NE(first_wrong(o.data[static_cast<std::size_t>(r)], 3), -1) << "rank " << r;
    EXPECT_EQ(o.data[static_cast<std::size_t>(r)], o.data[0]) << "the ranks' results differ";
  }
}

// A rank that never comes: the ranks that wait on it name it, with the timeout; on
// halving-doubling's 4 ranks, its partners of both steps (2, then 1).
TEST(CheckedAllreduce, ATimeoutNamesThePeerWaitedOn) {
  for (GlooAlgorithm algo : {GlooAlgorithm::kBcube, GlooAlgorithm::kRing}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = run_checked(4, algo, 4096, true, {}, 3, std::chrono::milliseconds(500));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    for (int r = 0; r < 3; ++r) EXPECT_NE(o.error[static_cast<std::size_t>(r)], "") << "rank " << r;
    // bcube: 2 exchanges with 3 first; the ring: 2 receives from 3 (its successor).
    EXPECT_EQ(o.peer[2], 3) << o.error[2];
    if (algo == GlooAlgorithm::kBcube) {
      EXPECT_EQ(o.peer[1], 3) << o.error[1];  // its partner of step 2
    }
    EXPECT_NE(o.error[2].find("lost rank 3 (nothing from it for 500ms, in the reduce-scatter): "),
              std::string::npos)
        << o.error[2];
    EXPECT_NE(o.error[2].find("Timed out waiting 500ms for recv"), std::string::npos) << o.error[2];
    for (int r = 0; r < 3; ++r)
      std::printf("[ detail ] %s rank %d: %s\n", std::string(gloo_algorithm_name(algo)).c_str(), r,
                  o.error[static_cast<std::size_t>(r)].c_str());
  }
}
#endif

// Workers that disagree on checksums (one with --no-checksum) would take a peer's checksum
// messages for data: every one refuses at start, naming the setting.
TEST(CollectiveChecksums, WorkersThatDisagreeOnChecksumsFailAtStart) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  auto reports = run_job("wfbp", 2, 3, 1, {}, small_profile(), {}, {}, [](CollectiveOptions& o) {
    o.job.peer_timeout = 2 * kNsPerSec;
    if (o.rank == 1) o.job.payload_checksums = false;
  });
  for (const auto& r : reports) {
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("disagree on checksums (some run with --no-checksum)"),
              std::string::npos)
        << r.status().message();
  }
}

// Compression on the all-reduce engine (issue 29 item 3): the ring or bcube on 2-byte
// elements, partial sums added in float32 and rounded at each hop; every pulled element
// checked: with 2 workers exactly as rounded (each gradient once, the sum once), with
// more within the bound of a rounding per hop; every worker's sums the same (the check
// runs on each). DeFT: iterations merged locally, then compressed.
TEST(CollectiveCompression, EveryWorkerGetsTheRoundedSums) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  struct Case {
    const char* policy;
    int workers, links;
    transport::WireDType wire;
  };
  for (const Case& c : {Case{"mgwfbp", 2, 1, transport::WireDType::kBFloat16},
                        Case{"wfbp", 3, 1, transport::WireDType::kFloat16},
                        Case{"bytescheduler", 4, 1, transport::WireDType::kBFloat16},
                        Case{"deft", 2, 2, transport::WireDType::kBFloat16}}) {
    const int iterations = 4;
    auto reports = run_job(c.policy, c.workers, iterations, c.links, {},
                           std::string(c.policy) == "deft" ? light_profile() : small_profile(), {},
                           {}, [&c](CollectiveOptions& o) { o.job.wire_dtype = c.wire; });
    for (const auto& r : reports) {
      ASSERT_TRUE(r.is_ok()) << c.policy << ": " << r.status().message();
      EXPECT_EQ(r->iterations_verified, iterations) << c.policy << " worker " << r->worker_id;
    }
  }
}

TEST(CollectiveCompression, WorkersThatDisagreeFailAtStart) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  auto reports = run_job("wfbp", 2, 3, 1, {}, small_profile(), {}, {}, [](CollectiveOptions& o) {
    o.job.peer_timeout = 2 * kNsPerSec;
    if (o.rank == 1) o.job.wire_dtype = transport::WireDType::kBFloat16;
  });
  for (const auto& r : reports) {
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("disagree on compression"), std::string::npos)
        << r.status().message();
  }
}

// A real model's buffers (as the PyTorch Session's: the sums reduced in place in the
// gradients), each layer's sums checked exactly when the worker hands them over.
class InPlaceSource final : public TensorSource {
 public:
  InPlaceSource(const Profile& p, int worker, int workers)
      : layout_(p), worker_(worker), workers_(workers) {
    for (const TensorInfo& t : layout_.tensors())
      data_.emplace_back(static_cast<std::size_t>(t.bytes / 4));
  }
  static float value(int w, std::int64_t it, TensorId t, std::size_t i) {
    return static_cast<float>(((7 * w + 3 * it + 5 * t) & 255) +
                              static_cast<std::int64_t>(i & 255));
  }
  std::vector<TensorBuffer> tensors() override {
    std::vector<TensorBuffer> out;
    for (const TensorInfo& t : layout_.tensors()) {
      float* g = data_[static_cast<std::size_t>(t.id)].data();
      out.push_back(TensorBuffer{t.id, g, g, t.bytes / 4, static_cast<int>(t.id)});
    }
    return out;
  }
  void on_backward(int layer, std::int64_t it) override {
    for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
      auto& d = data_[static_cast<std::size_t>(t)];
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = value(worker_, it, t, i);
    }
  }
  Status on_layer_ready(int layer, std::int64_t it) override {
    for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
      const auto& d = data_[static_cast<std::size_t>(t)];
      for (std::size_t i = 0; i < d.size(); ++i) {
        float want = 0;
        for (int w = 0; w < workers_; ++w) want += value(w, it, t, i);
        if (d[i] != want) ++wrong;
      }
    }
    ++applied;
    return Status::ok();
  }
  std::atomic<int> applied{0}, wrong{0};

 private:
  TensorLayout layout_;
  int worker_, workers_;
  std::vector<std::vector<float>> data_;
};

// Real gradients (no known content to check): a bit flipped in a gradient message that
// worker 1 receives from worker 2 in iteration 2 or so fails worker 1 naming worker 2,
// and no update of a wrong sum is ever handed over; every worker ends.
TEST(CollectiveChecksums,
     ACorruptedGradientMessageFailsTheJobNamingItsSenderAndNothingWrongIsApplied) {
  if (!have_gloo()) GTEST_SKIP() << "built without gloo";
  const int workers = 3, iterations = 30;
  std::vector<std::unique_ptr<InPlaceSource>> sources;
  std::vector<TensorSource*> views;
  for (int w = 0; w < workers; ++w) {
    sources.push_back(std::make_unique<InPlaceSource>(small_profile(), w, workers));
    views.push_back(sources.back().get());
  }
  auto received = std::make_shared<std::atomic<int>>(0);
  auto reports = run_job(
      "wfbp", workers, iterations, 1, {}, small_profile(), {}, views, [&](CollectiveOptions& o) {
        o.job.peer_timeout = 2 * kNsPerSec;
        o.verify = false;
        if (o.rank != 1) return;
        o.tamper_received = [received](int, int from, std::byte* p, std::size_t n) {
          if (from == 2 && n > 0 && received->fetch_add(1) == 40)
            p[n / 3] ^= std::byte{0x01};  // 41st: iteration 2 or so
        };
      });
  ASSERT_FALSE(reports[1].is_ok());
  EXPECT_NE(reports[1].status().message().find("corrupted data from worker 2: a "),
            std::string::npos)
      << reports[1].status().message();
  for (int w = 0; w < workers; ++w) {
    const auto& r = reports[static_cast<std::size_t>(w)];
    EXPECT_FALSE(r.is_ok()) << "worker " << w << " finished";
    if (!r.is_ok()) std::printf("[ detail ] worker %d: %s\n", w, r.status().message().c_str());
    EXPECT_EQ(sources[static_cast<std::size_t>(w)]->wrong.load(), 0)
        << "worker " << w << " was handed a wrong sum";
    EXPECT_LT(sources[static_cast<std::size_t>(w)]->applied.load(),
              iterations * small_profile().num_layers());
  }
}

}  // namespace
}  // namespace qs::runtime
