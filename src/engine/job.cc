#include "quicksilver/engine/job.h"

namespace qs {

Result<Architecture> parse_architecture(const std::string& s) {
  if (s == "ps") return Architecture::kPs;
  if (s == "allreduce") return Architecture::kAllReduce;
  return invalid_argument("unknown architecture '" + s + "' (known: ps, allreduce)");
}

Result<AllReduceAlgorithm> parse_allreduce_algorithm(const std::string& s) {
  if (s == "ring") return AllReduceAlgorithm::kRing;
  if (s == "tree") return AllReduceAlgorithm::kTree;
  if (s == "rd") return AllReduceAlgorithm::kRecursiveDoubling;
  if (s == "rhd") return AllReduceAlgorithm::kRecursiveHalvingDoubling;
  return invalid_argument("unknown all-reduce algorithm '" + s + "' (known: ring, tree, rd, rhd)");
}

const char* architecture_name(Architecture a) {
  return a == Architecture::kPs ? "ps" : "allreduce";
}

const char* allreduce_algorithm_name(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::kRing: return "ring";
    case AllReduceAlgorithm::kTree: return "tree";
    case AllReduceAlgorithm::kRecursiveDoubling: return "rd";
    case AllReduceAlgorithm::kRecursiveHalvingDoubling: return "rhd";
  }
  return "?";
}

Status ClusterConfig::validate() const {
  // Each PS host keeps per-priority queues, so N and M are bounded by memory, not time.
  if (workers < 1 || workers > 4096) return invalid_argument("--workers must be in 1..4096");
  if (architecture == Architecture::kPs && (servers < 1 || servers > 4096)) {
    return invalid_argument("--servers must be in 1..4096");
  }
  if (bandwidth.bits_per_second <= 0 || bandwidth.bits_per_second > 1'000'000'000'000'000) {
    return invalid_argument("--bandwidth must be in 1bps..1000000Gbps");
  }
  if (latency < 0 || latency > 3600 * kNsPerSec) return invalid_argument("--latency must be in 0..3600s");
  if (!compute_factor.empty() && static_cast<int>(compute_factor.size()) != workers) {
    return invalid_argument("--compute-factor lists " + std::to_string(compute_factor.size()) +
                            " factors for " + std::to_string(workers) + " workers");
  }
  for (double f : compute_factor) {
    if (!(f > 0 && f < 1e6)) return invalid_argument("--compute-factor values must be > 0");
  }
  if (allreduce_b_ns_per_byte && !(*allreduce_b_ns_per_byte >= 0)) {
    return invalid_argument("all-reduce b must be >= 0");
  }
  if (allreduce_a && *allreduce_a < 0) return invalid_argument("all-reduce a must be >= 0");
  if (frame_header < 0 || frame_header > kMiB) return invalid_argument("--frame-header must be in 0..1MiB");
  if (frame_cpu < 0 || frame_cpu > kNsPerSec) return invalid_argument("--frame-cpu must be in 0..1s");
  if (ack_queue < 0 || ack_queue > kNsPerSec) return invalid_argument("--ack-queue must be in 0..1s");
  return Status::ok();
}

std::string_view statistic_name(Statistic s) { return s == Statistic::kMean ? "mean" : "median"; }

}  // namespace qs
