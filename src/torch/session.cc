#include "quicksilver/torch/session.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "quicksilver/core/thread_name.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/torch/hooked_compute.h"
#include "quicksilver/transport/clock.h"

namespace qs::pytorch {

namespace {

// The model's own buffers, registered once; the loop says when a layer's sums are in.
// Delayed updates: the Session's own target (merged sums in its buffers, the updates due
// to it).
class Registered final : public runtime::TensorSource {
 public:
  Registered(std::vector<runtime::TensorBuffer> tensors,
             std::function<void(int, std::int64_t)> on_ready, runtime::DelayedUpdateTarget* delayed)
      : tensors_(std::move(tensors)), on_ready_(std::move(on_ready)), delayed_(delayed) {}
  std::vector<runtime::TensorBuffer> tensors() override { return tensors_; }
  Status on_layer_ready(int layer, std::int64_t iteration) override {
    on_ready_(layer, iteration);
    return Status::ok();
  }
  runtime::DelayedUpdateTarget* delayed_updates() override { return delayed_; }

 private:
  std::vector<runtime::TensorBuffer> tensors_;
  std::function<void(int, std::int64_t)> on_ready_;
  runtime::DelayedUpdateTarget* delayed_;
};

TimeNs now() { return transport::SteadyClock::instance().now(); }

class PsWorker final : public TrainingWorker {
 public:
  explicit PsWorker(std::unique_ptr<runtime::Worker> w) : w_(std::move(w)) {}
  Result<runtime::WorkerReport> run() override { return w_->run(); }
  void post(std::function<void()> fn) override { w_->post(std::move(fn)); }
  void finish(std::int64_t iterations) override { w_->finish(iterations); }
  void request_stop(const std::string& why) override { w_->request_stop(why); }

 private:
  std::unique_ptr<runtime::Worker> w_;
};

class AllReduceWorker final : public TrainingWorker {
 public:
  explicit AllReduceWorker(std::unique_ptr<runtime::CollectiveWorker> w) : w_(std::move(w)) {}
  Result<runtime::WorkerReport> run() override { return w_->run(); }
  void post(std::function<void()> fn) override { w_->post(std::move(fn)); }
  void finish(std::int64_t iterations) override { w_->finish(iterations); }
  void request_stop(const std::string& why) override { w_->request_stop(why); }
  void feedback(const TrainingFeedback& f) override { w_->feedback(f); }

 private:
  std::unique_ptr<runtime::CollectiveWorker> w_;
};

}  // namespace

bool is_allreduce_policy(const std::string& policy) {
  return policy_registry().find(policy, Architecture::kAllReduce) != nullptr &&
         policy_registry().find(policy, Architecture::kPs) == nullptr;
}

WorkerFactory allreduce_worker(runtime::Endpoint store, std::vector<std::string> links,
                               runtime::GlooAlgorithm algorithm) {
  return [store, links,
          algorithm](runtime::WorkerOptions wo) -> Result<std::unique_ptr<TrainingWorker>> {
    runtime::CollectiveOptions o;
    o.job = std::move(wo.job);
    o.rank = wo.worker_id;
    o.store = store;
    o.secret = wo.secret;
    o.links = links;
    o.algorithm = algorithm;
    o.tensors = wo.tensors;
    o.verify = false;
    o.compute = std::move(wo.compute);
    o.calibration_repeats = 3;
    QS_ASSIGN_OR_RETURN(auto w, runtime::CollectiveWorker::create(std::move(o)));
    return std::unique_ptr<TrainingWorker>(std::make_unique<AllReduceWorker>(std::move(w)));
  };
}

Result<std::unique_ptr<TrainingWorker>> ps_worker(runtime::WorkerOptions options) {
  QS_ASSIGN_OR_RETURN(auto w, runtime::Worker::create(std::move(options)));
  return std::unique_ptr<TrainingWorker>(std::make_unique<PsWorker>(std::move(w)));
}

Result<Architecture> job_architecture(const JobSpec& spec) {
  const PolicyRegistry& registry = policy_registry();
  Architecture a = Architecture::kPs;
  if (spec.architecture == "allreduce" ||
      (spec.architecture.empty() && is_allreduce_policy(spec.policy))) {
    a = Architecture::kAllReduce;
  } else if (!spec.architecture.empty() && spec.architecture != "ps") {
    return invalid_argument("architecture '" + spec.architecture + "': give 'ps' or 'allreduce'");
  }
  if (registry.find(spec.policy, a) == nullptr) {
    std::string names;
    for (const std::string& n : registry.names(a)) names += (names.empty() ? "" : ", ") + n;
    return invalid_argument("policy '" + spec.policy + "' is not a" +
                            (a == Architecture::kPs ? " parameter-server" : "n all-reduce") +
                            " policy; those are: " + names);
  }
  return a;
}

Status parse_knobs(const std::vector<std::pair<std::string, std::string>>& knobs,
                   PolicyOptions* options) {
  const PolicyRegistry& registry = policy_registry();
  for (const auto& [name, value] : knobs) {
    std::string field = name;
    while (!field.empty() && field.front() == '-') field.erase(field.begin());
    for (char& c : field) c = c == '-' ? '_' : c;
    const Knob* knob = registry.find_knob(field);
    if (knob == nullptr) {
      std::string names;
      for (const Knob* k : registry.knobs()) names += (names.empty() ? "" : ", ") + k->name;
      return invalid_argument("unknown knob '" + name + "' (knobs: " + names + ")");
    }
    QS_RETURN_IF_ERROR(knob->parse_bare(value, options));  // Python: packet_size=4096
  }
  return Status::ok();
}

Result<runtime::JobOptions> make_job(const JobSpec& spec) {
  runtime::JobOptions job;
  QS_ASSIGN_OR_RETURN(job.profile,
                      profile_from_json(spec.profile_json, "<model profile>", "model"));
  const PolicyRegistry& registry = policy_registry();
  QS_ASSIGN_OR_RETURN(const Architecture architecture, job_architecture(spec));
  const bool allreduce = architecture == Architecture::kAllReduce;
  if (registry.is_known(spec.policy) && !registry.communicates(spec.policy)) {
    return invalid_argument("policy '" + spec.policy +
                            "' moves no gradient (it is the simulator's compute-only "
                            "bound): the workers would train apart");
  }
  job.policy = spec.policy;
  QS_RETURN_IF_ERROR(parse_knobs(spec.knobs, &job.policy_options));
  // Real training measures what DeFT's Preserver needs (IV-C's feedback loop): it judges
  // that instead of certifying a dry run with the closed-form model's constants.
  job.policy_options.deft_loss_feedback = true;
  job.workers = spec.workers;
  job.servers = spec.servers;
  job.iterations = kOpenEndedIterations;
  QS_ASSIGN_OR_RETURN(job.bandwidth, parse_rate(spec.bandwidth));
  QS_ASSIGN_OR_RETURN(job.wire_dtype, transport::parse_wire_dtype(spec.compression));
  QS_RETURN_IF_ERROR(runtime::check_settings(spec.settings));
  static_cast<runtime::RuntimeSettings&>(job) = spec.settings;
  QS_RETURN_IF_ERROR(allreduce ? runtime::validate_collective_job(job)
                               : runtime::validate_job(job));
  return job;
}

// The Session's delayed-update calls as the runtime's target.
struct Session::DelayedTarget final : runtime::DelayedUpdateTarget {
  explicit DelayedTarget(Session& s) : s(s) {}
  float* merged_sum(TensorId t, std::int64_t first, std::int64_t last) override {
    return s.merged_sum(t, first, last);
  }
  Status on_updates(std::int64_t before, const std::vector<runtime::LayerUpdate>& due) override {
    return s.on_updates(before, due);
  }
  Status on_update_ready(const runtime::LayerUpdate& u) override { return s.on_update_ready(u); }
  Session& s;
};

Result<std::unique_ptr<Session>> Session::start(SessionOptions options,
                                                std::unique_ptr<runtime::Server> hosted) {
  std::unique_ptr<Session> s(new Session());
  s->options_ = std::move(options);
  const Profile& profile = s->options_.job.profile;
  const auto layers = static_cast<std::size_t>(profile.num_layers());
  s->layer_tensors_.resize(layers);
  TensorId id = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < profile.layers[l].tensors.size(); ++k) {
      s->tensor_layer_.push_back(static_cast<int>(l));
      s->layer_tensors_[l].push_back(id++);
    }
  }
  s->backwards_.assign(layers, 0);
  s->gates_.assign(layers, 0);
  s->sums_.assign(layers, 0);
  s->seen_.assign(layers, 0);
  Session* self = s.get();
  // Delayed updates: an all-reduce worker (make_worker) under a policy that delays them.
  const PolicySpec* spec = policy_registry().find(s->options_.job.policy, Architecture::kAllReduce);
  s->delayed_ = s->options_.make_worker && spec != nullptr && spec->delays_updates;
  if (s->delayed_) {
    s->delayed_target_ = std::make_unique<DelayedTarget>(*self);
    s->updates_.resize(layers);
    s->layer_elements_.assign(layers, 0);
    s->merged_spare_.resize(layers);
    for (std::size_t t = 0; t < s->options_.tensors.size(); ++t) {
      std::int64_t& at = s->layer_elements_[static_cast<std::size_t>(s->tensor_layer_[t])];
      s->offsets_.push_back(at);
      at += s->options_.tensors[t].elements;
    }
  }
  s->source_ = std::make_unique<Registered>(
      s->options_.tensors, [self](int l, std::int64_t it) { self->on_sums(l, it); },
      s->delayed_target_.get());

  runtime::WorkerOptions wo;
  wo.job = s->options_.job;
  wo.worker_id = s->options_.rank;
  wo.secret = s->options_.secret;
  wo.servers = s->options_.servers;
  wo.tensors = s->source_.get();
  wo.verify = false;
  wo.compute = [self, layers](Timer& timer) -> std::unique_ptr<Compute> {
    auto c = std::make_unique<HookedCompute>(
        timer, static_cast<int>(layers), [self](int l, std::int64_t it) { self->on_gate(l, it); });
    self->compute_ = c.get();
    return c;
  };
  const WorkerFactory make = s->options_.make_worker ? s->options_.make_worker : ps_worker;
  QS_ASSIGN_OR_RETURN(s->worker_, make(std::move(wo)));
  s->server_ = std::move(hosted);

  // The threads: each records how its node ended; a failure wakes every waiting call.
  if (s->server_) {
    s->server_thread_ = std::thread([self] {
      name_this_thread("qs-server");
      Status st = self->server_->run();
      std::lock_guard<std::mutex> lock(self->mu_);
      self->server_ended_ = true;
      if (!st.is_ok()) self->fail(st.with_context("server " + std::to_string(self->options_.rank)));
      self->cv_.notify_all();
    });
  }
  s->worker_thread_ = std::thread([self] {
    name_this_thread("qs-worker");
    Result<runtime::WorkerReport> r = self->worker_->run();
    std::lock_guard<std::mutex> lock(self->mu_);
    self->worker_ended_ = true;
    if (!r.is_ok()) self->fail(r.status());
    self->report_ = std::move(r);
    self->cv_.notify_all();
  });
  return s;
}

Session::~Session() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = !worker_ended_ || (server_ && !server_ended_);
  }
  if (running) abort("the session was destroyed before finish()");
  if (worker_thread_.joinable()) worker_thread_.join();
  if (server_thread_.joinable()) server_thread_.join();
}

void Session::fail(Status s) {
  if (error_.is_ok() && !s.is_ok()) error_ = std::move(s);
  cv_.notify_all();
}

Status Session::error_locked() const {
  if (!error_.is_ok()) return error_;
  if (worker_ended_ && !finishing_) return unavailable("the quicksilver worker ended");
  return Status::ok();
}

void Session::post(void (HookedCompute::*fn)(int, TimeNs), int layer) {
  worker_->post([this, fn, layer, at = now()] { (compute_->*fn)(layer, at); });
}

// ---- the model's thread ----

Status Session::gradient_ready(TensorId tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  QS_RETURN_IF_ERROR(error_locked());
  if (tensor < 0 || static_cast<std::size_t>(tensor) >= tensor_layer_.size()) {
    return invalid_argument("gradient_ready: no tensor " + std::to_string(tensor));
  }
  const int l = tensor_layer_[static_cast<std::size_t>(tensor)];
  const auto li = static_cast<std::size_t>(l);
  // The previous backward's sums must be in (and applied) before a new gradient
  // accumulates into the same buffer: the forward pass waited for them. (Delayed updates:
  // the gradients were copied when their backward ended, the sums go elsewhere.)
  if (!delayed_ && sums_[li] < backwards_[li]) {
    const auto k = static_cast<std::size_t>(tensor - layer_tensors_[li][0]);
    return invalid_argument(
        "tensor '" + options_.job.profile.layers[li].tensors[k].name + "' (layer '" +
        options_.job.profile.layers[li].name +
        "') got a new gradient before the sums of its last backward arrived: run a "
        "forward pass (or optimizer.synchronize()) between two backward passes");
  }
  if (++seen_[li] == static_cast<int>(layer_tensors_[li].size())) {
    seen_[li] = 0;
    ++backwards_[li];
    post(&HookedCompute::backward_done, l);
  }
  return Status::ok();
}

Status Session::enter_forward(int layer) {
  std::unique_lock<std::mutex> lock(mu_);
  QS_RETURN_IF_ERROR(error_locked());
  const auto li = static_cast<std::size_t>(layer);
  if (layer == 0) next_forward_ = 0;               // a new forward pass
  if (layer < next_forward_) return Status::ok();  // a layer used a second time
  if (layer > next_forward_) {
    const auto& layers = options_.job.profile.layers;
    return invalid_argument(
        "the forward pass entered layer '" + layers[li].name + "' before layer '" +
        layers[static_cast<std::size_t>(next_forward_)].name +
        "': every pass must use the layers with parameters in the order of the first one");
  }
  if (layer > 0) post(&HookedCompute::forward_done, layer - 1);
  next_forward_ = layer + 1;
  // Delayed updates: the updates due before this pass must be decided too (a worker other
  // than 0 learns them from worker 0's inputs, possibly after its own gate opened).
  cv_.wait(lock, [&] {
    return (gates_[li] >= backwards_[li] && (!delayed_ || decided_ >= backwards_[li])) ||
           !error_locked().is_ok();
  });
  return error_locked();
}

Status Session::leave_forward() {
  std::lock_guard<std::mutex> lock(mu_);
  QS_RETURN_IF_ERROR(error_locked());
  if (next_forward_ == num_layers()) post(&HookedCompute::forward_done, num_layers() - 1);
  next_forward_ = num_layers() + 1;  // until the next pass enters layer 0
  return Status::ok();
}

Result<bool> Session::sum_ready(int layer, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto li = static_cast<std::size_t>(layer);
  auto ready = [&] { return sums_[li] >= backwards_[li]; };
  if (wait) cv_.wait(lock, [&] { return ready() || !error_locked().is_ok(); });
  if (ready()) return true;  // in place even when the job failed since
  QS_RETURN_IF_ERROR(error_locked());
  return false;
}

std::int64_t Session::backwards(int layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return backwards_[static_cast<std::size_t>(layer)];
}

Result<runtime::WorkerReport> Session::finish() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    QS_RETURN_IF_ERROR(error_locked());
    for (std::size_t l = 0; l < backwards_.size(); ++l) {
      if (seen_[l] != 0 || backwards_[l] != backwards_[0]) {
        lock.unlock();
        abort("finish() in the middle of a backward pass");
        return invalid_argument("finish() in the middle of a backward pass (layer '" +
                                options_.job.profile.layers[l].name +
                                "' has not all its gradients)");
      }
    }
    // Delayed updates: the sums still held back are reduced after training ends.
    cv_.wait(lock, [&] {
      for (std::size_t l = 0; l < sums_.size() && !delayed_; ++l) {
        if (sums_[l] < backwards_[l]) return !error_locked().is_ok();
      }
      return true;
    });
    QS_RETURN_IF_ERROR(error_locked());
    finishing_ = true;
  }
  std::int64_t passes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    passes = backwards_.empty() ? 0 : backwards_[0];
  }
  worker_->post([this] { compute_->finish(); });
  worker_->finish(passes);  // exactly the backward passes the model ran
  worker_thread_.join();
  if (server_thread_.joinable()) server_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.is_ok()) return error_;
  return report_;
}

void Session::abort(const std::string& why) {
  if (worker_) worker_->request_stop(why);
  if (server_) server_->request_stop(why);
}

// ---- delayed updates ----

Result<std::vector<runtime::LayerUpdate>> Session::take_updates(int layer, std::int64_t before) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!delayed_) return invalid_argument("take_updates: this job's policy does not delay updates");
  if (layer < 0 || layer >= num_layers())
    return invalid_argument("take_updates: no layer " + std::to_string(layer));
  auto& q = updates_[static_cast<std::size_t>(layer)];
  // The due updates whose sums are still on the way (LayerUpdate::ready) are waited for.
  auto pending = [&] {
    for (const auto& [b, u] : q) {
      if (b <= before && !u.ready) return true;
    }
    return false;
  };
  cv_.wait(lock, [&] { return !pending() || !error_locked().is_ok() || worker_ended_; });
  if (pending()) {
    QS_RETURN_IF_ERROR(error_locked());
    return internal_error(
        "take_updates: the worker ended before the sums of a due update of layer '" +
        options_.job.profile.layers[static_cast<std::size_t>(layer)].name + "' arrived");
  }
  // Due updates are applied even after a failure (their sums are in), as sum_ready does.
  std::vector<runtime::LayerUpdate> out;
  std::size_t k = 0;
  while (k < q.size() && q[k].first <= before) out.push_back(q[k++].second);
  q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(k));
  if (out.empty()) QS_RETURN_IF_ERROR(error_locked());
  return out;
}

Status Session::load_update(const runtime::LayerUpdate& u) {
  if (!delayed_) return invalid_argument("load_update: this job's policy does not delay updates");
  if (u.layer < 0 || u.layer >= num_layers())
    return invalid_argument("load_update: no layer " + std::to_string(u.layer));
  std::lock_guard<std::mutex> lock(merged_mu_);
  auto m = merged_.find({u.layer, u.first, u.last});
  if (m == merged_.end()) {
    return invalid_argument("load_update: no sums of iterations " + std::to_string(u.first) + ".." +
                            std::to_string(u.last) + " for layer '" +
                            options_.job.profile.layers[static_cast<std::size_t>(u.layer)].name +
                            "' (not due, or loaded already)");
  }
  for (TensorId t : layer_tensors_[static_cast<std::size_t>(u.layer)]) {
    const runtime::TensorBuffer& b = options_.tensors[static_cast<std::size_t>(t)];
    std::memcpy(b.sum, m->second.get() + offsets_[static_cast<std::size_t>(t)],
                static_cast<std::size_t>(b.elements) * sizeof(float));
  }
  // Loaded: the buffer is the layer's spare (its next update needs one), or freed.
  auto& spare = merged_spare_[static_cast<std::size_t>(u.layer)];
  if (!spare) {
    spare = std::move(m->second);
  } else {
    merged_bytes_ -= layer_elements_[static_cast<std::size_t>(u.layer)] *
                     static_cast<std::int64_t>(sizeof(float));
  }
  merged_.erase(m);
  return Status::ok();
}

void Session::feedback(const TrainingFeedback& f) {
  if (worker_) worker_->feedback(f);
}

float* Session::merged_sum(TensorId t, std::int64_t first, std::int64_t last) {
  const auto l = static_cast<std::size_t>(tensor_layer_[static_cast<std::size_t>(t)]);
  std::lock_guard<std::mutex> lock(merged_mu_);
  std::unique_ptr<float[]>& m = merged_[{static_cast<int>(l), first, last}];
  if (!m) {
    if (merged_spare_[l]) {
      m = std::move(merged_spare_[l]);
    } else {
      m = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(layer_elements_[l]));
      merged_bytes_ += layer_elements_[l] * static_cast<std::int64_t>(sizeof(float));
      merged_bytes_max_ = std::max(merged_bytes_max_, merged_bytes_);
    }
  }
  return m.get() + offsets_[static_cast<std::size_t>(t)];
}

std::int64_t Session::merged_bytes_max() const {
  std::lock_guard<std::mutex> lock(merged_mu_);
  return merged_bytes_max_;
}

Status Session::on_updates(std::int64_t before, const std::vector<runtime::LayerUpdate>& due) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const runtime::LayerUpdate& u : due)
    updates_[static_cast<std::size_t>(u.layer)].emplace_back(before, u);
  decided_ = std::max(decided_, before);
  cv_.notify_all();
  return Status::ok();
}

Status Session::on_update_ready(const runtime::LayerUpdate& u) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [before, v] : updates_[static_cast<std::size_t>(u.layer)]) {
    if (v.first == u.first && v.last == u.last) {
      v.ready = true;
      cv_.notify_all();
      return Status::ok();
    }
  }
  // Taken already would be a bug: it was taken while not ready.
  return internal_error("on_update_ready: no pending update of layer " + std::to_string(u.layer) +
                        " for iterations " + std::to_string(u.first) + ".." +
                        std::to_string(u.last));
}

// ---- the loop thread ----

void Session::on_gate(int layer, std::int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& g = gates_[static_cast<std::size_t>(layer)];
  g = std::max(g, iteration + 1);
  cv_.notify_all();
}

void Session::on_sums(int layer, std::int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = sums_[static_cast<std::size_t>(layer)];
  s = std::max(s, iteration + 1);
  cv_.notify_all();
}

}  // namespace qs::pytorch
