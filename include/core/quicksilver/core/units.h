// Time, sizes and rates: integer types and their parsing with units (DESIGN.md).
//
// Time is integer nanoseconds everywhere inside Quicksilver (STYLE.md practice 3);
// doubles appear only at the edges (printing milliseconds, reading a profile's `_ms`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "quicksilver/core/status.h"

namespace qs {

// A point in time or a duration, in nanoseconds.
using TimeNs = std::int64_t;
// A byte count.
using Bytes = std::int64_t;

inline constexpr TimeNs kNsPerUs = 1'000;
inline constexpr TimeNs kNsPerMs = 1'000'000;
inline constexpr TimeNs kNsPerSec = 1'000'000'000;
inline constexpr TimeNs kTimeNever = INT64_MAX;

inline constexpr Bytes kKiB = 1024;
inline constexpr Bytes kMiB = 1024 * kKiB;
inline constexpr Bytes kGiB = 1024 * kMiB;

// a + b, saturating at kTimeNever (times never wrap into the past). Precondition: b >= 0.
constexpr TimeNs add_saturated(TimeNs a, TimeNs b) {
  return a > kTimeNever - b ? kTimeNever : a + b;
}

// `t` times a compute slowdown `factor`, rounded to the nearest ns. The one rounding rule
// of the emulated GPU (engine/compute.h) and of every policy that plans with its times, so
// that a plan and the compute it plans for agree to the ns.
constexpr TimeNs scale_time(TimeNs t, double factor) {
  return factor == 1.0 ? t : static_cast<TimeNs>(static_cast<double>(t) * factor + 0.5);
}

constexpr double to_ms(TimeNs t) { return static_cast<double>(t) / 1e6; }
constexpr double to_us(TimeNs t) { return static_cast<double>(t) / 1e3; }
constexpr double to_sec(TimeNs t) { return static_cast<double>(t) / 1e9; }
// Rounds to the nearest nanosecond. Precondition: finite, |ms| < 9e12.
TimeNs from_ms(double ms);

// A link rate in bits per second (network convention: 10 Gbps = 1e10 bit/s).
struct Rate {
  std::int64_t bits_per_second = 0;

  static constexpr Rate gbps(double g) { return Rate{static_cast<std::int64_t>(g * 1e9)}; }
  static constexpr Rate mbps(double m) { return Rate{static_cast<std::int64_t>(m * 1e6)}; }
  double bytes_per_second() const { return static_cast<double>(bits_per_second) / 8.0; }
  double gbps_value() const { return static_cast<double>(bits_per_second) / 1e9; }
  friend constexpr bool operator==(Rate a, Rate b) = default;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted <=>
  friend constexpr auto operator<=>(Rate a, Rate b) = default;
};

// Time to serialise `bytes` at `rate`, rounded up to a whole nanosecond.
// Precondition: rate > 0, bytes >= 0. Exact integer arithmetic (no rounding drift).
TimeNs transfer_time(Bytes bytes, Rate rate);
// Bytes that `rate` moves in `t` (rounded down).
Bytes bytes_in(TimeNs t, Rate rate);

// Parsing. Each accepts a number (integer or decimal) followed by a unit; whitespace
// between them is allowed. Errors name the offending text and list the accepted units.
//   time:  ns us ms s                      ("50us", "1.5ms")
//   size:  B KB MB GB (10^3) KiB MiB GiB (2^10)   ("32KiB", "25MB")
//   rate:  bps Kbps Mbps Gbps (bits)  B/s KB/s MB/s GB/s (bytes)   ("10Gbps")
Result<TimeNs> parse_time(std::string_view text);
Result<Bytes> parse_size(std::string_view text);
Result<Rate> parse_rate(std::string_view text);

// Human-readable forms: "1.50ms", "32KiB", "10Gbps".
std::string format_time(TimeNs t);
std::string format_size(Bytes b);
std::string format_rate(Rate r);

}  // namespace qs
