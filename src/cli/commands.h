// Private to the CLI: the subcommands and the flag set that `simulate` and `run` share.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "quicksilver/model/profile.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/sim/simulator.h"

namespace qs::cli {

// Raw flag values (strings keep their units until validated).
struct SimFlags {
  std::string model = "vgg16";
  std::string device = "rtx3090";
  int batch_size = 0;
  std::string policy = "all";
  int workers = 4;
  int servers = 4;
  std::string architecture = "ps";
  std::string bandwidth = "10Gbps";
  std::string latency = "0us";
  std::string allreduce = "ring";
  std::string bandwidth_trace;
  std::string compute_factor;
  std::string worker_bandwidths, server_bandwidths, server_shares;  // ps simulator, per host
  // simulate only: several jobs sharing the cluster (MODEL[:POLICY[:BATCH]] each).
  std::vector<std::string> jobs;
  std::string job_sharing = "fair";
  bool separate_gpus = false;
  std::string reduction_rate, allreduce_a, allreduce_b, allreduce_fit;
  double second_link = 0;
  std::string compression = "none";  // none, bf16, fp16: gradient elements on the wire
  bool overlapping_pulls = false;
  std::string frame_header, frame_cpu, link_burst;
  std::string ack_queue;
  std::string link_sharing;
  int iterations = 5;
  int warmup = 1;
  std::string statistic = "median";
  std::uint64_t seed = 1;
  bool json = false;
  std::string trace;
  std::string trace_detail = "auto";  // --trace-detail: auto, fine, coarse (engine/trace.h)
  // The policy knobs, by knob name (generated from the registry's table): the text of a
  // valued flag as given, or "true" for a switch given (absent: the knob's default).
  std::map<std::string, std::string> knobs;
  std::map<std::string, bool> switches;
};

void add_sim_flags(CLI::App* app, SimFlags* f);
// --trace's file from these results, at --trace-detail, one line on stderr saying what.
Status write_trace(const std::vector<SimResult>& results, const SimFlags& f);
// simulate's own: --job, --job-sharing, --separate-gpus (Mercury Fig. 20).
void add_shared_job_flags(CLI::App* app, SimFlags* f);
// Validates flags into a Job; errors name the flag.
Result<Job> make_job(const SimFlags& f);
// The --job specs (MODEL[:POLICY[:BATCH]]) as jobs; a spec without a policy takes `job`'s
// one policy. Errors name the spec.
Result<std::vector<SharedJob>> parse_shared_jobs(const SimFlags& f, const Job& job);

using Row = ResultRow;
// Prints the human-readable table (stdout).
void print_table(const Job& job, const std::vector<Row>& rows, const std::string& title);
// What a measured run adds to the --json document's config (run --netns).
struct MeasuredConfig {
  // The links' measured TCP goodput as a fraction of the nominal rate.
  std::optional<double> goodput;
  std::string calibration;           // ClusterRunResult::calibration
  double calibration_cpu_idle = -1;  // ClusterRunResult::calibration_cpu_idle
  TimeNs rto_min = 0, switch_buffer = 0, host_queue = 0;
  Bytes gso_max = 0;
  double scale = 0;  // ClusterRunResult::scale (bandwidth and tensor sizes); 0: not given
};
// Prints the --json document (stdout), with `measured` in its config when given.
void print_json(const Job& job, const std::vector<Row>& rows,
                const MeasuredConfig* measured = nullptr);
// Several jobs sharing one cluster (simulate --job): one row per job.
void print_shared(const Job& job, const std::vector<SharedJob>& jobs,
                  const std::vector<SimResult>& results, const SharingOptions& sharing,
                  bool as_json);

// Prints "PREFIX: MESSAGE" on stderr and returns `code`: every command's error exit (2:
// bad input, naming the flag; 1: a run that failed).
int fail(std::string_view prefix, std::string_view message, int code = 2);
inline int fail(std::string_view prefix, const Status& s, int code = 2) {
  return fail(prefix, s.message(), code);
}

int run_models(const std::string& device, bool json);
// `quicksilver policies`: the registry's policies and knobs; --markdown: the knob tables of
// docs/policies-ps.md and docs/policies-allreduce.md.
int run_policies(bool markdown, const std::string& architecture);
int run_simulate(const SimFlags& f);

}  // namespace qs::cli
