// The local launcher: runs a Job on a real cluster of processes on this machine (one
// `quicksilver server` per parameter server, one `quicksilver worker` per worker, over
// loopback or in network namespaces with tc-shaped links), collects each worker's report,
// and puts the simulator's prediction of the same configuration beside each measurement.
// The library call behind `quicksilver run`; the Python module calls it too. Each child
// gets its job as one message (quicksilver/launch/job_message.h), a file in the run's
// private directory: `quicksilver worker --job FILE`.
//
// Emulated clusters scale bandwidth and tensor sizes down by one factor (two cores cannot
// move the paper's 10 Gbit/s per host), keeping every communication/compute ratio; the
// knobs the policy registry marks `scales` scale with them (quicksilver/policy/registry.h).
//
// Thread safety: one run_cluster at a time per process (children, namespaces, and, with
// catch_signals, the SIGINT/SIGTERM handlers are the process's).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/engine/result.h"
#include "quicksilver/runtime/netns.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/sim/simulator.h"

namespace qs {

// A local cluster runs one process per host on this machine: at most this many (workers +
// servers), within runtime::kMaxWorkers and kMaxServers, checked before anything starts.
inline constexpr int kMaxLocalProcesses = 128;

// The minimum retransmission timeout `quicksilver run --netns` gives every route unless
// told otherwise: datacenters lower Linux's 200 ms floor to a few milliseconds, and on
// links whose round trip is tens of microseconds the floor turns one lost segment into a
// stall of hundreds of round trips (docs/runtime.md).
inline constexpr TimeNs kDefaultRtoMin = 5 * kNsPerMs;

struct LaunchOptions {
  // The quicksilver executable the children run (`coordinator`/`server`/`worker`
  // subcommands, each with `--job FILE`): this build, which reads the messages it writes.
  // Required; the CLI passes "/proc/self/exe".
  std::string executable;
  // One network namespace per host, links shaped with tc (needs root); else loopback,
  // each connection paced (SO_MAX_PACING_RATE).
  bool netns = false;
  // Bandwidth and tensor sizes scaled by this factor, in (0, 1]; 0 = automatic: netns, the
  // first rate, from 4 Gbit/s over all hosts down, at which every link, all loaded at
  // once, carries its goodput with the machine 60 % idle (a start-up calibration);
  // loopback, hosts at most 4 Gbit/s / (N + M).
  double scale = 0;
  // netns only: how the emulated links queue, retransmit and acknowledge (rto_min whole
  // milliseconds); without netns, only the defaults (runtime::check_link_shaping).
  runtime::LinkShaping shaping;
  // --architecture allreduce: gloo's algorithm for every worker (empty: from the job's
  // --allreduce, ring or rhd).
  std::string gloo_algorithm;
  TimeNs timeout = 300 * kNsPerSec;  // per policy, from the first child's start
  // Every node's runtime settings (congestion control, commit window, timeouts,
  // checksums; runtime/settings.h). run_cluster checks them (check_settings).
  runtime::RuntimeSettings settings;
  // Continue with the next policy when one fails (else stop at the first failure).
  bool keep_going = false;
  // Several jobs at once on one emulated cluster (Mercury Fig. 20; needs netns, PS): each
  // with its own model, policy and knobs, its own servers and workers on the same hosts
  // (the job's workers and servers), its own emulated GPUs; they share every NIC as their
  // TCP connections do. Unscaled: run_cluster scales them as the job. Non-empty: the
  // job's own profile and policies are not run; one row per job, predicted by
  // simulate_shared (fair sharing, separate GPUs). At most kMaxSharedJobs.
  std::vector<SharedJob> shared_jobs;
  // The job's policies {"auto"} (`run --policy auto`, issue 30): the job runs in phases,
  // each on freshly started processes, and decides between them (quicksilver/sim/
  // auto_planner.h): the architecture's start policy for 2 warm-up and min(8, this)
  // measured iterations, then the policy decided for this many, and so on; near-ties are
  // measured for 2 + 8 iterations each. One row, "auto", of every phase's iterations.
  int auto_replan_every = 200;
  bool auto_allow_stale = false;  // DeFT among the candidates (its updates are delayed)
  // Fault injection (tests): this worker dies abruptly at the start of this iteration.
  int kill_worker = -1;
  int kill_at_iteration = 1;
  // SIGINT/SIGTERM/SIGHUP stop the run (children killed, namespaces, bridge and temporary
  // directory removed) instead of the process; the previous handlers are restored at the
  // end.
  bool catch_signals = true;
  // Progress messages as they happen: a policy's failure ("mercury: ..."), a warning.
  // Also collected in ClusterRunResult::messages. May be empty.
  std::function<void(std::string_view)> log;
  // What the run is doing now ("calibrating the emulated cluster", "mercury (policy 3 of
  // 7)"), for a progress line. May be empty.
  std::function<void(std::string_view)> progress;
};

struct ClusterRunResult {
  // The job as run: bandwidth, schedule, profile and scaling knobs scaled by `scale`.
  Job job;
  // One row per policy that ran to completion, in job order: measured (iteration times:
  // per iteration the slowest worker's; link utilisation: the median worker's, relative
  // to the goodput) and the simulator's prediction at the goodput.
  std::vector<ResultRow> rows;
  // workers[i]: rows[i]'s per-worker reports, worker 0 first.
  std::vector<std::vector<runtime::WorkerReport>> workers;
  // Policies that failed, each with why (the run stops at the first unless keep_going).
  std::vector<std::pair<std::string, Status>> failures;
  double scale = 1;
  TimeNs rto_min = 0;        // LaunchOptions::rto_min as run (0: the kernel's default)
  bool quickack = false;     // LaunchOptions::quickack as run
  TimeNs switch_buffer = 0;  // LaunchOptions::switch_buffer as run (netns; 0: none)
  TimeNs host_queue = 0;     // LaunchOptions::host_queue as run (netns; 0: none)
  Bytes gso_max = 0;         // LaunchOptions::gso_max as run (netns; 0: the kernel's)
  // netns: the start-up calibration of the whole cluster, every link loaded at once, as
  // run ("8 links at once at 500Mbps: goodput 95.3% (least 94.9%), CPU idle 61.0%; tried
  // before: ..."), and the machine's idle share during it. Empty and -1 without.
  std::string calibration;
  double calibration_cpu_idle = -1;
  // The links' measured TCP goodput as a fraction of the nominal rate (netns: iperf3 on
  // every link at once, the median link's: the reference of predictions and utilisation);
  // none on loopback (paced payload: 1 by construction).
  std::optional<double> goodput_fraction;
  bool interrupted = false;  // a signal stopped the run (catch_signals)
  // Everything `log` was given, in order.
  std::vector<std::string> messages;
  // "measured (...; bandwidth and tensor sizes scaled by ..., ...)": what the measurement
  // is, for a table's title.
  std::string describe() const;
};

// Runs every policy of `job` (PS architecture) on a local cluster, one after another.
// "oracle" moves no byte: its workers run the compute chain alone (`quicksilver run` leaves
// it out; its figure is the simulator's). Errors (nothing ran): invalid job or options for
// a real cluster (message names the flag: --architecture, --latency, --bandwidth-trace,
// --congestion, --scale),
// no temporary directory, no namespaces. A policy's failure is not an error: it is in
// `failures`.
Result<ClusterRunResult> run_cluster(Job job, const LaunchOptions& options);

// What launchers that no longer run left behind (docs/cli.md `quicksilver cleanup`): their
// temporary directories (qs-run-<pid>-*, in the temporary directory); with root, their
// clusters' namespaces, processes inside them, bridges and veths, and the allowed
// congestion controls (runtime::NetnsCluster::cleanup_stale). A live launcher's are never
// touched. `dry_run`: only says what it would remove. run_cluster cleans the directories
// itself, and NetnsCluster::create the rest, so a later run tidies up after a killed one.
using runtime::StaleCleanup;
StaleCleanup cleanup_stale_runs(bool dry_run = false);
// The temporary directories alone (any user).
StaleCleanup cleanup_stale_run_dirs(bool dry_run = false);

// `p` with every tensor's element count scaled by `scale` (at least 1 element each).
Profile scale_profile(const Profile& p, double scale);
// Every byte knob the registry marks `scales`, scaled by `scale` (a multiple of 4 bytes,
// at least 4).
void scale_policy_options(PolicyOptions* o, double scale);

// `run --netns`'s automatic scale: the start-up calibration's first candidate, in bit/s over
// all the hosts' links, on a machine whose launcher may run on `cores` cores (1 Gbit/s per
// core, at least 4 Gbit/s; docs/runtime.md, "The start-up calibration").
double calibration_start_rate(int cores);

}  // namespace qs
