// Private to the CLI: `quicksilver advise`, every policy of the job's architecture ranked
// with its knobs tuned, by simulation (include/sim/quicksilver/sim/advisor.h).
#pragma once

#include <CLI/CLI.hpp>

#include "commands.h"

namespace qs::cli {

struct AdviseFlags {
  SimFlags sim;  // the job and the network, as `simulate` reads them (no --policy)
  bool allow_stale = false;
  bool no_sensitivity = false;
  const CLI::App* app = nullptr;
};

void add_advise_flags(CLI::App* app, AdviseFlags* f);
// Prints the ranking (--json: one JSON object). Returns the exit code (2: bad input).
int run_advise(const AdviseFlags& f);

}  // namespace qs::cli
