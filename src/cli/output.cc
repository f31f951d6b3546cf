#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"

namespace qs::cli {
namespace {

// Below this idle fraction of the machine's CPU a measured run is flagged as CPU-bound.
constexpr double kCpuBoundIdle = 0.10;

std::string config_line(const Job& job) {
  const ClusterConfig& c = job.cluster;
  // A batch of 0: several jobs, each its own (named with the jobs).
  std::string s = job.profile.name +
                  (job.profile.batch_size > 0 ? ", batch " + std::to_string(job.profile.batch_size)
                                              : std::string()) +
                  ", " + std::to_string(c.workers) + " workers";
  if (c.architecture == Architecture::kPs) {
    s += ", " + std::to_string(c.servers) + " servers (ps)";
  } else {
    s += std::string(", all-reduce ") + allreduce_algorithm_name(c.allreduce);
  }
  s += ", " + (c.schedule && !c.schedule->is_constant() ? std::string("time-varying bandwidth")
                                                        : format_rate(c.bandwidth));
  s += ", latency " + format_time(c.latency);
  // Hosts not like the others (Mercury Fig. 21), each named once.
  std::string odd;
  auto name = [&](const char* host, std::size_t i, const std::string& what) {
    odd += (odd.empty() ? "" : ", ") + std::string(host) + " " + std::to_string(i) + " " + what;
  };
  for (std::size_t i = 0; i < c.worker_bandwidth.size(); ++i) {
    if (c.worker_bandwidth[i] != c.bandwidth)
      name("worker", i, "at " + format_rate(c.worker_bandwidth[i]));
  }
  for (std::size_t i = 0; i < c.server_bandwidth.size(); ++i) {
    if (c.server_bandwidth[i] != c.bandwidth)
      name("server", i, "at " + format_rate(c.server_bandwidth[i]));
  }
  for (std::size_t i = 0; i < c.compute_factor.size(); ++i) {
    if (c.compute_factor[i] != 1.0) {
      char f[32];
      std::snprintf(f, sizeof f, "%g", c.compute_factor[i]);
      name("worker", i, std::string("computing x") + f);
    }
  }
  if (!odd.empty()) s += " (" + odd + ")";
  return s;
}

nlohmann::json result_json(const SimResult& r) {
  using nlohmann::json;
  json it = json::array();
  for (TimeNs t : r.iteration_times) it.push_back(to_ms(t));
  return json{{"policy", r.policy},
              {"iteration_ms", to_ms(r.iteration_time)},
              {"samples_per_second", r.samples_per_second},
              {"scaling_efficiency", r.scaling_efficiency},
              {"link_utilisation", r.link_utilisation},
              {"gpu_idle_ms", to_ms(r.gpu_idle)},
              {"compute_ms", to_ms(r.compute_time)},
              {"iterations_ms", it},
              {"bytes_per_iteration", r.bytes_pushed_per_iteration},
              {"messages_per_iteration", r.messages_per_iteration},
              {"events", r.events},
              {"notes", r.notes}};
}

double rel_error(const SimResult& measured, const SimResult& predicted) {
  return measured.iteration_time > 0 ? (static_cast<double>(predicted.iteration_time) -
                                        static_cast<double>(measured.iteration_time)) /
                                           static_cast<double>(measured.iteration_time)
                                     : 0.0;
}

}  // namespace

void print_table(const Job& job, const std::vector<Row>& rows, const std::string& title) {
  std::printf("%s: %s; seed %llu; %s of %d iterations after %d warm-up\n", title.c_str(),
              config_line(job).c_str(), static_cast<unsigned long long>(job.sim.seed),
              std::string(statistic_name(job.sim.statistic)).c_str(),
              job.sim.iterations - job.sim.warmup, job.sim.warmup);
  const bool with_pred = !rows.empty() && rows.front().predicted.has_value();
  const bool with_cpu = !rows.empty() && rows.front().result.cpu_idle >= 0;
  std::printf("%-18s %12s %12s %10s %10s %12s", "policy", "iteration", "samples/s", "scaling",
              "link util", "GPU idle");
  if (with_pred) std::printf(" %12s %8s", "predicted", "error");
  if (with_cpu) std::printf(" %9s", "CPU idle");
  const bool with_rto = !rows.empty() && !rows.front().result.timeouts.empty();
  if (with_rto) std::printf(" %6s", "RTOs");
  std::printf("\n");
  for (const Row& row : rows) {
    const SimResult& r = row.result;
    std::printf("%-18s %10.3fms %12.1f %10.3f %9.1f%% %10.3fms", r.policy.c_str(),
                to_ms(r.iteration_time), r.samples_per_second, r.scaling_efficiency,
                100.0 * r.link_utilisation, to_ms(r.gpu_idle));
    if (row.predicted) {
      std::printf(" %10.3fms %+7.1f%%", to_ms(row.predicted->iteration_time),
                  100.0 * rel_error(r, *row.predicted));
    }
    if (with_cpu) std::printf(" %8.1f%%", 100.0 * std::max(0.0, r.cpu_idle));
    if (with_rto) {
      std::int64_t rtos = 0;
      for (std::int64_t t : r.timeouts) rtos += t;
      std::printf(" %6lld", static_cast<long long>(rtos));
    }
    std::printf("\n");
  }
  for (const Row& row : rows) {
    if (row.result.cpu_idle >= 0 && row.result.cpu_idle < kCpuBoundIdle) {
      std::printf(
          "  %s: CPU-bound: the machine was %.1f%% idle during this run (below %.0f%%), so the "
          "figure measures this machine's scheduler as much as the policy\n",
          row.result.policy.c_str(), 100.0 * row.result.cpu_idle, 100.0 * kCpuBoundIdle);
    }
  }
  for (const Row& row : rows) {
    for (const std::string& n : row.result.notes)
      std::printf("  %s: %s\n", row.result.policy.c_str(), n.c_str());
  }
}

void print_json(const Job& job, const std::vector<Row>& rows, const MeasuredConfig* measured) {
  using nlohmann::json;
  json results = json::array();
  auto one = [](const SimResult& r) { return result_json(r); };
  auto with_cpu = [](json j, const SimResult& r) {
    if (r.cpu_idle >= 0) j["cpu_idle"] = r.cpu_idle;
    if (!r.retransmits.empty()) j["retransmits_per_iteration"] = r.retransmits;
    if (!r.worker_retransmits.empty()) j["worker_retransmits_per_iteration"] = r.worker_retransmits;
    if (!r.timeouts.empty()) j["timeouts_per_iteration"] = r.timeouts;
    if (r.host_queue_drops >= 0) j["host_queue_drops"] = r.host_queue_drops;
    if (r.switch_drops >= 0) j["switch_drops"] = r.switch_drops;
    return j;
  };
  for (const Row& row : rows) {
    json j = with_cpu(one(row.result), row.result);
    if (row.predicted) {
      j["predicted_iteration_ms"] = to_ms(row.predicted->iteration_time);
      j["relative_error"] = rel_error(row.result, *row.predicted);
      j["predicted_link_utilisation"] = row.predicted->link_utilisation;
    }
    results.push_back(j);
  }
  const ClusterConfig& c = job.cluster;
  json config = {{"model", job.profile.name},
                 {"batch_size", job.profile.batch_size},
                 {"architecture", architecture_name(c.architecture)},
                 {"workers", c.workers},
                 {"servers", c.servers},
                 {"bandwidth_bps", c.bandwidth.bits_per_second},
                 {"latency_ns", c.latency},
                 {"allreduce", allreduce_algorithm_name(c.allreduce)},
                 {"iterations", job.sim.iterations},
                 {"warmup", job.sim.warmup},
                 {"statistic", statistic_name(job.sim.statistic)}};
  if (measured && measured->goodput) config["goodput_fraction"] = *measured->goodput;
  if (measured && !measured->calibration.empty()) {
    config["calibration"] = measured->calibration;
    config["calibration_cpu_idle"] = measured->calibration_cpu_idle;
  }
  if (measured && measured->scale > 0) config["scale"] = measured->scale;
  if (measured && measured->rto_min > 0) config["rto_min_ns"] = measured->rto_min;
  if (measured && measured->switch_buffer > 0) config["switch_buffer_ns"] = measured->switch_buffer;
  if (measured && measured->host_queue > 0) config["host_queue_ns"] = measured->host_queue;
  if (measured && measured->gso_max > 0) config["host_gso_bytes"] = measured->gso_max;
  // Hosts that are not alike (shown only when given, so other outputs stay as they were).
  auto rates = [](const std::vector<Rate>& v) {
    json a = json::array();
    for (Rate r : v) a.push_back(r.bits_per_second);
    return a;
  };
  if (!c.worker_bandwidth.empty()) config["worker_bandwidths_bps"] = rates(c.worker_bandwidth);
  if (!c.server_bandwidth.empty()) config["server_bandwidths_bps"] = rates(c.server_bandwidth);
  if (!c.server_shares.empty()) config["server_shares"] = c.server_shares;
  // replace: a name that is not UTF-8 (a profile built by a caller) prints, with U+FFFD.
  std::cout << json{{"results", results}, {"config", config}, {"seed", job.sim.seed}}.dump(
                   1, ' ', false, json::error_handler_t::replace)
            << "\n";
}

void print_shared(const Job& job, const std::vector<SharedJob>& jobs,
                  const std::vector<SimResult>& results, const SharingOptions& sharing,
                  bool as_json) {
  const ClusterConfig& c = job.cluster;
  if (as_json) {
    using nlohmann::json;
    json rows = json::array();
    for (std::size_t j = 0; j < results.size(); ++j) {
      json r = result_json(results[j]);
      r["job"] = j;
      r["model"] = jobs[j].profile.name;
      r["batch_size"] = jobs[j].profile.batch_size;
      rows.push_back(r);
    }
    json config = {{"jobs", jobs.size()},
                   {"job_sharing", job_sharing_name(sharing.sharing)},
                   {"share_gpus", sharing.share_gpus},
                   {"architecture", architecture_name(c.architecture)},
                   {"workers", c.workers},
                   {"servers", c.servers},
                   {"bandwidth_bps", c.bandwidth.bits_per_second},
                   {"latency_ns", c.latency},
                   {"iterations", job.sim.iterations},
                   {"warmup", job.sim.warmup},
                   {"statistic", statistic_name(job.sim.statistic)}};
    std::cout << json{{"results", rows}, {"config", config}, {"seed", job.sim.seed}}.dump(
                     1, ' ', false, json::error_handler_t::replace)
              << "\n";
    return;
  }
  std::printf(
      "simulated: %zu jobs sharing %d workers, %d servers (ps), %s, latency %s; links shared %s, "
      "GPUs %s; "
      "seed %llu; %s of %d iterations after %d warm-up\n",
      jobs.size(), c.workers, c.servers,
      (c.schedule && !c.schedule->is_constant() ? std::string("time-varying bandwidth")
                                                : format_rate(c.bandwidth))
          .c_str(),
      format_time(c.latency).c_str(), job_sharing_name(sharing.sharing),
      sharing.share_gpus ? "shared" : "one per job and worker",
      static_cast<unsigned long long>(job.sim.seed),
      std::string(statistic_name(job.sim.statistic)).c_str(), job.sim.iterations - job.sim.warmup,
      job.sim.warmup);
  std::printf("%-4s %-14s %6s %-18s %12s %12s %10s %10s\n", "job", "model", "batch", "policy",
              "iteration", "samples/s", "scaling", "link util");
  for (std::size_t j = 0; j < results.size(); ++j) {
    const SimResult& r = results[j];
    std::printf("%-4zu %-14s %6d %-18s %10.3fms %12.1f %10.3f %9.1f%%\n", j,
                jobs[j].profile.name.c_str(), jobs[j].profile.batch_size, r.policy.c_str(),
                to_ms(r.iteration_time), r.samples_per_second, r.scaling_efficiency,
                100.0 * r.link_utilisation);
  }
}

}  // namespace qs::cli
