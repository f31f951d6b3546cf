// Session: one worker of a data-parallel job trained from a real model (PyTorch, through
// the Python module or LibTorch). It runs a runtime worker, whose training loop drives a
// HookedCompute, on a thread of its own (and, optionally, this process's parameter server
// on another), and gives the model's thread the calls its hooks make:
//
//   gradient_ready(t)  an AccumulateGrad hook: tensor t's gradient of this backward is in
//                      its .grad; once every tensor of its layer reported, the layer's
//                      backward step ends (the policy may push it);
//   enter_forward(l)   a forward pre-hook: blocks until the loop opened layer l's gate for
//                      the last backward's sums (returns at once when no backward happened
//                      since the last pass: evaluation), and reports that the previous
//                      layer's forward ended;
//   leave_forward()    the model's forward ended (the last layer's forward step ends);
//   sum_ready(l, wait) whether the sums of layer l's last backward are all in its .grad
//                      (the optimizer may update it: as soon as they are, in place);
//   finish()           the user's loop ended: the run ends after the last iteration.
//
// Delayed updates (an all-reduce policy whose PolicySpec::delays_updates: DeFT): a layer's
// sums may cover several iterations and arrive while later ones compute, so they land in
// buffers of the Session's own (runtime::TensorSource::merged_sum), the forward pass waits
// for its gate and for worker 0's decision of which updates are due (not for the last
// backward's sums), and the model's thread takes them:
//   take_updates(l, n) layer l's updates due before the forward pass after n backward
//                      passes (or after training: runtime::kAfterTraining), in order,
//                      once their sums are in (it waits for those still on the way);
//   load_update(l, u)  copies update u's sums into layer l's gradient buffers (.grad), to
//                      be averaged over workers and iterations and applied by the optimizer.
//
// The gradients are the model's own buffers (TensorBuffer: gradient == sum, torch's .grad
// storage); pushes read them and pulls write the sums into them, without a copy.
// The Session is independent of the Exchange: an all-reduce worker plugs in through
// SessionOptions::make_worker (TrainingWorker, below).
//
// Thread safety: the model-thread calls may come from any thread, one at a time (hooks
// run on the Python thread, or on autograd's threads); they never run loop code
// themselves, they post it. A failure of the worker or the hosted server (a peer died, a
// timeout) makes every call return that error from then on, and wakes any waiting call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/runtime/tensors.h"

namespace qs::pytorch {

class HookedCompute;

// What a binding knows of a job, as text: turned into runtime::JobOptions by make_job, the
// one place that parses it (the Python module and the LibTorch API both call it).
struct JobSpec {
  std::string profile_json;  // DESIGN.md's profile format, layers in forward-use order
  std::string policy = "mercury";
  // "ps" (TCP parameter servers), "allreduce" (gloo), or empty: the policy's own, and "ps"
  // for the names both architectures have (wfbp, bytescheduler).
  std::string architecture;
  // Policy knobs by field name ("packet_size"; "packet-size" and "--packet-size" too),
  // values as the command line spells them ("32KiB", "200us", "true"; a size may be a bare
  // number of bytes).
  std::vector<std::pair<std::string, std::string>> knobs;
  int workers = 1;
  int servers = 1;
  std::string bandwidth = "10Gbps";  // the nominal NIC rate (JobOptions::bandwidth)
  // Gradient elements on the wire: "none" (float32), "bf16" or "fp16" (sums in float32;
  // runtime::JobOptions::wire_dtype).
  std::string compression = "none";
  // The runtime's settings (runtime/settings.h), the command line's but for two: the
  // rendezvous waits long enough for every process to reach its first optimizer step, and
  // a stalled (not dead) peer is given up only after a long silence, since the user's loop
  // may pause between iterations (evaluation, checkpoints). A dead peer is seen at once
  // (its sockets close) whatever these are.
  runtime::RuntimeSettings settings{.connect_timeout = 120 * kNsPerSec,
                                    .peer_timeout = 600 * kNsPerSec};
};
// The bound a PyTorch run gives job.iterations (the user's loop ends it: finish()).
inline constexpr int kOpenEndedIterations = 1 << 30;
// Errors name the field: the profile's (profile_from_json), "unknown knob 'x' (knobs: ...)",
// 'oracle' (it sums nothing), a bad value. `servers` is ignored for all-reduce. DeFT's
// Preserver judges measured training (deft_loss_feedback is set).
Result<runtime::JobOptions> make_job(const JobSpec& spec);
// Sets the knobs (JobSpec::knobs' spelling) in `options`; errors name the knob.
Status parse_knobs(const std::vector<std::pair<std::string, std::string>>& knobs,
                   PolicyOptions* options);

// The worker a Session drives, whatever moves its gradients: the TCP parameter-server
// worker (runtime::Worker, ps_worker below) today; the gloo all-reduce worker plugs in by
// implementing these four calls over the same WorkerOptions (its compute factory and its
// tensor source: the Session's HookedCompute and the model's buffers).
class TrainingWorker {
 public:
  virtual ~TrainingWorker() = default;
  // Trains until finish() (or a failure), on the calling thread. Blocks.
  virtual Result<runtime::WorkerReport> run() = 0;
  // Thread-safe: runs `fn` on run()'s thread (the loop's), in the order posted.
  virtual void post(std::function<void()> fn) = 0;
  // Thread-safe: ends the open-ended run after `iterations` iterations (the backward passes
  // the model ran; TrainingLoop::finish_early), then run() returns.
  virtual void finish(std::int64_t iterations) = 0;
  // Thread-safe: run() fails soon with "stopped: why"; the peers see this worker go.
  virtual void request_stop(const std::string& why) = 0;
  // Thread-safe: real training's measurements for the policy (all-reduce only).
  virtual void feedback(const TrainingFeedback& f) { (void)f; }
};
using WorkerFactory =
    std::function<Result<std::unique_ptr<TrainingWorker>>(runtime::WorkerOptions)>;
// The parameter-server worker (runtime::Worker over TCP).
Result<std::unique_ptr<TrainingWorker>> ps_worker(runtime::WorkerOptions options);
// The all-reduce worker on gloo (runtime::CollectiveWorker), meeting the others through
// the store at `store` (runtime/store.h), its gloo contexts bound to `links` (this host's
// address on each link).
WorkerFactory allreduce_worker(runtime::Endpoint store, std::vector<std::string> links,
                               runtime::GlooAlgorithm algorithm = runtime::GlooAlgorithm::kRing);
// Whether `policy` is one of the all-reduce architecture's only (else the parameter
// server's, or both architectures').
bool is_allreduce_policy(const std::string& policy);
// The architecture a JobSpec runs on (JobSpec::architecture). Errors: an unknown
// architecture, a policy it does not have.
Result<Architecture> job_architecture(const JobSpec& spec);

struct SessionOptions {
  // The job every worker and server agrees on: the profile lists the model's layers in
  // the order the forward pass uses them, and its tensors in that order (their ids and
  // priorities). job.iterations is a bound: the user's loop decides, and finish() ends it.
  runtime::JobOptions job;
  int rank = 0;                                // this worker's id, in [0, job.workers)
  std::vector<runtime::Endpoint> servers;      // every server, server s at [s]
  std::vector<runtime::TensorBuffer> tensors;  // by tensor id (check_registry)
  // The job's secret (transport/auth.h): the worker authenticates to its servers or to
  // the all-reduce store with it. Null: no authentication.
  std::shared_ptr<const transport::Secret> secret;
  // Makes the worker from the options the Session filled in (compute, tensors). Null:
  // ps_worker.
  WorkerFactory make_worker;
};

class Session {
 public:
  // Validates `options`, starts the worker's thread (it connects to the servers, retrying
  // until job.connect_timeout) and `hosted`'s (when given, this process's server, already
  // listening). Errors name what is wrong (an invalid job, a registry that does not match
  // the profile).
  static Result<std::unique_ptr<Session>> start(SessionOptions options,
                                                std::unique_ptr<runtime::Server> hosted = nullptr);
  // Stops (as abort) and joins whatever still runs.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int num_layers() const { return static_cast<int>(layer_tensors_.size()); }
  int layer_of(TensorId t) const { return tensor_layer_[static_cast<std::size_t>(t)]; }

  // The model thread's calls (see above). Errors: the job failed (the first failure, e.g.
  // "worker 1: lost server 0 (...)"), or the call is out of order (a layer skipped by the
  // forward pass, a tensor reported twice in one backward).
  Status gradient_ready(TensorId tensor);
  Status enter_forward(int layer);
  Status leave_forward();
  Result<bool> sum_ready(int layer, bool wait);
  // Backward passes reported complete for `layer` so far.
  std::int64_t backwards(int layer) const;
  // Whether this job's policy delays updates (above); then sum_ready does not apply.
  bool delayed_updates() const { return delayed_; }
  // Delayed updates (above). Errors: the job failed; not a delayed-update job; an update
  // that was not due or was loaded already.
  Result<std::vector<runtime::LayerUpdate>> take_updates(int layer, std::int64_t before);
  Status load_update(const runtime::LayerUpdate& u);
  // Delayed updates: the most bytes of merged-sum buffers held at once so far (each of
  // one layer's size, from its first sum until loaded, plus a spare per layer): a few
  // times the model's size at most, however long the run and however many iterations an
  // update merges.
  std::int64_t merged_bytes_max() const;
  // Real training's measurements of an iteration (AllReducePolicy::on_feedback); worker
  // 0's steer every worker's policy. A no-op for the parameter-server policies.
  void feedback(const TrainingFeedback& f);

  // Ends the run after the last iteration the model computed, once every sum of it is in
  // (call sum_ready(l, true) for every layer first, or this waits for them itself), and
  // joins the threads. Errors: the job failed; a backward pass was left half done.
  Result<runtime::WorkerReport> finish();
  // Stops at once: this worker's connections close, so its peers fail fast too.
  void abort(const std::string& why);

 private:
  Session() = default;
  void fail(Status s);          // records the first failure, wakes waiters (mu_ held)
  Status error_locked() const;  // the failure, or "ended" once the worker returned
  void on_gate(int layer, std::int64_t iteration);  // loop thread
  void on_sums(int layer, std::int64_t iteration);  // loop thread
  // Delayed updates: the worker's calls (link threads; loop thread), through delayed_target_
  // (a runtime::DelayedUpdateTarget; the Session itself stays a plain, non-polymorphic
  // object).
  struct DelayedTarget;
  float* merged_sum(TensorId t, std::int64_t first, std::int64_t last);
  Status on_updates(std::int64_t before, const std::vector<runtime::LayerUpdate>& due);
  Status on_update_ready(const runtime::LayerUpdate& u);
  void post(void (HookedCompute::*fn)(int, TimeNs), int layer);

  SessionOptions options_;
  std::vector<int> tensor_layer_;  // by tensor id
  std::vector<std::vector<TensorId>> layer_tensors_;
  std::unique_ptr<runtime::TensorSource> source_;
  std::unique_ptr<TrainingWorker> worker_;
  std::unique_ptr<runtime::Server> server_;
  HookedCompute* compute_ = nullptr;  // owned by worker_; loop thread only
  std::thread worker_thread_, server_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_: per layer, backward passes reported complete, gradients of the current
  // one seen, gates the loop opened, and sums complete (each a count of iterations).
  std::vector<std::int64_t> backwards_, gates_, sums_;
  std::vector<int> seen_;
  int next_forward_ = 0;  // the layer the forward pass should enter next (mu_)
  Status error_;          // the first failure (mu_)
  bool worker_ended_ = false, server_ended_ = false;  // (mu_)
  bool finishing_ = false;                            // (mu_)
  // Delayed updates: per layer, the updates handed over and not yet taken, with their
  // `before`; the last `before` decided (mu_). The merged sums by (layer, first, last),
  // one buffer of the layer's size each, from the first sum scattered into it until
  // load_update, then kept as the layer's spare (one at most) or freed; the bytes
  // allocated, now and at most (merged_mu_: the link threads write into them).
  bool delayed_ = false;
  std::unique_ptr<DelayedTarget> delayed_target_;  // when delayed_
  std::vector<std::vector<std::pair<std::int64_t, runtime::LayerUpdate>>> updates_;
  std::int64_t decided_ = 0;
  mutable std::mutex merged_mu_;
  std::map<std::tuple<int, std::int64_t, std::int64_t>, std::unique_ptr<float[]>> merged_;
  std::vector<std::unique_ptr<float[]>> merged_spare_;  // by layer
  std::int64_t merged_bytes_ = 0, merged_bytes_max_ = 0;
  std::vector<std::int64_t> layer_elements_;  // by layer: the elements of its tensors
  std::vector<std::int64_t> offsets_;  // by tensor id: where its sums start in its layer's buffer
  Result<runtime::WorkerReport> report_ = internal_error("the worker has not ended");  // (mu_)
};

}  // namespace qs::pytorch
