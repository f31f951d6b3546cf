// The parameter-server scheduling policy: a pure event-driven state machine, one instance
// per worker, driven identically by the simulator (sim/) and the real runtime (runtime/).
//
// A policy never reads a clock, a socket or an environment variable (STYLE.md): time
// comes in as `now`, decisions go out through a PushSink. The engine owns everything
// else: the worker's transport queue (ordered by `discipline()`), the links, the servers
// and the compute chain.
//
// Life of a gradient byte, identical in both engines:
//   1. backward of layer l ends        -> policy.on_gradient_ready(l, now, sink)
//   2. policy calls sink.push(unit, d)  -> after d (user-level startup) the unit enters the
//      worker's transport queue; the sender takes the most urgent unit (kPriority: lowest
//      `priority`, then FIFO; kFifo: arrival order) whenever the uplink is free.
//   3. the unit's server receives it    -> acknowledges it to the worker
//                                          (policy.on_push_acked) and sums it in place
//   4. all N workers' copies of a unit are summed -> the server queues the sum for every
//      worker (its outbound queue uses server_discipline()): the pull is per unit.
//   5. all bytes of layer l are pulled  -> layer l's update and forward may run.
// Every unit of an iteration must be pushed exactly once and all workers must cut the
// same units (the server matches copies by (tensor, offset, length)).
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

enum class QueueDiscipline {
  kFifo,      // the order units entered the queue (ZeroMQ / ps-lite / MXNet native)
  kPriority,  // lowest priority value first, FIFO among equals (Mercury IV-C)
};

struct PushUnit {
  Chunk chunk;
  int server = 0;    // placement owner of every byte of `chunk`
  int priority = 0;  // smaller is more urgent
};

// Where a policy's decisions go. Implemented by each engine.
class PushSink {
 public:
  virtual ~PushSink() = default;
  // Hands `unit` to the transport queue `delay` ns from now (0 = immediately).
  virtual void push(const PushUnit& unit, TimeNs delay) = 0;
};

// What a policy may know about the job when it is constructed.
struct PsContext {
  const Profile* profile = nullptr;
  const TensorLayout* layout = nullptr;
  const Placement* placement = nullptr;
  int workers = 1;
  int servers = 1;
  Rate bandwidth{10'000'000'000};  // nominal NIC rate; on_bandwidth_estimate() updates it
  TimeNs latency = 0;              // one-way per-message latency
  // This worker's compute slowdown: its GPU runs every profiled time times this factor
  // (EmulatedCompute, ClusterConfig::compute_factor, WorkerOptions::compute_factor), so a
  // policy that plans with the profile's times (Prophet's windows) scales them by it
  // (scale_time). Workers may differ: each worker's policy gets its own.
  double compute_factor = 1.0;
};

class PsPolicy {
 public:
  virtual ~PsPolicy() = default;

  virtual std::string_view name() const = 0;
  // False only for the oracle: no gradient leaves the worker.
  virtual bool communicates() const { return true; }
  virtual QueueDiscipline discipline() const = 0;
  virtual QueueDiscipline server_discipline() const { return discipline(); }
  // Whether on_push_acked() matters to this policy. When false the engines may skip
  // delivering acknowledgements (the simulator saves an event per unit).
  virtual bool wants_acks() const { return true; }
  // Whether the policy schedules its own packets one at a time per sender (Mercury: the
  // most urgent packet next). The simulator then keeps each uplink to one unit at a time
  // whatever ClusterConfig::link_sharing says, so that the packets' priority order holds.
  virtual bool packet_level() const { return false; }
  // Whether the policy keeps at most one unit of a worker in flight until it is
  // acknowledged (stop-and-wait: P3, or a credit window of one partition). The runtime's
  // sender then has one short unit per worker on the wire at a time, which the kernel
  // takes whole and the links queue whole as one burst, so the simulator keeps the
  // per-message model for it under any ClusterConfig::link_sharing, as for packet_level().
  virtual bool stop_and_wait() const { return false; }

  // The backward pass of iteration `iteration` starts (its gradients follow).
  virtual void on_iteration_start(std::int64_t iteration, TimeNs now, PushSink& out) {
    (void)iteration, (void)now, (void)out;
  }
  // The backward of `layer` ended at `now`: all its tensors' gradients are ready.
  virtual void on_gradient_ready(int layer, TimeNs now, PushSink& out) = 0;
  // The forward of `layer` (next iteration) starts at `now`.
  virtual void on_forward_start(int layer, TimeNs now, PushSink& out) {
    (void)layer, (void)now, (void)out;
  }
  // The server acknowledged `unit` (it has all of this worker's bytes of it).
  virtual void on_push_acked(const PushUnit& unit, TimeNs now, PushSink& out) {
    (void)unit, (void)now, (void)out;
  }
  // A new estimate of this worker's available bandwidth (Prophet's monitor).
  virtual void on_bandwidth_estimate(Rate rate, TimeNs now) { (void)rate, (void)now; }
  // Lines for the result's notes after the run (e.g. what Prophet's monitor read), so a
  // user can see what the policy planned with; both engines print worker 0's.
  virtual std::vector<std::string> report() const { return {}; }
};

// Checks a unit a policy pushed against the job: a known tensor, a non-empty range that
// one server owns entirely (the placement), a priority in [0, num_tensors]. Both engines
// call it on every push, so a faulty policy is an error naming what is wrong.
Status check_push_unit(const PushUnit& u, const TensorLayout& layout, const Placement& placement);

// The names of all registered policies (include/policy/quicksilver/policy/registry.h): the PS ones,
// then those only on all-reduce.
std::vector<std::string> all_policy_names();
// The PS-architecture ones, in display order (built-in: oracle wfbp p3 tictac bytescheduler
// prophet mercury-nopreempt mercury).
std::vector<std::string> ps_policy_names();
bool is_known_policy(std::string_view name);

// Builds one worker's policy through the registry. Errors: unknown name (listing the
// known ones), a name that exists only for all-reduce, invalid options (e.g. packet_size 0).
Result<std::unique_ptr<PsPolicy>> make_ps_policy(std::string_view name,
                                                 const PolicyOptions& options,
                                                 const PsContext& context);

}  // namespace qs
