// Reservoir: percentiles of a stream of any length in constant memory. A uniform sample
// of at most `capacity` values (Vitter's Algorithm R), plus the exact count and maximum.
//
// Exact while count() <= capacity. Beyond, every value seen is in the sample with the same
// probability capacity / count, so a percentile's rank is off by about
// sqrt(p (1 - p) / capacity) (capacity 4096, p99: 0.16 percentage points). The maximum
// is always exact. Seeded (STYLE.md practice 5): the same stream gives the same sample.
// Not thread-safe: one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quicksilver/core/rng.h"
#include "quicksilver/core/units.h"

namespace qs {

class Reservoir {
 public:
  static constexpr std::size_t kDefaultCapacity = 4096;

  // Precondition: capacity >= 1.
  explicit Reservoir(std::size_t capacity = kDefaultCapacity, std::uint64_t seed = 1);

  void add(TimeNs v);
  std::uint64_t count() const { return count_; }       // values seen
  std::size_t size() const { return sample_.size(); }  // values held: min(count, capacity)
  std::size_t capacity() const { return capacity_; }
  // Nearest-rank percentile (p in 0..100) of the sample; p >= 100 is the exact maximum.
  // 0 when nothing was added.
  TimeNs percentile(double p) const;

 private:
  std::size_t capacity_;
  std::vector<TimeNs> sample_;
  std::uint64_t count_ = 0;
  TimeNs max_ = 0;
  Rng rng_;
};

}  // namespace qs
