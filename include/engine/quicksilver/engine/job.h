// The configuration of a training job that both engines run: the cluster (hosts, links,
// all-reduce model, compute speeds) and the run (iterations, warm-up, statistic, seed).
// One type for the simulator and the runtime, so that a run and its prediction are
// configured by the same object. Job bundles them with the profile, the policies and their
// knobs: what `simulate` and `run_cluster` (include/launch/quicksilver/launch/launcher.h) take.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/bandwidth_schedule.h"
#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/policy/registry.h"

namespace qs {

// Architecture (kPs, kAllReduce) is the registry's (quicksilver/policy/registry.h).
// MG-WFBP Table II algorithms.
enum class AllReduceAlgorithm { kRing, kTree, kRecursiveDoubling, kRecursiveHalvingDoubling };

Result<Architecture> parse_architecture(const std::string& s);
Result<AllReduceAlgorithm> parse_allreduce_algorithm(const std::string& s);
const char* architecture_name(Architecture a);
const char* allreduce_algorithm_name(AllReduceAlgorithm a);

// PS simulator: how the messages a host has in flight share the links (docs/simulator.md
// "Network model").
enum class LinkSharing {
  // One message at a time per uplink, in the sender's queue order; on the receiver's
  // downlink, behind what it already carries (cut-through, per message).
  kFifo,
  // As the runtime's TCP connections: a host hands its queue's head to the head's peer
  // whenever that peer's connection has no message in flight, then the next (stopping at
  // the first head whose connection is busy: transport/sender.h), and the messages in
  // flight share every link they cross (the sender's uplink, the receiver's downlink)
  // max-min fairly, the rates recomputed at each message's start and end.
  kFair,
};
std::string_view link_sharing_name(LinkSharing s);
Result<LinkSharing> parse_link_sharing(const std::string& s);

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
  // PS simulator: hosts that are not alike (Mercury Fig. 21(b), "workers and PSes are not
  // in a perfect load balancing"). Each worker's and each server's own NIC rate, both
  // directions (empty: every host at `bandwidth`; not with `schedule`); and the share of
  // the parameters each server holds (empty: equal shares, the balanced placement). The
  // runtime ignores them.
  std::vector<Rate> worker_bandwidth, server_bandwidth;
  std::vector<double> server_shares;
  // All-reduce model T_ar(M) = a + b*M (MG-WFBP eq. 4 and Table II).
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::kRing;
  std::optional<Rate> reduction_rate;  // gamma = 1 / reduction_rate per byte; none = 0
  std::optional<TimeNs> allreduce_a;   // a and b given directly override the table
  std::optional<double> allreduce_b_ns_per_byte;
  // All-reduce: a second, slower link beside the first (DeFT III-C: gloo over a second NIC
  // beside NCCL). 0 = none. Otherwise every collective on it takes this factor times its
  // time on the first link (DeFT measured 1.59..1.69, Fig. 6). Must be 0 or >= 1.
  double second_link_slowdown = 0;
  // PS simulator only (docs/simulator.md "Network model"). The runtime ignores them.
  // Pulls as the Mercury paper's analysis models them (eq. 7, tau_pull = tau_push +
  // t_pull): each unit's pull takes its own size / rate from the moment its sum is
  // complete, overlapping every other pull. false (default): a server's pulls queue on
  // its uplink and on each worker's downlink, as on a real NIC.
  bool overlapping_pulls = false;
  // The transport's per-frame cost: every unit sent (push or pull) carries `frame_header`
  // bytes on the wire beside its payload, and holds each link it crosses `frame_cpu`
  // longer than its bytes take (the CPU a frame costs, not overlapped with the wire).
  // 0 and 0 (default): a frame costs nothing. Calibrated from bench/transport_bench:
  // 24 B and 1 us (docs/simulator.md), measured before transport/wire.h's kHeaderSize grew to
  // 32 B with the frames' checksums.
  Bytes frame_header = 0;
  TimeNs frame_cpu = 0;
  // Each link as a token bucket of this depth (bytes), refilled at its rate while it
  // idles: a frame leaves at once for as many bytes as the bucket holds, the rest at the
  // rate. The emulated cluster's tbf shapers are such buckets (68 KiB at the rates it
  // runs); a NIC has none (0, default). The per-message links only: under
  // LinkSharing::kFair the messages shared as flows have no burst (p3's and Mercury's,
  // which keep the per-message model, do).
  Bytes link_burst = 0;
  // An acknowledgement waits behind the pull in flight on the server's uplink and the
  // backlog of the worker's downlink, up to this long (0, default: it takes the latency
  // only).
  TimeNs ack_queue = 0;
  // How the messages in flight share a link. kFair applies to one job of a policy that is
  // neither packet-level (PsPolicy::packet_level(): Mercury's packets leave one at a time
  // in priority order) nor stop-and-wait (PsPolicy::stop_and_wait(): p3's one short slice
  // per worker, queued whole); several jobs (--job) and those policies keep kFifo. With kFair
  // ack_queue sees no backlog (the acknowledgement takes the latency only).
  LinkSharing link_sharing = LinkSharing::kFifo;
  // Compression (--compression bf16|fp16; JobOptions::wire_dtype in the runtime). PS:
  // every gradient element crosses both links as `wire_element_bytes` (4: float32;
  // 2: bf16/fp16), and each frame holds each link it crosses `convert_ns_per_element` per
  // element longer (the sender rounds it, the receiver widens or adds it; the fluid model
  // of LinkSharing::kFair counts the bytes only). bench/aggregation_bench measured 0.21 to
  // 0.36 ns an element here (docs/benchmarks.md); 0.35 is the default with compression.
  // All-reduce: b shrinks to the wire's share plus three conversions per element.
  std::string compression = "float32";  // its name: float32, bf16, fp16
  int wire_element_bytes = 4;
  double convert_ns_per_element = 0;
  Bytes wire_payload(Bytes float32_bytes) const { return float32_bytes / 4 * wire_element_bytes; }
  TimeNs convert_time(Bytes float32_bytes) const {
    return static_cast<TimeNs>(static_cast<double>(float32_bytes / 4) * convert_ns_per_element);
  }

  Status validate() const;
  BandwidthSchedule link_schedule() const {
    return schedule ? *schedule : BandwidthSchedule(bandwidth);
  }
  // The NIC rate of worker `w` or server `s` at time 0 (worker_bandwidth, server_bandwidth).
  Rate worker_rate(int w) const {
    return worker_bandwidth.empty() ? link_schedule().rate_at(0)
                                    : worker_bandwidth[static_cast<std::size_t>(w)];
  }
  Rate server_rate(int s) const {
    return server_bandwidth.empty() ? link_schedule().rate_at(0)
                                    : server_bandwidth[static_cast<std::size_t>(s)];
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
  // > 0: the simulator stops as soon as `statistic` over the whole run is known to be at
  // least this (SimResult::at_least), from the iterations worker 0 has ended and the one it
  // is in. For a caller that only needs to know whether a run beats a time (advise's
  // search). simulate() only: simulate_shared refuses it, and no flag sets it for a run.
  TimeNs stop_at_least = 0;
  // The run stops once every worker has ended iteration warmup + 1 and the cluster's
  // iterations warmup and warmup + 1 took the same time to the nanosecond
  // (SimResult::steady): a deterministic simulation that repeats an iteration exactly is
  // taken to have reached its steady state, and `statistic` over the remaining iterations
  // is that same time. For a caller that wants a run's prediction at less cost (advise);
  // only at a constant rate and for a policy that does not delay updates (whose merged
  // iterations alternate), which the caller checks. simulate() only, as stop_at_least.
  bool stop_when_steady = false;
};

// Everything a simulate or run invocation needs, validated (the CLI builds it from flags).
struct Job {
  Profile profile;
  std::vector<std::string> policies;  // run one after another, each on the same cluster
  PolicyOptions policy_options;
  ClusterConfig cluster;
  SimOptions sim;
};

}  // namespace qs
