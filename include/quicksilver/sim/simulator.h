// The discrete-event simulator: "how fast would this model train on this network with
// this scheduler?" Deterministic (integer-ns time, strictly ordered events, one seeded
// Rng), and driving the same policy objects as the runtime.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/bandwidth_schedule.h"
#include "quicksilver/core/status.h"
#include "quicksilver/core/trace_span.h"
#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/options.h"

namespace qs {

enum class Architecture { kPs, kAllReduce };
// MG-WFBP Table II algorithms.
enum class AllReduceAlgorithm { kRing, kTree, kRecursiveDoubling, kRecursiveHalvingDoubling };

Result<Architecture> parse_architecture(const std::string& s);
Result<AllReduceAlgorithm> parse_allreduce_algorithm(const std::string& s);
const char* architecture_name(Architecture a);
const char* allreduce_algorithm_name(AllReduceAlgorithm a);

struct ClusterConfig {
  Architecture architecture = Architecture::kPs;
  int workers = 4;
  int servers = 4;  // PS only
  // Every host's NIC rate, each direction (full duplex). Constant unless `schedule` is set.
  Rate bandwidth = Rate::gbps(10);
  std::optional<BandwidthSchedule> schedule;  // time-varying rate for every NIC
  TimeNs latency = 0;                         // one-way, per message (MG-WFBP's alpha)
  // Per-worker compute slowdown (1 = the profile's times); empty = all 1. The Mercury
  // paper's heterogeneous case.
  std::vector<double> compute_factor;
  // All-reduce model T_ar(M) = a + b*M (MG-WFBP eq. 4 and Table II).
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::kRing;
  std::optional<Rate> reduction_rate;  // gamma = 1 / reduction_rate per byte; none = 0
  std::optional<TimeNs> allreduce_a;   // a and b given directly override the table
  std::optional<double> allreduce_b_ns_per_byte;
  // All-reduce: a second, slower link beside the first (DeFT III-C: gloo over a second NIC
  // beside NCCL). 0 = none. Otherwise every collective on it takes this factor times its
  // time on the first link (DeFT measured 1.59..1.69, Fig. 6). Must be 0 or >= 1.
  double second_link_slowdown = 0;

  Status validate() const;
  BandwidthSchedule link_schedule() const {
    return schedule ? *schedule : BandwidthSchedule(bandwidth);
  }
};

// How the steady iterations are summarised into one iteration time. The median is the
// default (DESIGN.md: steady state). Under a time-varying bandwidth there is no steady
// state: the iterations fall into the schedule's rate segments and their times form
// several clusters, so the median jumps to whichever cluster holds the middle one and
// moves by a whole rate step between runs; the mean (total time / iterations, i.e. the
// throughput over the run) does not.
enum class Statistic { kMedian, kMean };
std::string_view statistic_name(Statistic s);

struct SimOptions {
  int iterations = 5;  // iterations simulated (warm-up included)
  int warmup = 1;      // leading iterations left out of the summary
  Statistic statistic = Statistic::kMedian;
  std::uint64_t seed = 1;
  bool record_trace = false;
  // Checks, at every iteration's end and for every worker, that each gradient byte was
  // pushed exactly once and pulled exactly once. Costs time; tests turn it on.
  bool verify_bytes = false;
};

struct SimResult {
  std::string policy;
  TimeNs iteration_time = 0;  // median (or mean: SimOptions::statistic) of the steady-state iterations
  std::vector<TimeNs> iteration_times;  // all iterations, warm-up included
  double samples_per_second = 0;        // global: workers * batch / iteration
  double scaling_efficiency = 0;        // oracle iteration / iteration (Mercury's "normalised speed")
  TimeNs compute_time = 0;              // the oracle's iteration time (worker 0)
  TimeNs gpu_idle = 0;                  // iteration - compute, worker 0
  // Uplink busy time over the time spent pushing: from a layer's gradients being ready
  // until every ready byte is on the wire (Mercury III-B, Fig. 6: throughput averaged over
  // the time push operations run). Compute gaps with nothing to send do not count; a
  // scheduler's own waits (credit, stop-and-wait, startup) do. Worker 0, median over
  // steady-state iterations.
  double link_utilisation = 0;
  Bytes bytes_pushed_per_iteration = 0;  // worker 0
  std::int64_t messages_per_iteration = 0;  // units pushed by worker 0
  std::uint64_t events = 0;
  std::vector<TraceSpan> trace;
  std::vector<std::string> notes;  // policy-specific reports (e.g. DeFT's update frequency)
};

// Simulates `policy` on `profile`. Errors: invalid config, unknown policy, a policy that
// does not exist for the architecture, or a policy that broke an engine invariant (named).
Result<SimResult> simulate(const Profile& profile, const std::string& policy,
                           const PolicyOptions& policy_options, const ClusterConfig& cluster,
                           const SimOptions& options);

// The all-reduce cost T_ar(M) = a + b*M for `cluster` (MG-WFBP eq. 4, Table II): from
// allreduce_a/allreduce_b when set, else from the algorithm, latency (alpha), bandwidth
// (beta) and reduction rate (gamma) at time 0.
AllReduceCost allreduce_cost(const ClusterConfig& cluster);
// Least-squares fit of a and b to measured "SIZE TIME" lines (units allowed: "4MiB 3.2ms").
Result<AllReduceCost> fit_allreduce_cost(const std::string& path);

// Fills iteration_time (SimOptions::statistic of the iterations after the warm-up), compute_time, gpu_idle,
// samples_per_second and scaling_efficiency from r->iteration_times. Shared by the
// simulator and the runtime launcher so that both report the same way.
void finish_result(const Profile& profile, const ClusterConfig& cluster, const SimOptions& options,
                   SimResult* r);

// Writes a Chrome trace (chrome://tracing, Perfetto) with one process per host and
// tracks compute/uplink/downlink.
Status write_chrome_trace(const std::vector<SimResult>& results, const std::string& path);

}  // namespace qs
