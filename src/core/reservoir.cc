#include "quicksilver/core/reservoir.h"

#include <algorithm>
#include <cmath>

#include "quicksilver/core/check.h"

namespace qs {

Reservoir::Reservoir(std::size_t capacity, std::uint64_t seed) : capacity_(capacity), rng_(seed) {
  QS_CHECK(capacity >= 1);
}

void Reservoir::add(TimeNs v) {
  max_ = count_ == 0 ? v : std::max(max_, v);
  ++count_;
  if (sample_.size() < capacity_) {
    sample_.push_back(v);
    return;
  }
  // Algorithm R: the count_-th value replaces a random held one with probability
  // capacity / count_.
  const auto j =
      static_cast<std::uint64_t>(rng_.uniform_int(0, static_cast<std::int64_t>(count_ - 1)));
  if (j < capacity_) sample_[static_cast<std::size_t>(j)] = v;
}

TimeNs Reservoir::percentile(double p) const {
  if (sample_.empty()) return 0;
  if (p >= 100) return max_;
  std::vector<TimeNs> v = sample_;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const auto idx =
      static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx), v.end());
  return v[idx];
}

}  // namespace qs
