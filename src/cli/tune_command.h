// Private to the CLI: `quicksilver tune`, the simulation-driven search of bytescheduler's
// partition and credit sizes (or p3's slice size), see include/sim/quicksilver/sim/tuner.h.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "commands.h"

namespace qs::cli {

struct TuneFlags {
  SimFlags sim;  // the job, as `simulate` reads it (--policy is ignored)
  std::string tune_policy = "bytescheduler";
  std::string min_size = "64KiB";
  std::string max_size = "64MiB";
  int grid_points = 11;
  int credit_doublings = 5;
  int refine_rounds = 4;
  int starts = 3;
};

void add_tune_flags(CLI::App* app, TuneFlags* f);
// Prints the search result, then the simulated table: the policy with its default knobs,
// tuned, and mercury. Returns the process exit code (2 on a flag or simulation error).
int run_tune(const TuneFlags& f);

}  // namespace qs::cli
