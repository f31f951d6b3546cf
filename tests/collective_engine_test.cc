// The all-reduce runtime on a second engine (tests/inprocess_communicator.h): the worker
// and its units know only the Communicator interface, so the same policies, agreement,
// replica, staging and known-content checks run unchanged on an engine that is one class.
#include <gtest/gtest.h>

#include <future>

#include "inprocess_communicator.h"
#include "quicksilver/runtime/collective.h"
#include "test_profiles.h"

namespace qs::runtime {
namespace {

Profile small_profile() {
  Profile p;
  p.name = "small";
  p.batch_size = 8;
  p.layers = {qs::testing::layer("c1", 500'000, 1'000'000, 80'000),
              qs::testing::layer("c2", 500'000, 1'000'000, 400'000),
              qs::testing::layer("f1", 200'000, 400'000, 800'000),
              qs::testing::layer("f2", 100'000, 200'000, 20'000)};
  return p;
}

std::vector<Result<WorkerReport>> run_in_process(
    const std::string& policy, int workers, int iterations, int links,
    transport::WireDType wire = transport::WireDType::kFloat32) {
  testing::InProcessWorld world(workers, links);
  std::vector<std::future<Result<WorkerReport>>> running;
  for (int w = 0; w < workers; ++w) {
    CollectiveOptions o;
    o.job.profile = small_profile();
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
    running.push_back(std::async(std::launch::async, [o] { return run_collective_worker(o); }));
  }
  std::vector<Result<WorkerReport>> out;
  for (auto& r : running) out.push_back(r.get());
  return out;
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
  o.job.profile = small_profile();
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

}  // namespace
}  // namespace qs::runtime
