// libFuzzer target: the bandwidth-trace loader's parser ('TIME RATE' lines through
// core/text_table, include/core/quicksilver/core/bandwidth_schedule.h) and the schedule it
// builds. Properties: bad input is a Status; a parsed schedule starts at 0 with strictly
// increasing times; finish_time never goes back in time and rate_at is positive.
#include <cstddef>
#include <cstdint>
#include <string>

#include "quicksilver/core/bandwidth_schedule.h"
#include "quicksilver/core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto s = qs::BandwidthSchedule::parse_trace(text, "<fuzz>");
  if (!s) return 0;
  const auto& segs = s->segments();
  QS_CHECK(!segs.empty() && segs.front().start == 0);
  for (std::size_t i = 1; i < segs.size(); ++i) QS_CHECK(segs[i].start > segs[i - 1].start);
  for (const qs::TimeNs t :
       {qs::TimeNs{0}, segs.back().start, segs.back().start + 1, segs.back().start / 2}) {
    QS_CHECK(s->rate_at(t).bits_per_second > 0);
    for (const qs::Bytes b : {qs::Bytes{0}, qs::Bytes{1}, qs::Bytes{1} << 20, qs::Bytes{1} << 40}) {
      QS_CHECK(s->finish_time(t, b) >= t);
    }
  }
  (void)s->scaled(0.5);
  (void)s->shifted(segs.back().start / 3);
  return 0;
}
