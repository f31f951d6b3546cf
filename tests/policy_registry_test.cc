// The policy registry: a policy added from outside the library (this file) runs in the
// simulator and in the runtime; the knob table drives the flags, the hash, the children's
// arguments, the scaling and the docs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <sstream>

#include "quicksilver/launch/job_message.h"
#include "quicksilver/launch/launcher.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

// ---- the worked example of docs/architecture.md ("Adding a policy"): one class, one registration
// ----

// largest-first: holds a backward pass's gradients until the last layer's is ready, then
// sends the largest units first (a toy: it ignores urgency entirely).
class LargestFirst final : public PsPolicy {
 public:
  explicit LargestFirst(const PsContext& ctx) : ctx_(ctx) {}
  std::string_view name() const override { return "largest-first"; }
  QueueDiscipline discipline() const override { return QueueDiscipline::kFifo; }
  bool wants_acks() const override { return false; }
  void on_gradient_ready(int layer, TimeNs, PushSink& out) override {
    for (TensorId t = ctx_.layout->first_tensor(layer); t < ctx_.layout->end_tensor(layer); ++t) {
      for (const Slice& s : ctx_.placement->slices(t))
        held_.push_back(PushUnit{s.chunk, s.server, t});
    }
    if (layer != 0) return;  // backward runs from the last layer to layer 0
    std::stable_sort(held_.begin(), held_.end(), [](const PushUnit& a, const PushUnit& b) {
      return a.chunk.length > b.chunk.length;
    });
    for (const PushUnit& u : held_) out.push(u, 0);
    held_.clear();
  }

 private:
  PsContext ctx_;
  std::vector<PushUnit> held_;
};

const bool kRegistered =
    register_policy({{.name = "largest-first",
                      .summary = "largest units first, after the whole backward pass",
                      .knobs = {"split_threshold"},
                      .make_ps = [](const PolicyOptions&,
                                    const PsContext& ctx) -> Result<std::unique_ptr<PsPolicy>> {
                        return std::unique_ptr<PsPolicy>(new LargestFirst(ctx));
                      }}})
        .is_ok();

TEST(PolicyRegistry, OutsidePolicyIsListedOnItsArchitectureOnly) {
  ASSERT_TRUE(kRegistered);
  const auto ps = ps_policy_names();
  EXPECT_EQ(ps.back(), "largest-first");
  EXPECT_TRUE(is_known_policy("largest-first"));
  const auto ar = allreduce_policy_names();
  EXPECT_EQ(std::find(ar.begin(), ar.end(), "largest-first"), ar.end());
  // Registered twice: refused, the first entry stays.
  EXPECT_FALSE(register_policy({{.name = "largest-first",
                                 .make_ps = [](const PolicyOptions&, const PsContext&)
                                     -> Result<std::unique_ptr<PsPolicy>> {
                                   return invalid_argument("never");
                                 }}})
                   .is_ok());
  // A knob nobody registered is refused.
  EXPECT_FALSE(register_policy({{.name = "other",
                                 .knobs = {"no_such_knob"},
                                 .make_ps = [](const PolicyOptions&, const PsContext& c)
                                     -> Result<std::unique_ptr<PsPolicy>> {
                                   return std::unique_ptr<PsPolicy>(new LargestFirst(c));
                                 }}})
                   .is_ok());
}

TEST(PolicyRegistry, OutsidePolicyRunsInTheSimulatorWithEveryByteOnce) {
  ASSERT_TRUE(kRegistered);
  Rng rng(7);
  for (int i = 0; i < 20; ++i) {
    const Profile p = testing::random_profile(rng);
    ClusterConfig c;
    c.workers = 3;
    c.servers = 2;
    c.bandwidth = Rate::gbps(1);
    SimOptions o;
    o.iterations = 3;
    o.verify_bytes = true;  // each gradient byte pushed and pulled exactly once
    PolicyOptions po;
    po.split_threshold = 64 * kKiB;
    auto r = simulate(p, "largest-first", po, c, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->bytes_pushed_per_iteration, p.total_bytes());
    auto oracle = simulate(p, "oracle", po, c, o);
    ASSERT_TRUE(oracle.is_ok());
    EXPECT_GE(r->iteration_time, oracle->iteration_time);
  }
  // Through simulate(job) too, and refused on the other architecture.
  Job job;
  job.profile = testing::mercury_fig2();
  job.policies = {"largest-first", "wfbp"};
  auto rows = simulate(job);
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].result.policy, "largest-first");
  job.cluster.architecture = Architecture::kAllReduce;
  auto refused = simulate(job);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("parameter-server architecture only"));
}

TEST(PolicyRegistry, OutsidePolicyRunsInTheRuntimeWithExactSums) {
  ASSERT_TRUE(kRegistered);
  runtime::JobOptions job;
  Rng rng(3);
  job.profile = testing::random_profile(rng, 6, 50'000, 300 * kNsPerUs);
  job.policy = "largest-first";
  job.workers = 3;
  job.servers = 2;
  job.iterations = 4;
  job.policy_options.split_threshold = 64 * kKiB;
  job.connect_timeout = 10 * kNsPerSec;
  job.peer_timeout = 5 * kNsPerSec;
  std::vector<std::unique_ptr<runtime::Server>> servers;
  std::vector<runtime::Endpoint> endpoints;
  for (int s = 0; s < job.servers; ++s) {
    runtime::ServerOptions so;
    so.job = job;
    so.server_id = s;
    auto srv = runtime::Server::create(so);
    ASSERT_TRUE(srv.is_ok()) << srv.status().to_string();
    endpoints.push_back(runtime::Endpoint{"127.0.0.1", (*srv)->port()});
    servers.push_back(std::move(*srv));
  }
  std::vector<std::future<Status>> sf;
  for (auto& s : servers) sf.push_back(std::async(std::launch::async, [&s] { return s->run(); }));
  std::vector<std::future<Result<runtime::WorkerReport>>> wf;
  for (int w = 0; w < job.workers; ++w) {
    runtime::WorkerOptions wo;
    wo.job = job;
    wo.worker_id = w;
    wo.servers = endpoints;
    wf.push_back(std::async(std::launch::async, [wo] { return runtime::run_worker(wo); }));
  }
  for (auto& f : wf) {
    auto r = f.get();
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->iterations_verified, job.iterations);  // every pulled element checked
    EXPECT_EQ(r->bytes_pushed_per_iteration, job.profile.total_bytes());
  }
  for (auto& f : sf) EXPECT_TRUE(f.get().is_ok());
}

// ---- the knob table ----

TEST(KnobTable, EveryKnobParsesItsOwnFormatBack) {
  PolicyOptions changed;
  changed.packet_size = 12 * kKiB;
  changed.startup_time = 7 * kNsPerUs;
  changed.prophet_allow_overrun = true;
  changed.deft_mu = 1.23456789;
  changed.deft_exact_max_items = 5;
  // What a launcher's child gets: every knob as its exact text (Knob::format), parsed back
  // by the knob (Knob::parse) in the job message's codec.
  JobMessage m;
  m.knobs = changed;
  auto back = decode(encode(m));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(hashed_knob_text(back->knobs), hashed_knob_text(changed));
  EXPECT_EQ(back->knobs, changed);
  EXPECT_EQ(back->knobs.deft_mu, 1.23456789);
  for (const Knob* k : policy_registry().knobs()) {
    PolicyOptions again;
    ASSERT_TRUE(k->parse(k->format(changed), &again).is_ok()) << k->name;
    EXPECT_EQ(k->format(again), k->format(changed)) << k->name;
  }
}

TEST(KnobTable, HashCoversTheKnobsThatOnceDrifted) {
  const runtime::JobOptions base;
  for (const char* name :
       {"prophet_partition_size", "prophet_allow_overrun", "startup_time", "packet_size"}) {
    runtime::JobOptions other = base;
    const Knob* k = policy_registry().find_knob(name);
    ASSERT_NE(k, nullptr) << name;
    ASSERT_TRUE(k->parse(k->type == KnobType::kBool   ? "true"
                         : k->type == KnobType::kTime ? "1ms"
                                                      : "8KiB",
                         &other.policy_options)
                    .is_ok());
    EXPECT_NE(runtime::config_hash(other), runtime::config_hash(base)) << name;
  }
  EXPECT_THAT(hashed_knob_names(), ::testing::HasSubstr("prophet_allow_overrun"));
}

TEST(KnobTable, ValidationNamesTheFlag) {
  PolicyOptions o;
  const PolicyRegistry& reg = policy_registry();
  EXPECT_THAT(reg.find_knob("packet_size")->parse("0KiB", &o).message(),
              ::testing::HasSubstr("--packet-size must be positive"));
  EXPECT_THAT(reg.find_knob("deft_epsilon")->parse("2", &o).message(),
              ::testing::HasSubstr("--deft-epsilon must be in (0, 1)"));
  EXPECT_THAT(reg.find_knob("deft_exact_max_items")->parse("21", &o).message(),
              ::testing::HasSubstr("--deft-exact-items must be in 0..20"));
  EXPECT_THAT(reg.find_knob("startup_time")->parse("fast", &o).message(),
              ::testing::HasSubstr("--startup-time"));
}

TEST(KnobTable, UnitBudgetBoundsUnitsPerIteration) {
  Profile p;
  p.name = "m";
  p.layers.push_back(LayerSpec{
      .name = "l", .forward = 1, .backward = 1, .tensors = {{"t", 1 << 20, 4}}});  // 4 MiB
  PolicyOptions o;
  EXPECT_TRUE(check_unit_budget(p, "mercury", Architecture::kPs, o, 4).is_ok());
  o.packet_size = 2;  // 2 Mi units per worker
  const Status s = check_unit_budget(p, "mercury", Architecture::kPs, o, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("--packet-size 2B cuts m's"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("the limit is 1048576 per worker"));
  o.packet_size = 4;  // 1 Mi units per worker: fits 32 workers, not 33 (33 Mi over all)
  EXPECT_TRUE(check_unit_budget(p, "mercury", Architecture::kPs, o, 1).is_ok());
  EXPECT_TRUE(check_unit_budget(p, "mercury", Architecture::kPs, o, 32).is_ok());
  EXPECT_THAT(check_unit_budget(p, "mercury", Architecture::kPs, o, 33).message(),
              ::testing::HasSubstr("the limit is 33554432 over all workers"));
  // wfbp reads no cutting knob; an unknown policy is the caller's to report.
  EXPECT_TRUE(check_unit_budget(p, "wfbp", Architecture::kPs, o, 8).is_ok());
  EXPECT_TRUE(check_unit_budget(p, "nope", Architecture::kPs, o, 8).is_ok());
}

// Issue 14 (simulator scale): a unit never straddles two servers, so a tensor split over M
// servers is cut per slice, and the count says so; the bound lets VGG-16 with 32 KiB
// packets run on 1024 workers and 1024 servers (25,649 units per worker) and no further
// than about 1.3 times that.
TEST(KnobTable, UnitBudgetCountsPerServerSliceAndAllowsVgg16On1024Hosts) {
  Profile p;
  p.name = "m";
  p.layers.push_back(LayerSpec{
      .name = "l", .forward = 1, .backward = 1, .tensors = {{"t", 1 << 20, 4}}});  // 4 MiB
  PolicyOptions o;
  o.packet_size = 768 * 1024;  // per tensor 6 units; per 1 MiB slice of 4 servers 2 each
  EXPECT_THAT(check_unit_budget(p, "mercury", Architecture::kPs, o, 5'000'000, 4).message(),
              ::testing::HasSubstr("into 8 units per iteration, 40000000 over --workers 5000000"));
  EXPECT_THAT(check_unit_budget(p, "mercury", Architecture::kPs, o, 6'000'000, 1).message(),
              ::testing::HasSubstr("into 6 units per iteration"));

  const Profile vgg = *load_model("vgg16", "rtx3090");
  const PolicyOptions d;  // 32 KiB packets
  EXPECT_TRUE(check_unit_budget(vgg, "mercury", Architecture::kPs, d, 1024, 1024).is_ok());
  const Status s = check_unit_budget(vgg, "mercury", Architecture::kPs, d, 1400, 1400);
  EXPECT_THAT(s.message(),
              ::testing::HasSubstr("over --workers 1400; the limit is 33554432 over all workers"));
}

TEST(KnobTable, ScalingTouchesOnlyScalingKnobs) {
  PolicyOptions o;
  scale_policy_options(&o, 0.1);
  const PolicyOptions d;
  EXPECT_EQ(o.packet_size, d.packet_size);  // a transport parameter
  EXPECT_EQ(o.partition_size, 400'000);
  EXPECT_EQ(o.credit_size, 2'000'000);
  EXPECT_EQ(o.slice_size, 20'000);
  EXPECT_EQ(o.split_threshold, 104'856);  // 1 MiB / 10, a multiple of 4
  EXPECT_EQ(o.prophet_partition_size, 409'600);
  EXPECT_EQ(o.startup_time, d.startup_time);
}

// The knob tables in docs/ are the registry's (regenerate: quicksilver policies --markdown).
TEST(KnobTable, DocsTablesMatchTheRegistry) {
  for (const auto& [file, arch] :
       {std::pair{"docs/policies-ps.md", Architecture::kPs},
        std::pair{"docs/policies-allreduce.md", Architecture::kAllReduce}}) {
    std::ifstream in(std::string(QS_SOURCE_DIR) + "/" + file);
    ASSERT_TRUE(in) << file;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    const std::string begin = "<!-- knobs: generated by `quicksilver policies --markdown";
    const std::string end = "<!-- end of generated knobs -->";
    const auto b = doc.find(begin);
    const auto e = doc.find(end);
    ASSERT_NE(b, std::string::npos) << file;
    ASSERT_NE(e, std::string::npos) << file;
    const auto table = doc.find('\n', b) + 1;
    // The built-in policies' table: this file's largest-first reads only a shared knob.
    std::string want = knob_markdown(arch);
    for (auto at = want.find(", `largest-first`"); at != std::string::npos;
         at = want.find(", `largest-first`")) {
      want.erase(at, std::string(", `largest-first`").size());
    }
    EXPECT_EQ(doc.substr(table, e - table), want)
        << file << ": run quicksilver policies --markdown";
  }
}

}  // namespace
}  // namespace qs
