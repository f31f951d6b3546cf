// Timelines: the spans a run records (simulated or measured, TraceSpan) and the Chrome
// trace they are written to (chrome://tracing, ui.perfetto.dev).
#pragma once

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

// Writes a Chrome trace (chrome://tracing, Perfetto) with one process per host and
// tracks compute/uplink/downlink.
Status write_chrome_trace(const std::vector<SimResult>& results, const std::string& path);

}  // namespace qs
