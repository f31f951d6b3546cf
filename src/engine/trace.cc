#include "quicksilver/engine/trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

namespace qs {

void SpanRecorder::add(TimeNs start, TimeNs end, std::string name) {
  if (!out_) return;
  if (merge_ && open_ && !out_->empty() && out_->back().end == start && out_->back().name == name) {
    out_->back().end = end;
    return;
  }
  out_->push_back(TraceSpan{host_, track_, start, end, std::move(name)});
  open_ = true;
}

Result<TraceDetail> parse_trace_detail(const std::string& text) {
  if (text == "auto") return TraceDetail::kAuto;
  if (text == "fine") return TraceDetail::kFine;
  if (text == "coarse") return TraceDetail::kCoarse;
  return invalid_argument("'" + text + "': give auto, fine or coarse");
}

namespace {
// Bytes of one span's event in the written JSON, about (measured on VGG-16's Mercury trace:
// 42.1 MB for 574,770 spans, 73 bytes each).
constexpr std::uint64_t kBytesPerSpan = 73;

std::vector<TraceSpan> coarse_spans(std::vector<TraceSpan> spans) {
  std::stable_sort(spans.begin(), spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
    return std::tie(a.host, a.track, a.start) < std::tie(b.host, b.track, b.start);
  });
  std::vector<TraceSpan> out;
  for (TraceSpan& s : spans) {
    if (!out.empty() && out.back().host == s.host && out.back().track == s.track &&
        out.back().name == s.name) {
      out.back().end = std::max(out.back().end, s.end);
      continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}
}  // namespace

std::string TraceWritten::describe(const std::string& path) const {
  const auto mb = [](std::uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(b) / 1e6);
    return std::string(text);
  };
  std::string line = "trace: " + std::to_string(spans) + " spans, " + mb(bytes) + " -> " + path;
  if (coarse) {
    line +=
        " (coarse: a tensor's consecutive packets on a track as one span; every packet, about " +
        mb(fine_bytes_estimate) + ": --trace-detail fine)";
  } else if (fine_spans > 0 && fine_bytes_estimate > kCoarseTraceAbove / 10) {
    line += " (every span; --trace-detail coarse for one per tensor run)";
  }
  return line;
}

Result<TraceWritten> write_chrome_trace(const std::vector<SimResult>& results,
                                        const std::string& path, TraceDetail detail) {
  using nlohmann::json;
  TraceWritten w;
  for (const SimResult& r : results) w.fine_spans += r.trace.size();
  w.fine_bytes_estimate = w.fine_spans * kBytesPerSpan;
  w.coarse = detail == TraceDetail::kCoarse ||
             (detail == TraceDetail::kAuto && w.fine_bytes_estimate > kCoarseTraceAbove);
  json events = json::array();
  static const char* kTracks[] = {"compute", "uplink", "downlink", "gradients"};
  int pid_base = 0;
  for (const SimResult& r : results) {
    int max_host = 0;
    for (const TraceSpan& s : r.trace) max_host = std::max(max_host, s.host);
    for (int h = 0; h <= max_host; ++h) {
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", pid_base + h},
                        {"args", {{"name", r.policy + " worker " + std::to_string(h)}}}});
      for (int t = 0; t < 4; ++t) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", pid_base + h},
                          {"tid", t},
                          {"args", {{"name", kTracks[t]}}}});
      }
    }
    const std::vector<TraceSpan> spans = w.coarse ? coarse_spans(r.trace) : r.trace;
    for (const TraceSpan& s : spans) {
      events.push_back({{"name", s.name},
                        {"ph", "X"},
                        {"pid", pid_base + s.host},
                        {"tid", s.track},
                        {"ts", to_us(s.start)},
                        {"dur", to_us(s.end - s.start)}});
    }
    w.spans += spans.size();
    pid_base += max_host + 1;
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error(path + ": cannot open trace file for writing");
  const std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  out << text << "\n";
  if (!out) return io_error(path + ": write failed");
  w.bytes = text.size() + 1;
  return w;
}

}  // namespace qs
