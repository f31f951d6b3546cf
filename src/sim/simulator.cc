#include "quicksilver/sim/simulator.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engines.h"
#include "quicksilver/core/check.h"
#include "quicksilver/policy/ps_policy.h"

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
  return Status::ok();
}

Status horizon_error() {
  return invalid_argument("simulated time passed " + format_time(kSimHorizon) +
                          " before the iterations ended; is --bandwidth too low?");
}

namespace {

// Where the steady iterations of v begin: after `skip`, but never past the last element.
template <typename T>
auto steady_begin(const std::vector<T>& v, int skip) {
  return v.begin() + std::min<std::ptrdiff_t>(std::max(skip, 0), static_cast<std::ptrdiff_t>(v.size()) - 1);
}

// Median of the steady iterations; the mean of the two middle values for an even count.
template <typename T>
T median_after(const std::vector<T>& v, int skip) {
  std::vector<T> s(steady_begin(v, skip), v.end());
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

// Mean of the steady iterations, rounded to the ns.
TimeNs steady_mean(const std::vector<TimeNs>& v, int skip) {
  QS_CHECK(!v.empty());
  const auto first = steady_begin(v, skip);
  long double sum = 0;
  for (auto it = first; it != v.end(); ++it) sum += static_cast<long double>(*it);
  return static_cast<TimeNs>(sum / static_cast<long double>(v.end() - first) + 0.5L);
}

}  // namespace

TimeNs steady_median(const std::vector<TimeNs>& v, int skip) {
  QS_CHECK(!v.empty());
  return median_after(v, skip);
}

double steady_median(const std::vector<double>& v, int skip) { return v.empty() ? 0.0 : median_after(v, skip); }

std::string_view statistic_name(Statistic s) { return s == Statistic::kMean ? "mean" : "median"; }

void finish_result(const Profile& profile, const ClusterConfig& cluster, const SimOptions& options,
                   SimResult* r) {
  r->iteration_time = options.statistic == Statistic::kMean ? steady_mean(r->iteration_times, options.warmup)
                                                            : steady_median(r->iteration_times, options.warmup);
  const double f0 = cluster.compute_factor.empty() ? 1.0 : cluster.compute_factor[0];
  r->compute_time = static_cast<TimeNs>(static_cast<double>(profile.compute_time()) * f0 + 0.5);
  r->gpu_idle = std::max<TimeNs>(0, r->iteration_time - r->compute_time);
  const double iter_s = to_sec(r->iteration_time);
  r->samples_per_second =
      iter_s > 0 ? static_cast<double>(cluster.workers) * static_cast<double>(profile.batch_size) / iter_s : 0.0;
  // Normalised against the oracle of the slowest worker: the best the cluster can do.
  double slowest = f0;
  for (double f : cluster.compute_factor) slowest = std::max(slowest, f);
  const double oracle = static_cast<double>(profile.compute_time()) * slowest;
  r->scaling_efficiency = r->iteration_time > 0 ? oracle / static_cast<double>(r->iteration_time) : 0.0;
}

Result<SimResult> simulate(const Profile& profile, const std::string& policy,
                           const PolicyOptions& policy_options, const ClusterConfig& cluster,
                           const SimOptions& options) {
  QS_RETURN_IF_ERROR(validate_profile(profile));
  QS_RETURN_IF_ERROR(cluster.validate());
  if (options.iterations < 1 || options.iterations > 1'000'000) {
    return invalid_argument("--iterations must be in 1..1000000");
  }
  if (options.warmup < 0) return invalid_argument("warm-up must be >= 0");
  if (!is_known_policy(policy)) {
    std::string known;
    for (const auto& n : all_policy_names()) known += (known.empty() ? "" : ", ") + n;
    return invalid_argument("unknown policy '" + policy + "' (known: " + known + ")");
  }
  try {
    if (cluster.architecture == Architecture::kPs) {
      return simulate_ps(profile, policy, policy_options, cluster, options);
    }
    return simulate_allreduce(profile, policy, policy_options, cluster, options);
  } catch (const CheckFailure& e) {
    return internal_error(std::string("simulating ") + policy + ": " + e.what());
  }
}

Status write_chrome_trace(const std::vector<SimResult>& results, const std::string& path) {
  using nlohmann::json;
  json events = json::array();
  static const char* kTracks[] = {"compute", "uplink", "downlink"};
  int pid_base = 0;
  for (const SimResult& r : results) {
    int max_host = 0;
    for (const TraceSpan& s : r.trace) max_host = std::max(max_host, s.host);
    for (int h = 0; h <= max_host; ++h) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid_base + h},
                        {"args", {{"name", r.policy + " worker " + std::to_string(h)}}}});
      for (int t = 0; t < 3; ++t) {
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid_base + h}, {"tid", t},
                          {"args", {{"name", kTracks[t]}}}});
      }
    }
    for (const TraceSpan& s : r.trace) {
      events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", pid_base + s.host},
                        {"tid", s.track}, {"ts", to_us(s.start)}, {"dur", to_us(s.end - s.start)}});
    }
    pid_base += max_host + 1;
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error(path + ": cannot open trace file for writing");
  out << doc.dump() << "\n";
  if (!out) return io_error(path + ": write failed");
  return Status::ok();
}

}  // namespace qs
