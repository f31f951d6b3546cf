// The real parameter-server runtime (DESIGN.md "Transport and runtime"; Mercury IV-C):
// N workers and M servers over TCP, driving the same qs::PsPolicy objects as the simulator.
//
// Worker: emulates compute from the profile (backward L..1, then per layer: wait for its
// parameters, update + forward), fills real float32 gradients with known content, drives
// its policy exactly like sim/ps_engine.cc (callbacks in; PushSink::push(unit, delay) out,
// the delay honoured by a timer; on_push_acked on each ack), sends through one Sender
// across all server connections, and checks every pulled sum exactly.
// Server: sums each arriving push in place into its accumulation buffer, acknowledges it,
// and once all N workers contributed a unit, sends the sum to every worker in the
// policy's server discipline.
//
// Each node runs on one thread (its EventLoop); run_worker/run_server block. Several nodes
// may run in one process (tests) or one per process (the CLI's launcher).
//
// Rendezvous: servers listen; workers connect to every server (retrying until
// connect_timeout) and send hello{worker id, N, M, profile hash, config hash}; the server
// answers hello or an error naming the mismatch and closes. A peer that dies is detected
// at once on a closed socket; a peer or link that stalls within 1.25 x `peer_timeout`
// (every connection carries a heartbeat when idle, so silence is a fault, never a pause);
// a peer that is alive but makes no progress within 2.25 x `peer_timeout` (a server whose
// sums wait; a worker that waits notices after 3 x, the servers' verdict coming first). A server
// that loses a worker closes all its connections, so the others fail fast too. Every frame carries
// CRC32C checksums (transport/wire.h): a corrupted frame fails the job, naming the peer, and is
// never summed (docs/reliability.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/trace_span.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/compute.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/runtime/settings.h"
#include "quicksilver/runtime/tensors.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/socket.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 0;
};

// The runtime's job sizes, checked by every runtime entry point (server, worker,
// coordinator, the local launcher) before any work: a server sums N workers' pushes on one
// thread (N) and a worker keeps a connection per server (M, within the open-file limit).
inline constexpr int kMaxWorkers = 64;
inline constexpr int kMaxServers = 1024;
// "--workers must be in 1..64" / "--servers must be in 1..1024", or OK.
Status check_job_size(int workers, int servers);

// The job as every node of it runs it, and what they must agree on (hashed into the
// hello): its shape, its policy, and the runtime's settings (settings.h: congestion
// control, commit window, timeouts, checksums).
struct JobOptions : RuntimeSettings {
  Profile profile;
  std::string policy = "mercury";
  PolicyOptions policy_options;
  int workers = 2;  // N
  int servers = 1;  // M
  int iterations = 5;
  // The nominal NIC rate, given to policies that plan with it (prophet) until their
  // bandwidth monitor has a measurement.
  Rate bandwidth = Rate::gbps(10);
  // Buffers, pacing; its congestion control is RuntimeSettings::congestion (socket_options).
  transport::SocketOptions socket;
  // Gradient elements on the wire (transport/wire.h): float32, or bf16/fp16 with float32
  // sums (the servers'; the all-reduce's partial sums, rounded at each hop).
  transport::WireDType wire_dtype = transport::WireDType::kFloat32;
};

// Checks a job before any node starts: sizes (check_job_size), the profile (float32
// tensors, at most 65534 of them), the policy, and its units per iteration
// (check_unit_budget). Server::create and run_worker call it; callers that want bad input
// reported before they start anything (the CLI) call it first. Errors name the field.
Status validate_job(const JobOptions& job);

struct WorkerOptions {
  JobOptions job;
  int worker_id = 0;
  std::vector<Endpoint> servers;  // server s at servers[s]; size must equal job.servers
  // Compute slowdown: every profiled time is multiplied by this (1 = as profiled, 0 = no
  // compute wait at all).
  double compute_factor = 1.0;
  // The gradient and parameter buffers (not owned; must outlive run()). nullptr: synthetic
  // tensors with known content (KnownContent), their sums checked exactly when `verify`.
  TensorSource* tensors = nullptr;
  bool verify = true;
  // The NIC rate to compare measured uplink throughput with (0 = unknown).
  Rate nic_rate{0};
  int warmup = 1;  // leading iterations left out of medians
  // Fault injection for tests: at the start of this iteration's backward, abort every
  // connection (RST) and fail as a crashed worker would (-1 = never).
  int die_at_iteration = -1;
  // Record the measured timeline (WorkerReport::trace).
  bool record_trace = false;
  // The cluster secret (ServerOptions::secret): the worker proves it knows it, and every
  // server must prove the same, before the hello. Null: no authentication.
  std::shared_ptr<const transport::Secret> secret;
  // The device the loop drives. Null: the GPU emulated from the profile (EmulatedCompute,
  // compute_factor applies). Otherwise called once, in create(), with the worker's Timer
  // (its event loop); the compute lives as long as the worker. A real compute (PyTorch's
  // hooks, torch/) reports from other threads through Worker::post(). Whatever moves the
  // gradients (this TCP worker, or an all-reduce one) takes the same factory.
  std::function<std::unique_ptr<Compute>(Timer& timer)> compute;
  // Called once, on the worker's loop, as training begins (every server has said hello;
  // the first backward pass starts next). The launcher starts a time-varying bandwidth
  // trace then, so that every run meets the trace at the same point of its training.
  std::function<void()> on_training_start;
};

struct ServerOptions {
  JobOptions job;
  int server_id = 0;
  Endpoint listen;  // port 0 = ephemeral (Server::port() tells which)
  // The cluster secret every worker must prove it knows before its hello is read
  // (transport/auth.h; docs/reliability.md). Null: no authentication (in-process tests, a
  // trusted network); the CLI refuses that unless told --insecure.
  std::shared_ptr<const transport::Secret> secret;
  // What peers that have not said hello may hold: a deadline, a cap, a pause when out of
  // descriptors.
  transport::AcceptLimits limits;
  // One line per refused peer and per paused accept (never job details). May be empty.
  std::function<void(std::string_view)> log;
};

struct WorkerReport {
  int worker_id = 0;
  std::string policy;
  std::string congestion_control;  // what the kernel reports on the data sockets
  std::vector<TimeNs> iteration_times;
  TimeNs median_iteration = 0;  // over iterations after the warm-up
  Bytes bytes_pushed_per_iteration = 0;
  std::int64_t units_per_iteration = 0;
  // Uplink while pushing: bytes handed to the kernel (headers included) over the time the
  // sender had backlog, per iteration; median after warm-up.
  double uplink_gbps = 0;
  double uplink_utilisation = 0;  // uplink_gbps / nic_rate (0 when nic_rate is unknown)
  // How a push period's end was dated: "transmit timestamps" (the last byte left the host)
  // or "acknowledgements" (the servers' TCP acknowledged it; the kernel gave no timestamps).
  std::string push_end;
  // Sending-buffer queueing delay (enqueue -> handed to the socket), all units and the
  // most urgent layer's units (layer 1), over iterations after the warm-up: percentiles of
  // a uniform sample of at most 4096 units each (qs::Reservoir; exact up to that many),
  // the maximum exact.
  TimeNs queue_delay_p50 = 0, queue_delay_p99 = 0, queue_delay_max = 0;
  TimeNs urgent_delay_p50 = 0, urgent_delay_p99 = 0, urgent_delay_max = 0;
  // Acknowledgement round trip: from a unit's last byte handed to the kernel to its
  // server's acknowledgement arriving (serialisation, the path both ways, and both
  // processes' wake-ups), percentiles 10 and 50 over the same units; 0 when none.
  TimeNs ack_rtt_p10 = 0, ack_rtt_p50 = 0;
  int iterations_verified = 0;  // iterations whose every pulled element was checked
  // What TCP repaired on this worker's connections (its pushes), per iteration:
  // retransmitted segments, and retransmission timeouts (empty on kernels before 6.7).
  std::vector<std::int64_t> retransmits, timeouts;
  // When the first backward pass began, on the loop's clock (CLOCK_MONOTONIC, the same in
  // every process of one machine): where the simulator's time 0 falls.
  TimeNs first_backward_at = 0;
  // With WorkerOptions::record_trace, the measured timeline, named as the simulator names
  // its spans, time 0 = the first backward pass (as in the simulator): track 0 the
  // emulated GPU ("bp"/"fp" per layer), track 1 the uplink ("pushing": from a layer's
  // gradients being ready until every ready byte is acknowledged), track 2 the downlink
  // ("pull <tensor>": one per pulled frame, from its header to its last byte).
  std::vector<TraceSpan> trace;
  // All-reduce workers (collective.h): each link's T_ar(M) = a + b*M as fitted at
  // start-up (MG-WFBP II-D), the same on every worker; and the policy's report lines.
  std::vector<AllReduceCost> allreduce_fit;
  std::vector<std::string> notes;
  // All-reduce workers under delayed updates (DeFT): the most staging buffers (each the
  // size of the model's gradients: a running sum per range of iterations, an iteration a
  // replica set aside, a spare) held at once; 0 otherwise.
  std::int64_t staging_buffers_max = 0;
  std::string to_string() const;
};

class Worker {
 public:
  // Validates options and builds the policy (no network yet).
  static Result<std::unique_ptr<Worker>> create(WorkerOptions options);
  ~Worker();
  // Connects, trains job.iterations iterations, says bye. Blocks.
  Result<WorkerReport> run();
  // Thread-safe: makes run() fail soon with "stopped: why".
  void request_stop(const std::string& why);
  // Thread-safe: runs `fn` on the worker's loop thread (after the current batch of events,
  // in the order posted). How a real compute's hooks reach their Compute.
  void post(std::function<void()> fn);
  // Thread-safe: ends an open-ended run (job.iterations a bound) at the next iteration
  // boundary (TrainingLoop::finish_early), says bye, and lets run() return. Called before
  // training began, the worker says bye right after the rendezvous. `iterations` >= 0:
  // exactly that many (TrainingLoop::finish_early).
  void finish(std::int64_t iterations = -1);

 private:
  struct Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Server {
 public:
  // Validates options and starts listening (so port() is known before run()).
  static Result<std::unique_ptr<Server>> create(ServerOptions options);
  ~Server();
  int port() const;
  // Serves until all N workers said bye (OK) or a failure. Blocks.
  Status run();
  // After run(): what TCP repaired on this server's connections (its acknowledgements and
  // pulls: the incast direction), per iteration: retransmitted segments and
  // retransmission timeouts (timeouts empty on kernels before 6.7). A server learns that
  // iteration k is over when the first push of k + 1 arrives, so a repair near that
  // boundary may be counted in the neighbouring iteration.
  struct Repairs {
    std::vector<std::int64_t> retransmits, timeouts;
  };
  const Repairs& repairs() const;
  // Thread-safe, at any time: connections accepted so far, refused before their hello
  // (authentication failed, bad hello, deadline, evicted), pending now (accepted, not yet
  // identified), held now (every connection whose state the server keeps: pending,
  // workers', closed ones not yet freed), and accepts that failed for lack of descriptors
  // or memory.
  struct Counters {
    std::int64_t accepted = 0, refused = 0;
    int pending = 0, held = 0;
    std::int64_t accept_failures = 0;
  };
  Counters counters() const;
  void request_stop(const std::string& why);

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

Result<WorkerReport> run_worker(const WorkerOptions& options);
Status run_server(const ServerOptions& options);

// The hashes carried by hello: both must match across all nodes of a job.
std::uint64_t profile_hash(const Profile& p);
std::uint64_t config_hash(const JobOptions& job);

}  // namespace qs::runtime
