// The all-reduce runtime on a second engine (tests/inprocess_communicator.h): the worker
// and its units know only the Communicator interface, so the same policies, agreement,
// replica, staging and known-content checks run unchanged on an engine that is one class.
#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "inprocess_communicator.h"
#include "quicksilver/runtime/collective.h"
#include "runtime/collective/agreement.h"
#include "runtime/collective/policy_replica.h"
#include "test_profiles.h"

namespace qs::runtime {
namespace {

Profile engine_profile() {
  Profile p;
  p.name = "small";
  p.batch_size = 8;
  p.layers = {qs::testing::layer("c1", 500'000, 1'000'000, 80'000),
              qs::testing::layer("c2", 500'000, 1'000'000, 400'000),
              qs::testing::layer("f1", 200'000, 400'000, 800'000),
              qs::testing::layer("f2", 100'000, 200'000, 20'000)};
  return p;
}

std::vector<Result<WorkerReport>> run_in_world(
    testing::InProcessWorld& world, const std::string& policy, int workers, int iterations,
    int links, transport::WireDType wire = transport::WireDType::kFloat32,
    const std::function<void(CollectiveOptions&)>& adjust = {}) {
  std::vector<std::future<Result<WorkerReport>>> running;
  for (int w = 0; w < workers; ++w) {
    CollectiveOptions o;
    o.job.profile = engine_profile();
    o.job.policy = policy;
    o.job.workers = workers;
    o.job.iterations = iterations;
    o.job.bandwidth = Rate::gbps(1);
    o.job.peer_timeout = 20 * kNsPerSec;
    o.job.wire_dtype = wire;
    o.rank = w;
    o.links = std::vector<std::string>(static_cast<std::size_t>(links), "in-process");
    o.calibration_repeats = 2;
    o.communicator = [&world, w]() -> Result<std::unique_ptr<Communicator>> {
      return world.communicator(w);
    };
    if (adjust) adjust(o);
    running.push_back(std::async(std::launch::async, [o] { return run_collective_worker(o); }));
  }
  std::vector<Result<WorkerReport>> out;
  for (auto& r : running) out.push_back(r.get());
  return out;
}

std::vector<Result<WorkerReport>> run_in_process(
    const std::string& policy, int workers, int iterations, int links,
    transport::WireDType wire = transport::WireDType::kFloat32) {
  testing::InProcessWorld world(workers, links);
  return run_in_world(world, policy, workers, iterations, links, wire);
}

class OnAnotherEngine : public ::testing::TestWithParam<std::string> {};

// Every sum checked exactly on every worker (known content), the workers' fits equal.
TEST_P(OnAnotherEngine, EveryPolicyReducesEveryElementExactly) {
  const int iterations = 4;
  const int links = GetParam() == "deft" ? 2 : 1;
  auto reports = run_in_process(GetParam(), 3, iterations, links);
  for (const auto& r : reports) {
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->iterations_verified, iterations) << "worker " << r->worker_id;
    ASSERT_EQ(r->allreduce_fit.size(), static_cast<std::size_t>(links));
    EXPECT_EQ(r->allreduce_fit[0].a, reports[0]->allreduce_fit[0].a);
    EXPECT_EQ(r->allreduce_fit[0].b_ns_per_byte, reports[0]->allreduce_fit[0].b_ns_per_byte);
  }
}

INSTANTIATE_TEST_SUITE_P(InProcess, OnAnotherEngine,
                         ::testing::Values("wfbp", "mgwfbp", "ddp", "bytescheduler", "deft"));

// Compression runs through the engine's 2-byte reductions: with two workers the sums are
// exactly the rounded gradients added and rounded (the known-content check).
TEST(OnAnotherEngineCompression, Bf16SumsAreTheRoundedSums) {
  auto reports = run_in_process("mgwfbp", 2, 3, 1, transport::WireDType::kBFloat16);
  for (const auto& r : reports) {
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->iterations_verified, 3);
  }
}

// An engine whose shape is not the job's is refused, naming it, before anything runs.
TEST(OnAnotherEngineShape, AnEngineWithOtherLinksIsRefused) {
  testing::InProcessWorld world(1, 2);
  CollectiveOptions o;
  o.job.profile = engine_profile();
  o.job.policy = "wfbp";
  o.job.workers = 1;
  o.job.iterations = 1;
  o.communicator = [&world]() -> Result<std::unique_ptr<Communicator>> {
    return world.communicator(0);
  };
  auto r = run_collective_worker(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("differ from the job's"), std::string::npos)
      << r.status().message();
}

// Worker 0's policy inputs reach every other worker in order, each batch on the wire as
// long as its records: the control channel shares the hosts' links with the gradients
// (a batch of one record was the whole 4.6 KB buffer).
TEST(ReplicationChannel, ABatchCarriesOnlyItsRecords) {
  constexpr int kWorkers = 3, kRecords = 150;
  testing::InProcessWorld world(kWorkers, 1);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int w = 0; w < kWorkers; ++w) comms.push_back(world.communicator(w));
  std::mutex mu;
  std::vector<std::vector<PolicyRecord>> got(kWorkers);
  std::vector<std::promise<void>> ended(kWorkers);
  std::vector<std::unique_ptr<ReplicationChannel>> channels;
  for (int w = 0; w < kWorkers; ++w) {
    channels.push_back(std::make_unique<ReplicationChannel>(
        *comms[static_cast<std::size_t>(w)], true, 20 * kNsPerSec,
        [&, w](std::vector<PolicyRecord> batch) {
          std::lock_guard lock(mu);
          for (const PolicyRecord& r : batch) {
            got[static_cast<std::size_t>(w)].push_back(r);
            if (r.kind == kEndOfStream) ended[static_cast<std::size_t>(w)].set_value();
          }
        },
        [](const Status& s) { ADD_FAILURE() << s.message(); }));
  }
  for (auto& c : channels) c->start();
  for (int i = 0; i < kRecords; ++i) {
    PolicyRecord r{i % 3 == 0 ? kIterationStart : kGradientReady, i % 7, i / 3, 1000 * i, 0};
    channels[0]->record(r);
    if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  channels[0]->end_stream();
  for (int w = 1; w < kWorkers; ++w) {
    ASSERT_EQ(ended[static_cast<std::size_t>(w)].get_future().wait_for(std::chrono::seconds(20)),
              std::future_status::ready);
  }
  for (auto& c : channels) c->stop();
  for (int w = 1; w < kWorkers; ++w) {
    const auto& g = got[static_cast<std::size_t>(w)];
    ASSERT_EQ(g.size(), kRecords + 1u);
    for (int i = 0; i < kRecords; ++i) {
      EXPECT_EQ(g[static_cast<std::size_t>(i)].now, 1000 * i);
      EXPECT_EQ(g[static_cast<std::size_t>(i)].layer, i % 7);
    }
    EXPECT_EQ(g.back().kind, kEndOfStream);
  }
  // Every message a header and whole records, which add up to what was recorded.
  std::size_t records = 0, messages = 0;
  for (const auto& [slot, bytes] : world.sent()) {
    if (slot != kReplicaSlot) continue;
    ++messages;
    ASSERT_GE(bytes, batch_bytes(1));
    ASSERT_LE(bytes, sizeof(RecordBatch));
    ASSERT_EQ((bytes - batch_bytes(0)) % sizeof(PolicyRecord), 0u) << bytes;
    records += (bytes - batch_bytes(0)) / sizeof(PolicyRecord);
  }
  EXPECT_EQ(records, (kWorkers - 1) * (kRecords + 1u)) << messages << " messages";
}

// A batch whose count its records do not bear out (a shorter message, or a count out of
// range) is refused naming worker 0, not replayed from the last batch's leftovers.
TEST(ReplicationChannel, AMalformedBatchIsRefusedNamingWorker0) {
  for (const std::int64_t count : {std::int64_t{3}, std::int64_t{65}, std::int64_t{0}}) {
    testing::InProcessWorld world(2, 1);
    auto c0 = world.communicator(0);
    auto c1 = world.communicator(1);
    std::promise<std::string> failed;
    ReplicationChannel receiver(
        *c1, false, 20 * kNsPerSec,
        [](std::vector<PolicyRecord>) { ADD_FAILURE() << "a malformed batch was delivered"; },
        [&](const Status& s) { failed.set_value(s.message()); });
    receiver.start();
    RecordBatch b;
    b.count = count;
    for (PolicyRecord& r : b.records) r = PolicyRecord{kIterationStart, 0, 0, 0, 0};
    auto raw = c0->control_buffer(&b, sizeof b);
    // Count 3: one record sent; 65: all 64, valid, and a count past them.
    raw->send(1, kReplicaSlot, count > kBatchRecords ? sizeof b : batch_bytes(1));
    auto f = failed.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready) << count;
    const std::string m = f.get();
    EXPECT_NE(m.find("malformed data from worker 0"), std::string::npos) << m;
    receiver.stop();
  }
}

// Worker 0 ends its loop after 2 iterations, worker 1 trains on: worker 1 fails (worker
// 0's decisions end before its loop), and its connections close as it fails, so worker 0,
// waiting for it in the final barrier, fails at once naming it. Before, worker 0 waited
// for its peer timeout when worker 1's session outlived its failure (a Python traceback
// holding it): minutes, with the whole job hung.
TEST(OnAnotherEngineFailure, AFailedWorkerReleasesThePeersWaitingOnIt) {
  testing::InProcessWorld world(2, 1, 600 * kNsPerSec);
  const auto r = run_in_world(world, "mgwfbp", 2, 5, 1, transport::WireDType::kFloat32,
                              [](CollectiveOptions& o) {
                                o.job.peer_timeout = 600 * kNsPerSec;
                                if (o.rank == 0) o.job.iterations = 2;
                              });
  ASSERT_FALSE(r[1].is_ok());
  EXPECT_NE(r[1].status().message().find("every worker must train the same number of iterations"),
            std::string::npos)
      << r[1].status().message();
  ASSERT_FALSE(r[0].is_ok());
  EXPECT_NE(r[0].status().message().find("worker 1 closed its connections"), std::string::npos)
      << r[0].status().message();
}

CollectiveBucket bucket_of(std::int64_t iteration, TensorId tensor) {
  CollectiveBucket b;
  b.chunks = {Chunk{tensor, 0, 4096}};
  b.first_iteration = b.last_iteration = iteration;
  return b;
}

// A policy whose buckets the job fixes (mgwfbp here) runs in each worker's own order:
// worker 0 runs its bucket without a report from worker 1, and worker 1 runs its own
// without a decision from worker 0, once worker 0 began that iteration (its stream).
TEST(AgreementInOwnOrder, EachWorkerRunsItsOwnBucketsOnceWorker0BeganTheIteration) {
  testing::InProcessWorld world(2, 1);
  auto c0 = world.communicator(0);
  auto c1 = world.communicator(1);
  auto no_failure = [](const Status& s) { ADD_FAILURE() << s.message(); };
  BucketAgreement a0(*c0, false, 20 * kNsPerSec, no_failure, true);
  BucketAgreement a1(*c1, false, 20 * kNsPerSec, no_failure, true);
  a0.start();
  a1.start();
  a0.issued(bucket_of(0, 0));
  auto led = std::async(std::launch::async, [&] { return a0.next(0); });
  ASSERT_EQ(led.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(bucket_key(*led.get()), bucket_key(bucket_of(0, 0)));

  a1.issued(bucket_of(0, 0));
  auto followed = std::async(std::launch::async, [&] { return a1.next(0); });
  EXPECT_EQ(followed.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "worker 1 ran a bucket of an iteration worker 0 had not begun";
  a1.leader_started(0);
  ASSERT_EQ(followed.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(bucket_key(*followed.get()), bucket_key(bucket_of(0, 0)));
  a1.stop();
  a0.stop();
}

// Worker 1's second bucket is not worker 0's second: worker 0 fails, naming worker 1.
TEST(AgreementInOwnOrder, Worker0FailsWhenAWorkerIssuedAnotherBucket) {
  testing::InProcessWorld world(2, 1);
  auto c0 = world.communicator(0);
  auto c1 = world.communicator(1);
  std::promise<std::string> failed;
  BucketAgreement a0(
      *c0, false, 20 * kNsPerSec, [&](const Status& s) { failed.set_value(s.message()); }, true);
  BucketAgreement a1(
      *c1, false, 20 * kNsPerSec, [](const Status& s) { ADD_FAILURE() << s.message(); }, true);
  a0.start();
  a1.start();
  auto f = failed.get_future();
  a0.issued(bucket_of(0, 0));
  a1.issued(bucket_of(0, 0));
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the same bucket was taken for another";
  a1.issued(bucket_of(0, 1));  // worker 1 ahead: matched when worker 0 issues its second
  a0.issued(bucket_of(0, 2));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::string m = f.get();
  EXPECT_NE(m.find("worker 1's bucket 2 on link 0 is not worker 0's"), std::string::npos) << m;
  a1.stop();
  a0.stop();
}

}  // namespace
}  // namespace qs::runtime
