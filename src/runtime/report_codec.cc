#include "quicksilver/runtime/report_codec.h"

#include <nlohmann/json.hpp>

namespace qs::runtime {

using nlohmann::json;

std::string report_to_json(const WorkerReport& r) {
  json it = json::array();
  for (TimeNs t : r.iteration_times) it.push_back(t);
  json fit = json::array();
  for (const AllReduceCost& c : r.allreduce_fit) fit.push_back({c.a, c.b_ns_per_byte});
  json trace = json::array();
  for (const TraceSpan& s : r.trace) trace.push_back({s.track, s.start, s.end, s.name});
  return json{{"worker", r.worker_id},
              {"policy", r.policy},
              {"congestion_control", r.congestion_control},
              {"iteration_times_ns", it},
              {"median_iteration_ns", r.median_iteration},
              {"bytes_pushed_per_iteration", r.bytes_pushed_per_iteration},
              {"units_per_iteration", r.units_per_iteration},
              {"uplink_gbps", r.uplink_gbps},
              {"uplink_utilisation", r.uplink_utilisation},
              {"push_end", r.push_end},
              {"queue_delay_ns", {r.queue_delay_p50, r.queue_delay_p99, r.queue_delay_max}},
              {"urgent_delay_ns", {r.urgent_delay_p50, r.urgent_delay_p99, r.urgent_delay_max}},
              {"ack_rtt_ns", {r.ack_rtt_p10, r.ack_rtt_p50}},
              {"iterations_verified", r.iterations_verified},
              {"retransmits", r.retransmits},
              {"timeouts", r.timeouts},
              {"first_backward_ns", r.first_backward_at},
              {"allreduce_fit", fit},
              {"notes", r.notes},
              {"staging_buffers_max", r.staging_buffers_max},
              {"trace", trace}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<WorkerReport> report_from_json(std::string_view line) {
  try {
    const json j = json::parse(line);
    WorkerReport r;
    r.worker_id = j.value("worker", 0);
    r.policy = j.value("policy", std::string());
    r.congestion_control = j.value("congestion_control", std::string("?"));
    for (const json& t : j.at("iteration_times_ns")) r.iteration_times.push_back(t.get<TimeNs>());
    r.median_iteration = j.value("median_iteration_ns", TimeNs{0});
    r.bytes_pushed_per_iteration = j.value("bytes_pushed_per_iteration", Bytes{0});
    r.units_per_iteration = j.value("units_per_iteration", std::int64_t{0});
    r.uplink_gbps = j.value("uplink_gbps", 0.0);
    r.uplink_utilisation = j.value("uplink_utilisation", 0.0);
    r.push_end = j.value("push_end", std::string("?"));
    const json& q = j.at("queue_delay_ns");
    r.queue_delay_p50 = q.at(0).get<TimeNs>();
    r.queue_delay_p99 = q.at(1).get<TimeNs>();
    r.queue_delay_max = q.at(2).get<TimeNs>();
    const json& u = j.at("urgent_delay_ns");
    r.urgent_delay_p50 = u.at(0).get<TimeNs>();
    r.urgent_delay_p99 = u.at(1).get<TimeNs>();
    r.urgent_delay_max = u.at(2).get<TimeNs>();
    if (j.contains("ack_rtt_ns")) {
      r.ack_rtt_p10 = j.at("ack_rtt_ns").at(0).get<TimeNs>();
      r.ack_rtt_p50 = j.at("ack_rtt_ns").at(1).get<TimeNs>();
    }
    r.iterations_verified = j.value("iterations_verified", 0);
    r.retransmits = j.value("retransmits", std::vector<std::int64_t>());
    r.timeouts = j.value("timeouts", std::vector<std::int64_t>());
    r.first_backward_at = j.value("first_backward_ns", TimeNs{0});
    if (j.contains("allreduce_fit")) {
      for (const json& c : j.at("allreduce_fit")) {
        r.allreduce_fit.push_back(AllReduceCost{c.at(0).get<TimeNs>(), c.at(1).get<double>()});
      }
    }
    r.notes = j.value("notes", std::vector<std::string>());
    r.staging_buffers_max = j.value("staging_buffers_max", std::int64_t{0});
    if (j.contains("trace")) {
      for (const json& e : j.at("trace")) {
        r.trace.push_back(TraceSpan{r.worker_id, e.at(0).get<int>(), e.at(1).get<TimeNs>(),
                                    e.at(2).get<TimeNs>(), e.at(3).get<std::string>()});
      }
    }
    return r;
  } catch (const std::exception& e) {
    return invalid_argument("a worker's report is malformed: " + std::string(e.what()));
  }
}

}  // namespace qs::runtime
