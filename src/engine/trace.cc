#include "quicksilver/engine/trace.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

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

Status write_chrome_trace(const std::vector<SimResult>& results, const std::string& path) {
  using nlohmann::json;
  json events = json::array();
  static const char* kTracks[] = {"compute", "uplink", "downlink", "gradients"};
  int pid_base = 0;
  for (const SimResult& r : results) {
    int max_host = 0;
    for (const TraceSpan& s : r.trace) max_host = std::max(max_host, s.host);
    for (int h = 0; h <= max_host; ++h) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid_base + h},
                        {"args", {{"name", r.policy + " worker " + std::to_string(h)}}}});
      for (int t = 0; t < 4; ++t) {
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid_base + h}, {"tid", t},
                          {"args", {{"name", kTracks[t]}}}});
      }
    }
    for (const TraceSpan& s : r.trace) {
      events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", pid_base + s.host},
                        {"tid", s.track}, {"ts", to_us(s.start)}, {"dur", to_us(s.end - s.start)}});
    }
    pid_base += max_host + 1;
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error(path + ": cannot open trace file for writing");
  out << doc.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  if (!out) return io_error(path + ": write failed");
  return Status::ok();
}

}  // namespace qs
