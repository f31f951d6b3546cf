// The LibTorch API: data-parallel training of a C++ torch::nn model through Quicksilver's
// parameter servers, for users who train in C++ (issue 17 point 3). The same Session as
// the Python integration (session.h) under the same rules: each parameter's gradient goes
// to the scheduler as AccumulateGrad produces it (a post hook on its gradient accumulator,
// kept referenced), in place in its .grad; each layer's forward waits only for its own
// sums; each layer's update is the optimizer's own step() over its parameters alone, on
// the average, as soon as the model's thread can.
//
// The loop: y = trainer.forward(x); loss.backward(); trainer.step(). Do not call the
// optimizer's zero_grad(): the trainer zeroes each .grad right after its update, and the
// optimizer's would also clear sums that arrived but are not applied yet (a C++ optimizer
// cannot be wrapped as the Python one is).
//
// A C++ module has no forward pre-hooks, so the forward order cannot be recorded: the
// model is a torch::nn::Sequential, whose order is the forward order by construction, and
// the trainer runs its forward pass (forward()). Layers are its children that own
// parameters. Header-only, so that the one translation unit that includes torch's headers
// is the user's (examples/cpp/train_sequential.cc).
//
// Launch: the environment of torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), e.g.
// `quicksilver run --workers 2 --script ./build/examples/train_sequential`. Rank 0 hosts a
// rendezvous Coordinator (rendezvous.h) at MASTER_PORT; each process hosts one server
// (N = M). Every rank must start from the same parameters (the same seed): there is no
// broadcast here.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "quicksilver/model/profile.h"
#include "quicksilver/runtime/rendezvous.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/torch/session.h"

namespace qs::pytorch {

struct TrainerOptions {
  std::string policy = "mercury";
  std::vector<std::pair<std::string, std::string>> knobs;  // JobSpec::knobs
  // The job: from torchrun's environment by default (from_environment).
  int rank = 0;
  int size = 1;
  runtime::Endpoint coordinator{"127.0.0.1", 0};  // MASTER_ADDR:MASTER_PORT
  TimeNs timeout = 120 * kNsPerSec;               // rendezvous and connections

  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (unset: one process). Throws on a bad value.
  static TrainerOptions from_environment() {
    TrainerOptions o;
    auto get = [](const char* name, const char* fallback) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr && *v != '\0' ? v : fallback);
    };
    try {
      o.rank = std::stoi(get("RANK", "0"));
      o.size = std::stoi(get("WORLD_SIZE", "1"));
      o.coordinator =
          runtime::Endpoint{get("MASTER_ADDR", "127.0.0.1"), std::stoi(get("MASTER_PORT", "0"))};
    } catch (const std::exception&) {
      throw std::invalid_argument("quicksilver: RANK, WORLD_SIZE and MASTER_PORT must be integers");
    }
    if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
      throw std::invalid_argument("quicksilver: RANK=" + std::to_string(o.rank) +
                                  " not in [0, WORLD_SIZE=" + std::to_string(o.size) + ")");
    }
    if (o.size > 1 && o.coordinator.port == 0)
      throw std::invalid_argument("quicksilver: MASTER_PORT is not set");
    return o;
  }
};

class DistributedTrainer {
 public:
  DistributedTrainer(torch::nn::Sequential model, torch::optim::Optimizer& optimizer,
                     TrainerOptions options)
      : model_(std::move(model)), optimizer_(optimizer), options_(std::move(options)) {
    for (const auto& item : model_->named_children()) {
      const std::string& name = item.key();
      const auto& child = item.value();
      std::vector<torch::Tensor> params;
      for (auto& p : child->parameters(/*recurse=*/true)) {
        if (!p.requires_grad()) continue;
        if (p.scalar_type() != torch::kFloat32 || !p.device().is_cpu()) {
          throw std::invalid_argument("quicksilver: only float32 CPU parameters are supported");
        }
        params.push_back(p);
      }
      layer_of_child_.push_back(params.empty() ? -1 : static_cast<int>(layers_.size()));
      if (!params.empty()) layers_.push_back(Layer{name, params});
    }
    if (layers_.empty())
      throw std::invalid_argument("quicksilver: the model has no trainable parameter");
    // Gradient hooks on each parameter's accumulator: they fire once its .grad holds this
    // backward's gradient. The accumulators are kept: a parameter holds its own weakly.
    int tensor = 0;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      for (auto& p : layers_[l].params) {
        auto acc = torch::autograd::impl::grad_accumulator(p);
        acc->add_post_hook(std::make_unique<GradHook>(this, l, tensor++));
        accumulators_.push_back(std::move(acc));
      }
    }
    grad_at_.assign(layers_.size(), 0);
    forward_at_.assign(layers_.size() + 1, 0);
    applied_.assign(layers_.size(), 0);
  }

  ~DistributedTrainer() {
    if (session_) session_->abort("the trainer was destroyed before finish()");
  }

  // The model's forward pass, layer by layer: each waits for its own parameters' sums and
  // applies their update first.
  torch::Tensor forward(torch::Tensor x) {
    int child = 0;
    for (auto& m : *model_) {
      const int l = layer_of_child_[static_cast<std::size_t>(child++)];
      if (l >= 0) {
        if (session_) {
          check(session_->enter_forward(l));
          if (applied_[static_cast<std::size_t>(l)] < session_->backwards(l)) apply(l);
        } else {
          forward_at_[static_cast<std::size_t>(l)] = now();
        }
      }
      x = m.forward(x);
    }
    if (session_) {
      check(session_->leave_forward());
    } else {
      forward_at_.back() = now();
    }
    return x;
  }

  // After backward: the first call starts the job; every call applies the updates whose
  // sums are in, and returns.
  void step() {
    if (!session_) start();
    for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
      if (applied_[static_cast<std::size_t>(l)] < session_->backwards(l) && ready(l, false))
        apply(l);
    }
  }

  // Waits for every outstanding sum and applies it (before reading the parameters).
  void synchronize() {
    if (!session_) return;
    for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
      if (applied_[static_cast<std::size_t>(l)] < session_->backwards(l)) {
        ready(l, true);
        apply(l);
      }
    }
  }

  // Ends the run after the last iteration; returns this worker's measurements.
  runtime::WorkerReport finish() {
    synchronize();
    if (!session_) return {};
    auto r = session_->finish();
    if (!r.is_ok()) throw std::runtime_error("quicksilver: " + r.status().to_string());
    session_.reset();
    if (coordinator_thread_.joinable()) coordinator_thread_.join();
    return *r;
  }

  const Profile& profile() const { return profile_; }

 private:
  struct Layer {
    std::string name;
    std::vector<torch::Tensor> params;
  };

  struct GradHook final : torch::autograd::FunctionPostHook {
    GradHook(DistributedTrainer* t, std::size_t layer, int tensor)
        : t(t), layer(layer), tensor(tensor) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      if (t->session_) {
        check(t->session_->gradient_ready(tensor));
      } else {
        t->grad_at_[layer] = now();
      }
      return outputs;
    }
    DistributedTrainer* t;
    std::size_t layer;
    int tensor;
  };

  static TimeNs now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static void check(const Status& s) {
    if (!s.is_ok()) throw std::runtime_error("quicksilver: " + s.to_string());
  }
  bool ready(int l, bool wait) {
    auto r = session_->sum_ready(l, wait);
    if (!r.is_ok()) check(r.status());
    return *r;
  }

  // The profile (first iteration's times), the servers' rendezvous, the session.
  void start() {
    const std::size_t L = layers_.size();
    profile_.name = "libtorch";
    for (std::size_t l = 0; l < L; ++l) {
      LayerSpec spec;
      spec.name = layers_[l].name;
      spec.forward = std::max<TimeNs>(forward_at_[l + 1] - forward_at_[l], 0);
      spec.backward =
          std::max<TimeNs>(grad_at_[l] - (l + 1 < L ? grad_at_[l + 1] : forward_at_.back()), 0);
      int k = 0;
      for (auto& p : layers_[l].params) {
        if (!p.grad().defined())
          throw std::runtime_error("quicksilver: a parameter got no gradient");
        spec.tensors.push_back(TensorSpec{spec.name + "." + std::to_string(k++), p.numel()});
      }
      profile_.layers.push_back(std::move(spec));
    }
    JobSpec js;
    js.profile_json = profile_to_json(profile_);
    js.policy = options_.policy;
    js.knobs = options_.knobs;
    js.workers = js.servers = options_.size;
    js.settings.connect_timeout = options_.timeout;
    auto job = make_job(js);
    if (!job.is_ok()) check(job.status());
    auto architecture = job_architecture(js);
    if (architecture.is_ok() && *architecture == Architecture::kAllReduce) {
      check(invalid_argument("policy '" + js.policy +
                             "': the LibTorch API runs the parameter-server policies; the "
                             "all-reduce ones run from Python (quicksilver.torch)"));
    }
    runtime::ServerOptions so;
    so.job = *job;
    so.server_id = options_.rank;
    so.listen = runtime::Endpoint{"0.0.0.0", 0};
    auto server = runtime::Server::create(so);
    if (!server.is_ok()) check(server.status());
    std::vector<runtime::Endpoint> endpoints{runtime::Endpoint{"127.0.0.1", (*server)->port()}};
    if (options_.size > 1) {
      if (options_.rank == 0) {
        runtime::CoordinatorOptions co{runtime::Endpoint{"0.0.0.0", options_.coordinator.port},
                                       options_.size, options_.size, options_.timeout};
        auto c = runtime::Coordinator::create(co);
        if (!c.is_ok()) check(c.status().with_context("coordinator at MASTER_PORT"));
        coordinator_thread_ = std::thread([c = std::move(*c)] { (void)c->run(); });
      }
      check(runtime::register_server(options_.coordinator, options_.rank, (*server)->port(),
                                     options_.timeout));
      auto list = runtime::lookup_servers(options_.coordinator, options_.rank, options_.timeout);
      if (!list.is_ok()) check(list.status());
      endpoints = *list;
    }
    SessionOptions o;
    o.job = *job;
    o.rank = options_.rank;
    o.servers = endpoints;
    TensorId id = 0;
    for (auto& layer : layers_) {
      for (auto& p : layer.params) {
        torch::Tensor g = p.grad();
        if (!g.is_contiguous()) {
          p.mutable_grad() = g.contiguous();
          g = p.grad();
        }
        o.tensors.push_back(
            runtime::TensorBuffer{id, g.data_ptr<float>(), g.data_ptr<float>(), g.numel(), id});
        ++id;
      }
    }
    auto session = Session::start(std::move(o), std::move(*server));
    if (!session.is_ok()) check(session.status());
    session_ = std::move(*session);
    // The first backward's gradients, as the hooks would have reported them.
    for (int t = static_cast<int>(id) - 1; t >= 0; --t) check(session_->gradient_ready(t));
  }

  // Layer l's update: the optimizer's step over its parameters alone, on the average.
  void apply(int l) {
    torch::NoGradGuard no_grad;
    auto& layer = layers_[static_cast<std::size_t>(l)];
    for (auto& p : layer.params) p.mutable_grad().div_(options_.size);
    std::vector<std::vector<torch::Tensor>> saved;
    for (auto& group : optimizer_.param_groups()) {
      saved.push_back(group.params());
      std::vector<torch::Tensor> mine;
      for (auto& p : group.params()) {
        for (auto& q : layer.params) {
          if (p.is_same(q)) mine.push_back(p);
        }
      }
      group.params() = mine;
    }
    optimizer_.step();
    for (std::size_t g = 0; g < saved.size(); ++g) optimizer_.param_groups()[g].params() = saved[g];
    for (auto& p : layer.params) p.mutable_grad().zero_();
    ++applied_[static_cast<std::size_t>(l)];
  }

  torch::nn::Sequential model_;
  torch::optim::Optimizer& optimizer_;
  TrainerOptions options_;
  std::vector<Layer> layers_;
  std::vector<int> layer_of_child_;  // by child of the Sequential: its layer, or -1
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<TimeNs> grad_at_, forward_at_;  // the first iteration's times
  std::vector<std::int64_t> applied_;         // updates applied, per layer
  Profile profile_;
  std::unique_ptr<Session> session_;
  std::thread coordinator_thread_;
};

}  // namespace qs::pytorch
