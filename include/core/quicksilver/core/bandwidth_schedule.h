// BandwidthSchedule: a link rate that changes over time (piecewise constant), from a
// constant, a trace file or a random spec (the Mercury paper's dynamic scenarios: "the
// bandwidth varies randomly between 1 and 10 Gbps every 5 seconds").
//
// Trace file: one "TIME RATE" pair per line with units ("0s 10Gbps", "5s 2.5Gbps");
// '#' starts a comment; times strictly increase and the first is 0.
// Random spec: "random:MIN:MAX:PERIOD[:SEED]", e.g. "random:1Gbps:10Gbps:5s"; every
// PERIOD the rate is drawn uniformly in [MIN, MAX] (rounded to 1 Mbps). Without a seed in
// the spec, the caller's seed is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs {

class BandwidthSchedule {
 public:
  struct Segment {
    TimeNs start;
    Rate rate;
  };

  explicit BandwidthSchedule(Rate constant) : segments_{{0, constant}} {}
  // Precondition: non-empty, starts at 0, strictly increasing, every rate > 0.
  explicit BandwidthSchedule(std::vector<Segment> segments);

  static Result<BandwidthSchedule> parse_trace(const std::string& text, const std::string& source);
  static Result<BandwidthSchedule> load_trace(const std::string& path);
  // `horizon`: how far to generate (the last segment extends forever).
  static Result<BandwidthSchedule> parse_random(const std::string& spec, std::uint64_t seed,
                                                TimeNs horizon = 24 * 3600 * kNsPerSec);
  // A path, a random spec, or a plain rate ("10Gbps").
  static Result<BandwidthSchedule> from_spec(const std::string& spec, std::uint64_t seed);

  bool is_constant() const { return segments_.size() == 1; }
  const std::vector<Segment>& segments() const { return segments_; }
  Rate rate_at(TimeNs t) const;
  // When `bytes` sent from `start` finish at this schedule's rates (exact integer ns,
  // rounded up).
  TimeNs finish_time(TimeNs start, Bytes bytes) const;
  // Scales every rate by `factor` (e.g. the emulated cluster's scale-down).
  BandwidthSchedule scaled(double factor) const;
  // The schedule as seen from `offset` on: time 0 of the result is `offset` here.
  // Precondition: offset >= 0.
  BandwidthSchedule shifted(TimeNs offset) const;
  // The schedule seen from `delay` before its start: the first rate holds `delay` longer,
  // every later change comes `delay` later. Precondition: delay >= 0.
  BandwidthSchedule delayed(TimeNs delay) const;

 private:
  std::size_t segment_index(TimeNs t) const;
  std::vector<Segment> segments_;
};

}  // namespace qs
