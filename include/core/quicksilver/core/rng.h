// Rng: the one explicitly passed, seeded random generator (STYLE.md practice 5).
//
// xoshiro256** seeded through splitmix64. Unlike std:: distributions, the derived draws
// below are defined here, so a seed gives the same sequence on every platform and
// standard library: simulator output is byte-identical for identical seeds.
// Not thread-safe: give each thread its own (e.g. with fork()).
#pragma once

#include <cstdint>

namespace qs {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  std::uint64_t seed() const { return seed_; }
  std::uint64_t next_u64();
  // Uniform in [0, 1).
  double uniform();
  // Uniform in [lo, hi). Precondition: lo <= hi.
  double uniform(double lo, double hi);
  // Uniform integer in [lo, hi] (inclusive), unbiased. Precondition: lo <= hi.
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi);
  // Standard normal (Box-Muller, no cached spare so the stream is order-independent).
  double normal();
  // An independent generator derived from this one's next draw (for sub-streams).
  Rng fork();

 private:
  std::uint64_t seed_;
  std::uint64_t s_[4];
};

}  // namespace qs
