// The result of a run, simulated or measured: one type for both engines, so that the
// runtime's measurement and the simulator's prediction are printed and compared the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quicksilver/core/trace_span.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/model/profile.h"

namespace qs {

struct SimResult {
  std::string policy;
  TimeNs iteration_time =
      0;  // median (or mean: SimOptions::statistic) of the steady-state iterations
  std::vector<TimeNs> iteration_times;  // all iterations, warm-up included
  double samples_per_second = 0;        // global: workers * batch / iteration
  double scaling_efficiency = 0;  // oracle iteration / iteration (Mercury's "normalised speed")
  TimeNs compute_time = 0;        // the oracle's iteration time (worker 0)
  TimeNs gpu_idle = 0;            // iteration - compute, worker 0
  // Uplink busy time over the time spent pushing: from a layer's gradients being ready
  // until every ready byte is on the wire (Mercury III-B, Fig. 6: throughput averaged over
  // the time push operations run). Compute gaps with nothing to send do not count; a
  // scheduler's own waits (credit, stop-and-wait, startup) do. Worker 0, median over
  // steady-state iterations.
  double link_utilisation = 0;
  Bytes bytes_pushed_per_iteration = 0;     // worker 0
  std::int64_t messages_per_iteration = 0;  // units pushed by worker 0
  // Simulator: the events of the model (every push, arrival and pull, each compute step),
  // and how many of them went through the event queue (the PS engine reports an arrival
  // that completes nothing with its send; docs/benchmarks.md "Simulator at scale").
  std::uint64_t events = 0;
  std::uint64_t queue_events = 0;
  std::vector<TraceSpan> trace;
  std::vector<std::string> notes;  // policy-specific reports (e.g. DeFT's update frequency)
  // The run stopped at SimOptions::stop_at_least: its statistic would have been at least
  // that, which iteration_time holds; iteration_times has worker 0's iterations that ended,
  // and the fields after it are not filled but the event counts.
  bool at_least = false;
  // The run stopped at SimOptions::stop_when_steady: iteration_times has the iterations up
  // to warmup + 1, the last two equal, and the fields are those of a whole run whose later
  // iterations repeat the last.
  bool steady = false;
  // Measured runs: the fraction of the machine's CPU time that was idle while the run ran
  // (every core, /proc/stat), so that a reader sees whether the emulation had headroom.
  // -1: not measured (the simulator).
  double cpu_idle = -1;
  // Measured runs: what TCP repaired per iteration, summed over every host: retransmitted
  // segments, and retransmission timeouts (empty where the kernel does not count them,
  // before Linux 6.7). Empty for the simulator.
  std::vector<std::int64_t> retransmits, timeouts;
  // The part of `retransmits` the workers' connections sent (their pushes); the rest is
  // what the servers sent (acknowledgements and pulls, the direction incast hits).
  std::vector<std::int64_t> worker_retransmits;
  // Measured runs on the emulated cluster: packets the hosts' own queues (uplinks) and the
  // switch ports (downlinks) dropped while the run ran, over every host. -1: not measured.
  std::int64_t host_queue_drops = -1, switch_drops = -1;
};

using RunResult = SimResult;

// One row of a report: a policy's result and, for a measured run, the simulator's
// prediction of the same configuration.
struct ResultRow {
  SimResult result;
  std::optional<SimResult> predicted;
};

// Median of v[skip..] (the mean of the two middle values for an even count); of the last
// element when skip >= v.size(). Precondition: !v.empty().
TimeNs steady_median(const std::vector<TimeNs>& v, int skip);
// The same for doubles; 0 for an empty v.
double steady_median(const std::vector<double>& v, int skip);

// SimOptions::stop_at_least, for a simulation whose worker 0 has ended the iterations
// `ended` (durations, warm-up included) and began the next at `start`: the time from which,
// if that iteration is still going, options.statistic over options.iterations is at least
// options.stop_at_least, each other iteration counted at what it is known to take at least
// (its duration when it ended, else `least`: what every iteration of worker 0 runs at
// least, such as its compute; the median and the mean only grow with each value). kTimeNever when
// there is none: no bound, every iteration ended, or the iteration is a warm-up one.
TimeNs known_at_least_from(const std::vector<TimeNs>& ended, TimeNs start, TimeNs least,
                           const SimOptions& options);

// Fills iteration_time (SimOptions::statistic of the iterations after the warm-up), compute_time,
// gpu_idle, samples_per_second and scaling_efficiency from r->iteration_times. Shared by the
// simulator and the runtime launcher so that both report the same way.
void finish_result(const Profile& profile, const ClusterConfig& cluster, const SimOptions& options,
                   SimResult* r);

}  // namespace qs
