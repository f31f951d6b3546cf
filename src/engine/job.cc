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

std::string_view link_sharing_name(LinkSharing s) {
  return s == LinkSharing::kFair ? "fair" : "fifo";
}

Result<LinkSharing> parse_link_sharing(const std::string& s) {
  if (s == "fair") return LinkSharing::kFair;
  if (s == "fifo") return LinkSharing::kFifo;
  return invalid_argument("unknown link sharing '" + s + "' (known: fair, fifo)");
}

const char* architecture_name(Architecture a) {
  return a == Architecture::kPs ? "ps" : "allreduce";
}

const char* allreduce_algorithm_name(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::kRing:
      return "ring";
    case AllReduceAlgorithm::kTree:
      return "tree";
    case AllReduceAlgorithm::kRecursiveDoubling:
      return "rd";
    case AllReduceAlgorithm::kRecursiveHalvingDoubling:
      return "rhd";
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
  if (latency < 0 || latency > 3600 * kNsPerSec)
    return invalid_argument("--latency must be in 0..3600s");
  if (wire_element_bytes != 4 && wire_element_bytes != 2) {
    return invalid_argument(
        "--compression: a gradient element is 4 (none) or 2 (bf16, fp16) bytes on the wire");
  }
  if (!(convert_ns_per_element >= 0 && convert_ns_per_element < 1e6)) {
    return invalid_argument("the conversion cost per element must be >= 0");
  }
  if (!compute_factor.empty() && static_cast<int>(compute_factor.size()) != workers) {
    return invalid_argument("--compute-factor lists " + std::to_string(compute_factor.size()) +
                            " factors for " + std::to_string(workers) + " workers");
  }
  for (double f : compute_factor) {
    if (!(f > 0 && f < 1e6)) return invalid_argument("--compute-factor values must be > 0");
  }
  auto check_hosts = [&](const char* flag, std::size_t n, int hosts, const char* what) -> Status {
    if (n == 0) return Status::ok();
    if (static_cast<int>(n) != hosts) {
      return invalid_argument(std::string(flag) + " lists " + std::to_string(n) + " values for " +
                              std::to_string(hosts) + " " + what);
    }
    if (architecture != Architecture::kPs)
      return invalid_argument(std::string(flag) + " needs --architecture ps");
    if (schedule)
      return invalid_argument(std::string(flag) + " cannot be combined with --bandwidth-trace");
    return Status::ok();
  };
  QS_RETURN_IF_ERROR(
      check_hosts("--worker-bandwidths", worker_bandwidth.size(), workers, "workers"));
  QS_RETURN_IF_ERROR(
      check_hosts("--server-bandwidths", server_bandwidth.size(), servers, "servers"));
  QS_RETURN_IF_ERROR(check_hosts("--server-shares", server_shares.size(), servers, "servers"));
  for (const auto* rates : {&worker_bandwidth, &server_bandwidth}) {
    for (Rate r : *rates) {
      if (r.bits_per_second <= 0 || r.bits_per_second > 1'000'000'000'000'000) {
        return invalid_argument(std::string(rates == &worker_bandwidth ? "--worker-bandwidths"
                                                                       : "--server-bandwidths") +
                                " values must be in 1bps..1000000Gbps");
      }
    }
  }
  for (double s : server_shares) {
    if (!(s > 0 && s <= 1e6))
      return invalid_argument("--server-shares values must be in (0, 1000000]");
  }
  if (allreduce_b_ns_per_byte && !(*allreduce_b_ns_per_byte >= 0)) {
    return invalid_argument("all-reduce b must be >= 0");
  }
  if (allreduce_a && *allreduce_a < 0) return invalid_argument("all-reduce a must be >= 0");
  if (frame_header < 0 || frame_header > kMiB)
    return invalid_argument("--frame-header must be in 0..1MiB");
  if (frame_cpu < 0 || frame_cpu > kNsPerSec)
    return invalid_argument("--frame-cpu must be in 0..1s");
  if (ack_queue < 0 || ack_queue > kNsPerSec)
    return invalid_argument("--ack-queue must be in 0..1s");
  if (link_burst < 0 || link_burst > kGiB)
    return invalid_argument("--link-burst must be in 0..1GiB");
  return Status::ok();
}

std::string_view statistic_name(Statistic s) { return s == Statistic::kMean ? "mean" : "median"; }

}  // namespace qs
