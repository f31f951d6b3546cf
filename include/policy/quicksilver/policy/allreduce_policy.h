// The all-reduce scheduling policy: a pure event-driven state machine that decides which
// gradient bytes are all-reduced together (buckets), in which order, on which link, and
// when the next forward of each layer may start. Driven by the simulator's all-reduce
// engine (sim/allreduce_engine.cc) and by the runtime's gloo path; it never reads a clock,
// a socket or an environment variable (STYLE.md): time comes in as `now`, decisions go out
// through a CollectiveSink.
//
// Life of a gradient byte, identical in both engines:
//   1. the backward of layer l ends      -> policy.on_gradient_ready(l, now, sink)
//   2. policy calls sink.all_reduce(b, d) -> after d (user-level startup) the bucket enters
//      its link's queue (FIFO, or lowest `priority` first under kPriority); a link runs one
//      collective at a time (MG-WFBP's model), taking T_ar(bytes) = a + b*bytes.
//   3. the collective completes on every worker -> policy.on_collective_done(b, now, sink)
//   4. the forward of layer l (next iteration) starts when the gate allows it:
//        kAfterAll  every collective carrying this iteration's gradients is done
//                   (MG-WFBP Algorithm 2 line 12, "WaitForLastCommunicationFinished");
//        kPerLayer  every byte of layer l of this iteration is reduced (priority schemes);
//        kPolicy    policy.forward_ready(l) says so (DeFT's delayed updates: the forward may
//                   run on stale parameters). Under kPolicy the next backward also waits
//                   for policy.backward_ready().
// Every byte of every iteration must be all-reduced exactly once, possibly merged with the
// same bytes of other iterations (bucket.first_iteration..last_iteration: the worker sums
// those iterations' gradients locally, then reduces once) and possibly late; after the
// last iteration the engine calls on_training_end() so that a policy that holds gradients
// back issues them. All workers must cut the same buckets in the same order (a collective
// is matched across workers by its position in the link's sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/policy/options.h"

namespace qs {

// T_ar(M) = a + b*M (MG-WFBP eq. 9 and Table II); the policies plan with it, the engine
// charges it.
struct AllReduceCost {
  TimeNs a = 0;
  double b_ns_per_byte = 0;
  // a + round(b*m). Precondition: m >= 0.
  TimeNs time(Bytes m) const;
};

// One collective: the chunks reduced together, in this order.
struct CollectiveBucket {
  std::vector<Chunk> chunks;
  int link = 0;      // 0: the primary link; 1: DeFT's second (slower) link (III-C)
  int priority = 0;  // smaller is more urgent; orders the link queue under kPriority
  // The gradients of iterations first_iteration..last_iteration (inclusive) are summed
  // locally and reduced by this one collective (DeFT's merged buckets); equal otherwise.
  std::int64_t first_iteration = 0;
  std::int64_t last_iteration = 0;
  std::uint64_t id = 0;  // chosen by the policy, unique within a run; echoed back

  Bytes bytes() const;
};

// Where a policy's decisions go. Implemented by each engine.
class CollectiveSink {
 public:
  virtual ~CollectiveSink() = default;
  // Queues `bucket` on its link `delay` ns from now (0 = immediately).
  virtual void all_reduce(const CollectiveBucket& bucket, TimeNs delay) = 0;
};

enum class ForwardGate { kAfterAll, kPerLayer, kPolicy };

// What real training measured over one iteration, for a policy that judges its schedule
// by convergence (DeFT's Preserver, IV-C: "the Profiler collects convergence-related
// information and submits it to the Preserver"). The integration that trains a real model
// fills it in (quicksilver.torch); engines with emulated compute never call it.
struct TrainingFeedback {
  std::int64_t iteration = 0;  // the backward pass it was measured on
  double loss = 0;             // the training loss s_t
  double grad_sq = 0;          // mu_t: the squared norm of the averaged gradient
  double noise = 0;            // sigma_t: the per-sample deviation of the gradient along
                               // itself (0: not measurable, e.g. one worker)
  double lr = 0;               // the optimizer's learning rate eta
  double batch = 0;            // samples per iteration over all workers (B)
};
enum class LinkDiscipline { kFifo, kPriority };

// What a policy may know about the job when it is constructed.
struct AllReduceContext {
  const Profile* profile = nullptr;
  const TensorLayout* layout = nullptr;
  int workers = 1;
  // The cost of a collective on each link at the nominal rate: one entry, or two when the
  // cluster has DeFT's second link. Precondition: non-empty.
  std::vector<AllReduceCost> links;
  // The slowest worker's compute slowdown: every collective waits for it, so the policies
  // plan with the profile's times scaled by it.
  double compute_factor = 1.0;
};

class AllReducePolicy {
 public:
  virtual ~AllReducePolicy() = default;

  virtual std::string_view name() const = 0;
  // False only for the oracle: no gradient is reduced.
  virtual bool communicates() const { return true; }
  virtual ForwardGate forward_gate() const = 0;
  virtual LinkDiscipline discipline() const { return LinkDiscipline::kFifo; }
  // Whether every worker's copy issues the same buckets, in the same order on each link,
  // whatever the timing: the buckets are a function of the job alone, issued only from
  // on_gradient_ready (which every worker calls for the same layers in the same order).
  // A runtime then runs each worker's own buckets in its own order, with no round trip
  // through worker 0 (runtime/collective/agreement.h). False: worker 0 decides for all.
  virtual bool fixed_order() const { return false; }

  // The backward pass of iteration `iteration` starts (its gradients follow).
  virtual void on_iteration_start(std::int64_t iteration, TimeNs now, CollectiveSink& out) {
    (void)iteration, (void)now, (void)out;
  }
  // The backward of `layer` ended: all its tensors' gradients are ready. Called for every
  // layer, from the last to layer 0; layer 0's call marks the end of the backward pass.
  virtual void on_gradient_ready(int layer, TimeNs now, CollectiveSink& out) = 0;
  // The forward of `layer` (next iteration) starts at `now`.
  virtual void on_forward_start(int layer, TimeNs now, CollectiveSink& out) {
    (void)layer, (void)now, (void)out;
  }
  // A collective this policy issued completed on every worker.
  virtual void on_collective_done(const CollectiveBucket& bucket, TimeNs now, CollectiveSink& out) {
    (void)bucket, (void)now, (void)out;
  }
  // kPolicy gate only: may the forward of `layer` start now? Re-asked after every
  // completed collective while the answer is no.
  virtual bool forward_ready(int layer) const {
    (void)layer;
    return true;
  }
  // kPolicy gate only: may the next iteration's backward start now?
  virtual bool backward_ready() const { return true; }
  // The first iteration of the range that `iteration`'s gradients are summed into: every
  // bucket carrying them will cover first_iteration = this .. some last >= iteration
  // (DeFT's future task queue); `iteration` itself where they merge with no older ones.
  // Decided by on_iteration_start(iteration) at the latest and asked between that call and
  // the next on_iteration_start (a merging policy may answer -1 for any other). It lets an engine
  // keep one running sum per range of iterations instead of a copy of each iteration's gradients.
  virtual std::int64_t merged_from(std::int64_t iteration) const { return iteration; }
  // Real training's measurements of one iteration (TrainingFeedback). Workers apply the
  // same feedback at the same point of their inputs (worker 0's, replicated), so any
  // decision it changes is the same on every worker.
  virtual void on_feedback(const TrainingFeedback& f, TimeNs now, CollectiveSink& out) {
    (void)f, (void)now, (void)out;
  }
  // The last iteration ended: issue every gradient still held back.
  virtual void on_training_end(TimeNs now, CollectiveSink& out) { (void)now, (void)out; }
  // Human-readable policy-specific reports (DeFT's update frequency, batch sizes, ...).
  virtual std::vector<std::string> report() const { return {}; }
};

// The policies available on the all-reduce architecture, in display order (built-in:
// oracle wfbp synceasgd mgwfbp mgwfbp-opt ddp bytescheduler usbyte deft).
std::vector<std::string> allreduce_policy_names();

// Builds the (per-job, all workers identical) policy through the registry
// (include/policy/quicksilver/policy/registry.h). Errors: unknown name, a name that
// exists only for the parameter-server architecture, invalid options.
Result<std::unique_ptr<AllReducePolicy>> make_allreduce_policy(std::string_view name,
                                                               const PolicyOptions& options,
                                                               const AllReduceContext& context);

}  // namespace qs
