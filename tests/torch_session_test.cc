// The PyTorch integration's C++ core without PyTorch: two workers in one process, each
// with its own server (N = M = 2), each driven by a thread that plays the model (hooks
// report gradients, the forward pass waits at each layer's gate). The sums land in the
// registered buffers in place; the run is open-ended and ends with finish().
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "quicksilver/runtime/runtime.h"
#include "quicksilver/torch/hooked_compute.h"
#include "quicksilver/torch/session.h"

namespace qs::pytorch {
namespace {

constexpr const char* kProfile = R"({"name": "t", "layers": [
  {"name": "a", "forward_ms": 0.1, "backward_ms": 0.2, "tensors": [{"name": "a.w", "elements": 3000}, {"name": "a.b", "elements": 7}]},
  {"name": "b", "forward_ms": 0.1, "backward_ms": 0.2, "tensors": [{"name": "b.w", "elements": 20000}]},
  {"name": "c", "forward_ms": 0.1, "backward_ms": 0.2, "tensors": [{"name": "c.w", "elements": 500}, {"name": "c.b", "elements": 10}]}]})";

// The value worker `rank` produces for iteration `it`; sums of two are exact in float.
float grad_value(int rank, int it) { return static_cast<float>((rank + 1) * (it + 1)); }

void train(const std::string& policy, int iterations, bool eval_pass) {
  JobSpec spec;
  spec.profile_json = kProfile;
  spec.policy = policy;
  spec.knobs = {{"packet_size", "4KiB"}, {"partition-size", "8KiB"}, {"credit_size", "16KiB"}};
  spec.workers = 2;
  spec.servers = 2;
  spec.settings.connect_timeout = 20 * kNsPerSec;
  spec.settings.peer_timeout = 20 * kNsPerSec;
  auto job = make_job(spec);
  ASSERT_TRUE(job.is_ok()) << job.status().to_string();
  std::vector<std::unique_ptr<runtime::Server>> servers;
  std::vector<runtime::Endpoint> endpoints;
  for (int s = 0; s < 2; ++s) {
    runtime::ServerOptions so;
    so.job = *job;
    so.server_id = s;
    auto server = runtime::Server::create(so);
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    endpoints.push_back(runtime::Endpoint{"127.0.0.1", (*server)->port()});
    servers.push_back(std::move(*server));
  }
  std::vector<std::thread> models;
  std::vector<std::string> errors(2);
  for (int rank = 0; rank < 2; ++rank) {
    models.emplace_back(
        [&, rank, server = std::move(servers[static_cast<std::size_t>(rank)])]() mutable {
          std::vector<std::vector<float>> grads;
          SessionOptions o;
          o.job = *job;
          o.rank = rank;
          o.servers = endpoints;
          for (const LayerSpec& l : job->profile.layers) {
            for (const TensorSpec& t : l.tensors)
              grads.emplace_back(static_cast<std::size_t>(t.elements), 0.0f);
          }
          for (std::size_t t = 0; t < grads.size(); ++t) {
            o.tensors.push_back(runtime::TensorBuffer{
                static_cast<TensorId>(t), grads[t].data(), grads[t].data(),
                static_cast<std::int64_t>(grads[t].size()), static_cast<int>(t)});
          }
          auto session = Session::start(std::move(o), std::move(server));
          if (!session.is_ok()) {
            errors[static_cast<std::size_t>(rank)] = session.status().to_string();
            return;
          }
          Session& s = **session;
          auto fail = [&](const std::string& e) { errors[static_cast<std::size_t>(rank)] = e; };
          for (int it = 0; it < iterations; ++it) {
            // Backward: output layer first; a "hook" per tensor.
            for (int t = static_cast<int>(grads.size()) - 1; t >= 0; --t) {
              std::fill(grads[static_cast<std::size_t>(t)].begin(),
                        grads[static_cast<std::size_t>(t)].end(), grad_value(rank, it));
              if (Status st = s.gradient_ready(t); !st.is_ok()) return fail(st.to_string());
            }
            // The next forward: each layer waits for its own sums, which are in place.
            for (int pass = 0; pass < (eval_pass ? 2 : 1); ++pass) {
              for (int l = 0; l < s.num_layers(); ++l) {
                if (Status st = s.enter_forward(l); !st.is_ok()) return fail(st.to_string());
                auto ready = s.sum_ready(l, false);
                if (!ready.is_ok() || !*ready)
                  return fail("layer " + std::to_string(l) + " entered without its sums");
              }
              if (Status st = s.leave_forward(); !st.is_ok()) return fail(st.to_string());
            }
            const float want = grad_value(0, it) + grad_value(1, it);
            for (const auto& g : grads) {
              for (float v : g) {
                if (v != want)
                  return fail("sum " + std::to_string(v) + " != " + std::to_string(want));
              }
            }
          }
          auto report = s.finish();
          if (!report.is_ok()) return fail(report.status().to_string());
          if (static_cast<int>(report->iteration_times.size()) != iterations) {
            return fail(std::to_string(report->iteration_times.size()) + " iterations reported");
          }
        });
  }
  for (auto& t : models) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(Session, MercurySumsInPlace) { train("mercury", 4, false); }
TEST(Session, ByteSchedulerWithEvaluationPasses) { train("bytescheduler", 3, true); }
TEST(Session, WfbpOneIteration) { train("wfbp", 1, false); }

// Callbacks in (time, scheduling order); time moves only when told.
class ManualTimer final : public Timer {
 public:
  TimeNs now() const override { return now_; }
  void schedule_at(TimeNs when, Callback fn) override {
    q_.emplace(std::make_pair(when, seq_++), std::move(fn));
  }
  void advance(TimeNs to) {
    now_ = to;
    while (!q_.empty() && q_.begin()->first.first <= now_) {
      auto node = q_.extract(q_.begin());
      node.mapped()();
    }
  }

 private:
  std::map<std::pair<TimeNs, std::uint64_t>, Callback> q_;
  std::uint64_t seq_ = 0;
  TimeNs now_ = 0;
};

TEST(HookedCompute, BackwardStepsEndInOrderWhateverOrderTheHooksReport) {
  ManualTimer timer;
  HookedCompute c(timer, 3, nullptr);
  std::vector<std::pair<int, TimeNs>> ended;
  // Layer 1 (the middle one) completes first, at 10; layer 2 at 20.
  c.backward_done(1, 10);
  c.run(ComputeStep{Pass::kBackward, 2, 0}, 0, [&](TimeNs end) { ended.emplace_back(2, end); });
  timer.advance(15);
  EXPECT_TRUE(ended.empty());  // layer 2 has not reported
  c.backward_done(2, 20);
  timer.advance(20);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].second, 20);
  // Layer 1 reported at 10, before layer 2's step ended: it ends with it, not before.
  c.run(ComputeStep{Pass::kBackward, 1, 0}, 0, [&](TimeNs end) { ended.emplace_back(1, end); });
  timer.advance(21);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[1].second, 20);
}

TEST(HookedCompute, ForwardOpensTheGateAndIgnoresPassesWithoutOne) {
  ManualTimer timer;
  std::vector<std::pair<int, std::int64_t>> gates;
  HookedCompute c(timer, 2, [&](int l, std::int64_t it) { gates.emplace_back(l, it); });
  // An evaluation pass before any gate: no step to end.
  c.forward_done(0, 5);
  bool done = false;
  c.run(ComputeStep{Pass::kForward, 0, 0}, 0, [&](TimeNs) { done = true; });
  ASSERT_EQ(gates.size(), 1u);
  EXPECT_EQ(gates[0], std::make_pair(0, std::int64_t{0}));
  timer.advance(6);
  EXPECT_FALSE(done);  // the report at 5 came before the gate: not this step
  c.forward_done(0, 7);
  timer.advance(7);
  EXPECT_TRUE(done);
  // finish(): a waiting forward step and later ones end at once; a backward never does.
  bool fw1 = false, bw = false;
  c.run(ComputeStep{Pass::kForward, 1, 0}, 0, [&](TimeNs) { fw1 = true; });
  c.finish();
  timer.advance(8);
  EXPECT_TRUE(fw1);
  c.run(ComputeStep{Pass::kBackward, 1, 1}, 0, [&](TimeNs) { bw = true; });
  timer.advance(100);
  EXPECT_FALSE(bw);
}

TEST(Session, MakeJobNamesWhatIsWrong) {
  JobSpec spec;
  spec.profile_json = kProfile;
  spec.policy = "ddp";
  spec.architecture = "ps";
  auto job = make_job(spec);
  ASSERT_FALSE(job.is_ok());
  EXPECT_NE(job.status().message().find("not a parameter-server policy"), std::string::npos)
      << job.status().message();
  spec.architecture = "";  // ddp's own: all-reduce
  job = make_job(spec);
  ASSERT_TRUE(job.is_ok()) << job.status().to_string();
  EXPECT_EQ(job_architecture(spec).value(), Architecture::kAllReduce);
  spec.policy = "deft";  // its delayed updates, judged by the Preserver on measured training
  job = make_job(spec);
  ASSERT_TRUE(job.is_ok()) << job.status().to_string();
  EXPECT_TRUE(job->policy_options.deft_loss_feedback);
  spec.policy = "mercury";
  spec.knobs = {{"packet_sise", "4KiB"}};
  job = make_job(spec);
  ASSERT_FALSE(job.is_ok());
  EXPECT_NE(job.status().message().find("unknown knob 'packet_sise'"), std::string::npos);
  spec.policy = "oracle";
  spec.knobs = {};
  EXPECT_FALSE(make_job(spec).is_ok());
  spec.policy = "mercury";
  spec.knobs = {{"--packet-size", "4096"}};  // a flag's spelling, a bare byte count
  job = make_job(spec);
  ASSERT_TRUE(job.is_ok()) << job.status().to_string();
  EXPECT_EQ(job->policy_options.packet_size, 4096);
}

}  // namespace
}  // namespace qs::pytorch
