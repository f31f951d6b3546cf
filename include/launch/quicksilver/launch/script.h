// `quicksilver run --script`: runs a user's training script (PyTorch with quicksilver.torch)
// as N worker processes on this machine, each with the environment torchrun gives its
// workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and
// OMP_NUM_THREADS=1 unless set), so that the same script runs under either launcher.
// quicksilver.torch hosts one parameter server in each process (N = M) unless the script names
// separate servers.
//
// Exit is clean: when a worker fails, the others are expected to fail on their own within
// moments (their peers' sockets close); whoever is still running after `grace` is
// terminated (SIGTERM, then SIGKILL), and so is everyone at `timeout`. Children never
// outlive the launcher (PR_SET_PDEATHSIG). With catch_signals, SIGINT, SIGTERM and SIGHUP
// end the run the same way (the workers terminated, the namespaces removed) instead of
// the process.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/bandwidth_schedule.h"
#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/runtime/netns.h"

namespace qs {

struct ScriptLaunchOptions {
  // Required: a Python script (*.py, run by `python`) or an executable (a LibTorch program).
  std::string script;
  // The interpreter of a *.py script (choose_python, quicksilver/launch/python.h); required
  // for one, unused otherwise.
  std::string python;
  std::vector<std::string> args;  // the script's own arguments
  int workers = 2;                // N, in 1..runtime::kMaxWorkers
  // Prepended to the children's PYTHONPATH (where the quicksilver package is); may be empty.
  std::string python_path;
  // More environment for every process (`run --script --policy P`: QS_POLICY, QS_KNOBS,
  // ..., read by quicksilver.torch's DistributedOptimizer).
  std::vector<std::pair<std::string, std::string>> env;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this machine
  // One network namespace per worker (root), joined by tc-shaped links at `bandwidth` each
  // way (runtime/netns.h); MASTER_ADDR is worker 0's address and GLOO_SOCKET_IFNAME each
  // worker's interface, so torch.distributed (and DDP) use the shaped links too.
  bool netns = false;
  Rate bandwidth = Rate::gbps(1);
  std::string congestion = "cubic";  // allowed inside the namespaces (NetnsOptions)
  // netns: how the links queue, retransmit and acknowledge (the CLI gives rto_min
  // kDefaultRtoMin unless told otherwise); without netns, only the defaults.
  runtime::LinkShaping shaping;
  // netns: the links' rate over time from the processes' start (`--bandwidth-trace`: a
  // trace file, a random spec or a rate; its first rate replaces `bandwidth`).
  std::optional<BandwidthSchedule> schedule;
  TimeNs timeout = 0;             // 0: none
  TimeNs grace = 15 * kNsPerSec;  // after the first failure (see above)
  // SIGINT/SIGTERM/SIGHUP stop the run (above); the previous handlers come back at the end.
  bool catch_signals = true;
  // Progress messages ("worker 1 exited with status 1", "terminating ..."). May be empty.
  std::function<void(std::string_view)> log;
};

struct ScriptRunResult {
  std::vector<int> exit_codes;  // by rank: the exit status, or 128 + signal
  int first_failed = -1;        // the rank that failed first (-1: none)
  bool timed_out = false;
  bool interrupted = false;  // a signal stopped the run (catch_signals)
  bool ok() const { return first_failed < 0 && !timed_out && !interrupted; }
};

// Whether run_script runs `script` under ScriptLaunchOptions::python (a *.py file) rather
// than as a program.
bool runs_under_python(std::string_view script);

// Errors (nothing ran): no script, a *.py script without an interpreter, a bad worker
// count, fork failures.
Result<ScriptRunResult> run_script(const ScriptLaunchOptions& options);

}  // namespace qs
