// Private to the CLI: the subcommands and the flag set that `simulate` and `run` share.
#pragma once

#include <CLI/CLI.hpp>
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
  std::string packet_size, partition_size, credit_size, slice_size, startup_time, split_threshold;
  std::string bandwidth_trace;
  std::string compute_factor;
  std::string reduction_rate, allreduce_a, allreduce_b, allreduce_fit;
  std::optional<double> deft_mu, deft_epsilon;
  std::string ddp_bucket_size, ddp_first_bucket_size, deft_partition_size;
  std::optional<int> deft_exact_items;
  double second_link = 0;
  std::string prophet_partition_size;
  bool prophet_overrun = false;
  int iterations = 5;
  int warmup = 1;
  std::string statistic = "median";
  std::uint64_t seed = 1;
  bool json = false;
  std::string trace;
};

// Everything a simulate/run invocation needs, validated.
struct Job {
  Profile profile;
  std::vector<std::string> policies;
  PolicyOptions policy_options;
  ClusterConfig cluster;
  SimOptions sim;
};

void add_sim_flags(CLI::App* app, SimFlags* f);
// Validates flags into a Job; errors name the flag.
Result<Job> make_job(const SimFlags& f);

struct Row {
  SimResult result;
  std::optional<SimResult> predicted;  // runtime rows: the simulator's prediction
};
// Prints the human-readable table (stdout).
void print_table(const Job& job, const std::vector<Row>& rows, const std::string& title);
// Prints the --json document (stdout). `goodput`: the measured TCP goodput of the links
// as a fraction of the nominal rate (run --netns), put into the config when given.
void print_json(const Job& job, const std::vector<Row>& rows, std::optional<double> goodput = std::nullopt);

int run_models(const std::string& device, bool json);
int run_simulate(const SimFlags& f);

}  // namespace qs::cli
