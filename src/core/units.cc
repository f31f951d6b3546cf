#include "quicksilver/core/units.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

#include "quicksilver/core/check.h"

namespace qs {
namespace {

struct Unit {
  std::string_view name;
  double factor;
};

// Splits "  12.5 MiB " into 12.5 and "MiB". Rejects negatives, NaN, empty numbers.
Result<std::pair<double, std::string_view>> split_number(std::string_view text,
                                                         std::string_view what) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  std::string_view s = trim(text);
  std::size_t end = 0;
  while (end < s.size() && ((s[end] >= '0' && s[end] <= '9') || s[end] == '.' || s[end] == 'e' ||
                            s[end] == 'E' || (end == 0 && (s[end] == '+' || s[end] == '-')))) {
    // 'e' only counts as an exponent when followed by a digit or sign ("5e3"), not in "5eggs".
    if ((s[end] == 'e' || s[end] == 'E') &&
        !(end + 1 < s.size() &&
          ((s[end + 1] >= '0' && s[end + 1] <= '9') || s[end + 1] == '-' || s[end + 1] == '+')))
      break;
    if ((s[end] == 'e' || s[end] == 'E') && end + 1 < s.size() &&
        (s[end + 1] == '-' || s[end + 1] == '+'))
      ++end;
    ++end;
  }
  std::string number(s.substr(0, end));
  if (number.empty()) {
    return invalid_argument("'" + std::string(text) + "' is not a " + std::string(what) +
                            ": expected a number followed by a unit");
  }
  char* parse_end = nullptr;
  double value = std::strtod(number.c_str(), &parse_end);
  if (parse_end != number.c_str() + number.size() || !std::isfinite(value)) {
    return invalid_argument("'" + std::string(text) + "' is not a " + std::string(what) +
                            ": bad number '" + number + "'");
  }
  if (value < 0) {
    return invalid_argument("'" + std::string(text) + "': a " + std::string(what) +
                            " cannot be negative");
  }
  return std::pair<double, std::string_view>{value, trim(s.substr(end))};
}

template <std::size_t N>
Result<double> scale(std::string_view text, std::string_view what, const Unit (&units)[N],
                     double max_value) {
  QS_ASSIGN_OR_RETURN(auto parts, split_number(text, what));
  for (const Unit& u : units) {
    if (parts.second == u.name) {
      double v = parts.first * u.factor;
      if (!(v <= max_value)) {
        return invalid_argument("'" + std::string(text) + "' is too large for a " +
                                std::string(what));
      }
      return v;
    }
  }
  std::string accepted;
  for (const Unit& u : units) accepted += (accepted.empty() ? "" : " ") + std::string(u.name);
  return invalid_argument("'" + std::string(text) + "' has " +
                          (parts.second.empty()
                               ? std::string("no unit")
                               : "unknown unit '" + std::string(parts.second) + "'") +
                          " for a " + std::string(what) + " (accepted: " + accepted + ")");
}

constexpr Unit kTimeUnits[] = {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
constexpr Unit kSizeUnits[] = {
    {"B", 1},        {"KB", 1e3},        {"MB", 1e6},          {"GB", 1e9},
    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
constexpr Unit kRateUnits[] = {{"bps", 1}, {"Kbps", 1e3}, {"Mbps", 1e6}, {"Gbps", 1e9},
                               {"B/s", 8}, {"KB/s", 8e3}, {"MB/s", 8e6}, {"GB/s", 8e9}};

std::string trim_decimal(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  std::string s(buf);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

}  // namespace

TimeNs from_ms(double ms) { return static_cast<TimeNs>(std::llround(ms * 1e6)); }

TimeNs transfer_time(Bytes bytes, Rate rate) {
  QS_CHECK(rate.bits_per_second > 0 && bytes >= 0);
  if (bytes < (std::int64_t{1} << 30)) {  // bytes * 8e9 fits in 63 bits: the fast path
    const std::int64_t n = bytes * 8 * kNsPerSec;
    return n / rate.bits_per_second + (n % rate.bits_per_second != 0 ? 1 : 0);
  }
  __int128 num = static_cast<__int128>(bytes) * 8 * kNsPerSec;
  __int128 t = (num + rate.bits_per_second - 1) / rate.bits_per_second;
  return t > INT64_MAX ? kTimeNever : static_cast<TimeNs>(t);
}

Bytes bytes_in(TimeNs t, Rate rate) {
  if (t <= 0) return 0;
  __int128 b = static_cast<__int128>(t) * rate.bits_per_second / (8 * kNsPerSec);
  return b > INT64_MAX ? INT64_MAX : static_cast<Bytes>(b);
}

Result<TimeNs> parse_time(std::string_view text) {
  QS_ASSIGN_OR_RETURN(double ns, scale(text, "time", kTimeUnits, 9.2e18));
  return static_cast<TimeNs>(std::llround(ns));
}

Result<Bytes> parse_size(std::string_view text) {
  QS_ASSIGN_OR_RETURN(double b, scale(text, "size", kSizeUnits, 9.2e18));
  return static_cast<Bytes>(std::llround(b));
}

Result<Rate> parse_rate(std::string_view text) {
  QS_ASSIGN_OR_RETURN(double bps, scale(text, "rate", kRateUnits, 9.2e18));
  if (bps < 1) return invalid_argument("'" + std::string(text) + "': a rate must be positive");
  return Rate{static_cast<std::int64_t>(std::llround(bps))};
}

std::string format_time(TimeNs t) {
  if (t >= kNsPerSec) return trim_decimal(t / 1e9, 3) + "s";
  if (t >= kNsPerMs) return trim_decimal(t / 1e6, 3) + "ms";
  if (t >= kNsPerUs) return trim_decimal(t / 1e3, 3) + "us";
  return std::to_string(t) + "ns";
}

std::string format_size(Bytes b) {
  if (b >= kGiB && b % (kGiB / 1024) == 0) return trim_decimal(double(b) / kGiB, 3) + "GiB";
  if (b >= kMiB && b % (kMiB / 1024) == 0) return trim_decimal(double(b) / kMiB, 3) + "MiB";
  if (b >= kKiB && b % kKiB == 0) return trim_decimal(double(b) / kKiB, 3) + "KiB";
  if (b >= 1'000'000) return trim_decimal(b / 1e6, 3) + "MB";
  return std::to_string(b) + "B";
}

std::string format_rate(Rate r) {
  double v = static_cast<double>(r.bits_per_second);
  if (v >= 1e9) return trim_decimal(v / 1e9, 3) + "Gbps";
  if (v >= 1e6) return trim_decimal(v / 1e6, 3) + "Mbps";
  if (v >= 1e3) return trim_decimal(v / 1e3, 3) + "Kbps";
  return trim_decimal(v, 0) + "bps";
}

}  // namespace qs
