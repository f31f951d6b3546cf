#include "quicksilver/core/bandwidth_schedule.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "quicksilver/core/check.h"
#include "quicksilver/core/rng.h"
#include "quicksilver/core/text_table.h"

namespace qs {

BandwidthSchedule::BandwidthSchedule(std::vector<Segment> segments)
    : segments_(std::move(segments)) {
  QS_CHECK(!segments_.empty() && segments_.front().start == 0);
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    QS_CHECK(segments_[i].rate.bits_per_second > 0);
    if (i) QS_CHECK(segments_[i].start > segments_[i - 1].start);
  }
}

Result<BandwidthSchedule> BandwidthSchedule::parse_trace(const std::string& text,
                                                         const std::string& source) {
  std::vector<Segment> segs;
  QS_ASSIGN_OR_RETURN(auto lines, parse_two_columns(text, source, "'TIME RATE' (e.g. '5s 2Gbps')"));
  for (const TwoColumnLine& l : lines) {
    auto t = parse_time(l.first);
    if (!t) return t.status().with_context(l.where);
    auto r = parse_rate(l.second);
    if (!r) return r.status().with_context(l.where);
    if (segs.empty() && *t != 0) return invalid_argument(l.where + ": the first time must be 0");
    if (!segs.empty() && *t <= segs.back().start) {
      return invalid_argument(l.where + ": times must strictly increase");
    }
    segs.push_back({*t, *r});
  }
  if (segs.empty()) return invalid_argument(source + ": no 'TIME RATE' lines");
  return BandwidthSchedule(std::move(segs));
}

Result<BandwidthSchedule> BandwidthSchedule::load_trace(const std::string& path) {
  QS_ASSIGN_OR_RETURN(auto text, read_text_file(path, "bandwidth trace"));
  return parse_trace(text, path);
}

Result<BandwidthSchedule> BandwidthSchedule::parse_random(const std::string& spec,
                                                          std::uint64_t seed, TimeNs horizon) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  std::string p;
  while (std::getline(ss, p, ':')) parts.push_back(p);
  if (parts.size() < 4 || parts.size() > 5 || parts[0] != "random") {
    return invalid_argument("'" + spec + "': expected random:MIN:MAX:PERIOD[:SEED]");
  }
  auto lo = parse_rate(parts[1]);
  if (!lo) return lo.status().with_context(spec);
  auto hi = parse_rate(parts[2]);
  if (!hi) return hi.status().with_context(spec);
  auto period = parse_time(parts[3]);
  if (!period) return period.status().with_context(spec);
  if (*hi < *lo) return invalid_argument("'" + spec + "': MAX is below MIN");
  if (*period <= 0) return invalid_argument("'" + spec + "': PERIOD must be positive");
  if (parts.size() == 5) {
    char* end = nullptr;
    seed = std::strtoull(parts[4].c_str(), &end, 10);
    if (parts[4].empty() || *end) return invalid_argument("'" + spec + "': bad SEED");
  }
  Rng rng(seed);
  std::vector<Segment> segs;
  const TimeNs n = std::max<TimeNs>(1, horizon / *period);
  for (TimeNs i = 0; i < n && i < 1'000'000; ++i) {
    double r = rng.uniform(static_cast<double>(lo->bits_per_second),
                           static_cast<double>(hi->bits_per_second));
    auto mbps = std::max<std::int64_t>(1, static_cast<std::int64_t>(r / 1e6 + 0.5));
    segs.push_back({i * *period, Rate{mbps * 1'000'000}});
  }
  return BandwidthSchedule(std::move(segs));
}

Result<BandwidthSchedule> BandwidthSchedule::from_spec(const std::string& spec,
                                                       std::uint64_t seed) {
  if (spec.rfind("random:", 0) == 0) return parse_random(spec, seed);
  std::error_code ec;
  if (std::filesystem::exists(spec, ec)) return load_trace(spec);
  auto r = parse_rate(spec);
  if (r) return BandwidthSchedule(*r);
  return invalid_argument("'" + spec +
                          "' is neither a bandwidth trace file, a random spec "
                          "(random:MIN:MAX:PERIOD[:SEED]) nor a rate");
}

std::size_t BandwidthSchedule::segment_index(TimeNs t) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), t,
                             [](TimeNs v, const Segment& s) { return v < s.start; });
  return static_cast<std::size_t>(it - segments_.begin()) - 1;
}

Rate BandwidthSchedule::rate_at(TimeNs t) const {
  return segments_[segment_index(std::max<TimeNs>(t, 0))].rate;
}

TimeNs BandwidthSchedule::finish_time(TimeNs start, Bytes bytes) const {
  if (segments_.size() == 1) return add_saturated(start, transfer_time(bytes, segments_[0].rate));
  std::size_t i = segment_index(std::max<TimeNs>(start, 0));
  TimeNs t = start;
  Bytes left = bytes;
  while (true) {
    const Rate r = segments_[i].rate;
    if (i + 1 == segments_.size()) return add_saturated(t, transfer_time(left, r));
    const TimeNs seg_end = segments_[i + 1].start;
    const Bytes fit = bytes_in(seg_end - t, r);
    if (fit >= left) return add_saturated(t, transfer_time(left, r));
    left -= fit;
    t = seg_end;
    ++i;
  }
}

BandwidthSchedule BandwidthSchedule::scaled(double factor) const {
  std::vector<Segment> segs = segments_;
  for (auto& s : segs) {
    s.rate.bits_per_second =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(s.rate.bits_per_second * factor));
  }
  return BandwidthSchedule(std::move(segs));
}

BandwidthSchedule BandwidthSchedule::shifted(TimeNs offset) const {
  QS_CHECK(offset >= 0);
  std::vector<Segment> segs{{0, rate_at(offset)}};
  for (const Segment& s : segments_) {
    if (s.start > offset) segs.push_back(Segment{s.start - offset, s.rate});
  }
  return BandwidthSchedule(std::move(segs));
}

BandwidthSchedule BandwidthSchedule::delayed(TimeNs delay) const {
  QS_CHECK(delay >= 0);
  std::vector<Segment> segs{{0, segments_.front().rate}};
  for (std::size_t i = 1; i < segments_.size(); ++i) {
    segs.push_back(Segment{add_saturated(segments_[i].start, delay), segments_[i].rate});
  }
  return BandwidthSchedule(std::move(segs));
}

}  // namespace qs
