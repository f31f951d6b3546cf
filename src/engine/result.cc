#include "quicksilver/engine/result.h"

#include <algorithm>

#include "quicksilver/core/check.h"

namespace qs {

namespace {

// Where the steady iterations of v begin: after `skip`, but never past the last element.
template <typename T>
auto steady_begin(const std::vector<T>& v, int skip) {
  return v.begin() +
         std::min<std::ptrdiff_t>(std::max(skip, 0), static_cast<std::ptrdiff_t>(v.size()) - 1);
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

double steady_median(const std::vector<double>& v, int skip) {
  return v.empty() ? 0.0 : median_after(v, skip);
}

namespace {

TimeNs statistic_of(const std::vector<TimeNs>& v, const SimOptions& options) {
  return options.statistic == Statistic::kMean ? steady_mean(v, options.warmup)
                                               : steady_median(v, options.warmup);
}

}  // namespace

TimeNs known_at_least_from(const std::vector<TimeNs>& ended, TimeNs start, TimeNs least,
                           const SimOptions& options) {
  const TimeNs bound = options.stop_at_least;
  const auto n = static_cast<std::size_t>(std::max(options.iterations, 1));
  const std::size_t going = ended.size();  // the iteration worker 0 is in
  // The first measured iteration, as steady_begin has it.
  const std::size_t first =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(options.warmup, 0)), n - 1);
  if (bound <= 0 || going >= n || going < first) return kTimeNever;
  if (bound > kTimeNever / static_cast<TimeNs>(n)) return kTimeNever;
  std::vector<TimeNs> v(ended.begin(), ended.end());
  v.resize(n, std::max<TimeNs>(least, 0));
  auto reaches = [&](TimeNs x) {
    v[going] = x;
    return statistic_of(v, options) >= bound;
  };
  // The statistic grows with x; the mean of m values reaches the bound by x = m * bound.
  TimeNs hi = static_cast<TimeNs>(n - first) * bound;
  if (!reaches(hi)) return kTimeNever;
  TimeNs lo = std::max<TimeNs>(least, 0);  // the iteration takes that much anyway
  if (reaches(lo)) return start;
  while (hi - lo > 1) {  // reaches(hi), !reaches(lo)
    const TimeNs mid = lo + (hi - lo) / 2;
    (reaches(mid) ? hi : lo) = mid;
  }
  return add_saturated(start, hi);
}

void finish_result(const Profile& profile, const ClusterConfig& cluster, const SimOptions& options,
                   SimResult* r) {
  r->iteration_time = statistic_of(r->iteration_times, options);
  const double f0 = cluster.compute_factor.empty() ? 1.0 : cluster.compute_factor[0];
  r->compute_time = static_cast<TimeNs>(static_cast<double>(profile.compute_time()) * f0 + 0.5);
  r->gpu_idle = std::max<TimeNs>(0, r->iteration_time - r->compute_time);
  const double iter_s = to_sec(r->iteration_time);
  r->samples_per_second = iter_s > 0 ? static_cast<double>(cluster.workers) *
                                           static_cast<double>(profile.batch_size) / iter_s
                                     : 0.0;
  // Normalised against the oracle of the slowest worker: the best the cluster can do.
  double slowest = f0;
  for (double f : cluster.compute_factor) slowest = std::max(slowest, f);
  const double oracle = static_cast<double>(profile.compute_time()) * slowest;
  r->scaling_efficiency =
      r->iteration_time > 0 ? oracle / static_cast<double>(r->iteration_time) : 0.0;
}

}  // namespace qs
