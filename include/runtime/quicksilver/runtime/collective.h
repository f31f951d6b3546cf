// The all-reduce runtime (issue 13; MG-WFBP, DeFT and the all-reduce baselines for real):
// N workers, each running the one training loop (engine/training_loop.h) over
//   - its node's event loop as the Timer,
//   - the GPU emulated from the profile (or a real one, torch/) as the Compute,
//   - gloo collectives as the Exchange: one gloo context per link over TCP, each driven by
//     a thread that runs one collective at a time (MG-WFBP's link model), in the order,
//     grouping and timing the policy decides, while compute runs alongside.
// The policies are the simulator's (policy/allreduce_policy.h), built after a start-up
// calibration: every worker times its own all-reduce over a size sweep on each link, the
// workers average the times (so that every one fits the same numbers) and fit
// T_ar(M) = a + b*M by least squares, as MG-WFBP does (its section II-D); DeFT's second
// link's slowdown mu is b1 / b0 of the two fits.
//
// Agreement: gloo matches collectives by the order in which ranks call them, but a policy
// may issue buckets in an order that depends on timing (a credit window refilled by
// completions). The workers therefore agree on each link's order as Horovod's coordinator
// does: every worker reports each bucket it issued to worker 0 (a 16-byte message on a
// control context); worker 0 runs, on each link, the earliest bucket that every worker
// has issued and tells the others which one (another 16 bytes) before it starts it.
// Buckets are matched across workers by their content (iterations and chunks), not by the
// policy's id. And since a policy may also cut its buckets by timing (DeFT's knapsacks,
// ByteScheduler's fusion), worker 0's policy decides for all: the others replay its
// inputs, with its times, on replicas (collective_worker.cc).
//
// Rendezvous: the contexts find each other through a store served by the job's
// coordinator (quicksilver/runtime/store.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/engine/compute.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/communicator.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/transport/auth.h"

namespace qs::runtime {

// gloo's all-reduce algorithms (`--allreduce-algorithm`).
enum class GlooAlgorithm { kRing, kRingChunked, kHalvingDoubling, kBcube };
// "ring", "ring-chunked", "halving-doubling", "bcube".
Result<GlooAlgorithm> parse_gloo_algorithm(std::string_view name);
std::string_view gloo_algorithm_name(GlooAlgorithm a);
// Whether this build has the all-reduce runtime (QS_WITH_GLOO).
bool have_gloo();

// Checks a job for the all-reduce runtime before anything starts: workers, iterations, the
// profile (float32 tensors), the policy (one of the all-reduce architecture's) and its
// collectives per iteration. Errors name the field.
Status validate_collective_job(const JobOptions& job);

struct CollectiveOptions {
  // The job: profile, policy and its knobs, workers (servers ignored), iterations,
  // bandwidth (the nominal rate, for the utilisation figure), connect and peer timeouts.
  JobOptions job;
  int rank = 0;
  Endpoint store;  // the coordinator's store
  // The cluster secret the store demands (null: none). gloo's own connections are not
  // authenticated: their addresses come only from the authenticated store
  // (docs/reliability.md).
  std::shared_ptr<const transport::Secret> secret;
  // One address of this host per link, in link order: each link's gloo context binds
  // there (one subnet per link: the connecting side does not bind, routing picks the
  // interface). One entry, or two for DeFT's second link.
  std::vector<std::string> links = {"127.0.0.1"};
  GlooAlgorithm algorithm = GlooAlgorithm::kRing;
  double compute_factor = 1.0;
  // The gradient and sum buffers; nullptr: known content, every sum checked exactly.
  TensorSource* tensors = nullptr;
  bool verify = true;
  int warmup = 1;
  bool record_trace = false;
  // Calibration: each size of the sweep is timed this many times (the median counts).
  int calibration_repeats = 5;
  // Fault injection (tests): exit abruptly at the start of this iteration (-1: never).
  int die_at_iteration = -1;
  // Fault injection (tests): reach worker `via_rank`'s link-0 gloo device through `via`
  // (a fault proxy forwarding to it, tools/faultproxy.py) instead of the address it
  // published (-1: none). gloo lets the side with the greater address connect: `via` must
  // compare as this worker's link address does with the real one (its IPv4 address on the
  // same side). IPv4 only.
  int via_rank = -1;
  Endpoint via;
  // Where the worker says where its gloo pairs listen, as it publishes them ("worker 0:
  // link0 pairs listen at [127.0.0.1]:41234 (worker 1)"); null: nowhere.
  std::function<void(const std::string&)> log;
  // Fault injection (tests): called on a link thread with every gradient message this
  // worker receives (the link, the sender's rank, its bytes), before its checksum is
  // checked, to corrupt it as a faulty wire would. Null: none.
  std::function<void(int link, int from, std::byte* data, std::size_t bytes)> tamper_received;
  // The device the loop drives (as WorkerOptions::compute): null, the GPU emulated from
  // the profile; else called once with the worker's Timer. A real compute (PyTorch)
  // reports from other threads through CollectiveWorker::post().
  std::function<std::unique_ptr<Compute>(Timer& timer)> compute;
  // The collective engine (communicator.h): null, gloo over TCP (store, secret, links,
  // algorithm, via and log above are its settings); else called once, on the thread that
  // runs run(), for this rank's connected engine (its rank, size and number of links must
  // be the job's: rank, job.workers, links.size()).
  std::function<Result<std::unique_ptr<Communicator>>()> communicator;
};

// One all-reduce worker (the counterpart of runtime.h's Worker, with the same controls).
class CollectiveWorker {
 public:
  // Validates the options (no network yet).
  static Result<std::unique_ptr<CollectiveWorker>> create(CollectiveOptions options);
  ~CollectiveWorker();
  // Meets the others, calibrates, builds the policy, trains, meets them again. Blocks. The
  // report's all-reduce fields carry the fitted costs (one per link) and the policy's notes.
  Result<WorkerReport> run();
  // Thread-safe: runs `fn` on the worker's loop thread.
  void post(std::function<void()> fn);
  // Thread-safe: ends an open-ended run at the next iteration boundary
  // (TrainingLoop::finish_early; `iterations` >= 0: exactly that many). Every worker must
  // end after the same iteration.
  void finish(std::int64_t iterations = -1);
  // Thread-safe: makes run() fail soon with "stopped: why".
  void request_stop(const std::string& why);
  // Thread-safe: real training's measurements of an iteration for the policy
  // (AllReducePolicy::on_feedback). Worker 0's count: the other workers apply worker 0's,
  // replicated, and ignore their own.
  void feedback(const TrainingFeedback& f);

  struct Impl;

 private:
  explicit CollectiveWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// create() then run().
Result<WorkerReport> run_collective_worker(const CollectiveOptions& options);

}  // namespace qs::runtime
