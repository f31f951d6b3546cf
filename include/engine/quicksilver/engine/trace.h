// Timelines: the spans a run records (simulated or measured, TraceSpan) and the Chrome
// trace they are written to (chrome://tracing, ui.perfetto.dev).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/trace_span.h"
#include "quicksilver/engine/result.h"

namespace qs {

// Appends busy spans of one host's track to a trace. With `merge`, a span that starts where
// the previous one of the same name ended extends it (so that a packet-level policy does
// not produce one span per packet). A recorder made with no output records nothing.
class SpanRecorder {
 public:
  SpanRecorder() = default;
  SpanRecorder(std::vector<TraceSpan>* out, int host, int track, bool merge)
      : out_(out), host_(host), track_(track), merge_(merge) {}
  bool enabled() const { return out_ != nullptr; }
  void add(TimeNs start, TimeNs end, std::string name);

 private:
  std::vector<TraceSpan>* out_ = nullptr;
  int host_ = 0, track_ = 0;
  bool merge_ = false;
  bool open_ = false;  // the last span of out_ is this recorder's
};

// How fine a written trace is. kFine: every span recorded (a packet-level policy's every
// packet). kCoarse: on each host's track, consecutive spans of one name (a tensor's
// packets one after another, with the gaps between them) become one span. kAuto: fine
// unless the fine trace would exceed kCoarseTraceAbove bytes, then coarse.
enum class TraceDetail { kAuto, kFine, kCoarse };
inline constexpr std::uint64_t kCoarseTraceAbove = 10'000'000;
// "auto", "fine", "coarse".
Result<TraceDetail> parse_trace_detail(const std::string& text);

// What write_chrome_trace wrote: its spans and bytes, whether it is the coarse trace, and
// the spans and estimated bytes of the fine one.
struct TraceWritten {
  std::size_t spans = 0;
  std::uint64_t bytes = 0;
  bool coarse = false;
  std::size_t fine_spans = 0;
  std::uint64_t fine_bytes_estimate = 0;
  // One line for stderr: what was written where, and how to get the other detail.
  std::string describe(const std::string& path) const;
};

// Writes a Chrome trace (chrome://tracing, Perfetto) with one process per host and
// tracks compute/uplink/downlink.
Result<TraceWritten> write_chrome_trace(const std::vector<SimResult>& results,
                                        const std::string& path,
                                        TraceDetail detail = TraceDetail::kAuto);

}  // namespace qs
