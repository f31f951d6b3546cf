// Private to the CLI: the runtime roles (`server`, `worker`) and the local launcher (`run`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "commands.h"

namespace qs::cli {

// The runtime's settings as flags, one per row of runtime/settings.h's table
// (add_settings_flags; settings_from_flags reads them back).
struct SettingsFlags {
  std::vector<std::string> texts;  // by table row; empty: not given (the default)
};

// The flags of `server` and `worker`, which fill the same JobMessage a launcher writes
// (quicksilver/launch/job_message.h): one mapping from there to the node's options.
struct RoleFlags {
  // --job FILE: the whole job (a JobMessage), refused beside any other flag.
  std::string job_file;
  // The command's option table (add_server_flags, add_worker_flags): which flags were given.
  const CLI::App* app = nullptr;
  SimFlags sim;                        // model, policy (exactly one), workers, servers, knobs
  int id = 0;                          // --server-id / --worker-id
  std::string listen = "127.0.0.1:0";  // server: HOST:PORT (port 0 = ephemeral)
  std::string servers;                 // worker: HOST:PORT,HOST:PORT,... (server s at position s)
  std::string coordinator;      // HOST:PORT of a `quicksilver coordinator` (instead of servers)
  double compute_factor = 1.0;  // worker: compute slowdown
  SettingsFlags settings;       // --congestion, --commit-window, the timeouts, --no-checksum
  std::string nic_rate;         // worker: for the utilisation figure
  std::string pacing_rate;      // SO_MAX_PACING_RATE per connection
  int die_at_iteration = -1;    // worker: testing aid, exit abruptly at this iteration
  bool announce_start =
      false;  // worker: print "training starts" when training begins (the launcher's cue)
  std::string gloo_via;  // all-reduce worker: testing aid, RANK=HOST:PORT (CollectiveOptions::via)
  bool no_verify = false;  // worker: skip the exact check of every sum (benchmarks)
  // All-reduce workers: this host's address on each link (one per link, in order), and
  // gloo's algorithm (default: from --allreduce).
  std::vector<std::string> links;
  std::string gloo_algorithm;
  std::string secret_file;  // the cluster secret (else $QUICKSILVER_SECRET_FILE)
  bool insecure = false;    // no secret, no authentication (a trusted network only)
};

struct RunFlags {
  SimFlags sim;
  bool netns = false;
  double scale = 0;        // 0 = automatic (LaunchOptions::scale)
  SettingsFlags settings;  // every child's runtime settings
  // --netns: every route's minimum retransmission timeout; empty: 5ms with --netns
  std::string rto_min;
  std::string switch_buffer = "2ms";  // --netns: each switch port's buffer
  std::string host_queue = "20ms";    // --netns: each host's own queue
  std::string host_gso = "48KiB";     // --netns: each host's largest TCP packet (GSO)
  bool quickack = false;              // --netns: every route acknowledges at once
  std::string timeout = "300s";
  // --timeout's option (add_run_flags): a --script run is bounded only when it was given.
  const CLI::Option* timeout_option = nullptr;
  bool keep_going = false;
  int kill_worker = -1;        // testing: this worker dies abruptly...
  int kill_at_iteration = 1;   // ...at this iteration
  std::string gloo_algorithm;  // --architecture allreduce: gloo's algorithm
  // --script: a training script run as --workers processes (torchrun's environment).
  std::string script;
  // The command's option table (add_run_flags): which flags were given (a --script run
  // refuses those that do not apply to it).
  const CLI::App* app = nullptr;
  std::vector<std::string> script_args;  // everything after the script's path
  std::string python;  // --script *.py: the interpreter; empty: choose_python's rule
  // --policy auto (without --script): iterations between decisions, and DeFT a candidate.
  int replan_every = 200;
  bool allow_stale = false;
};

struct CoordinatorFlags {
  std::string job_file;           // --job FILE, as RoleFlags::job_file
  const CLI::App* app = nullptr;  // add_coordinator_flags's
  // Loopback unless told otherwise: listening on every interface is a choice to make
  // explicitly (docs/reliability.md).
  std::string architecture = "ps";  // allreduce: serve the gloo rendezvous store
  std::string listen = "127.0.0.1:7000";
  int workers = 4;
  int servers = 4;
  std::string timeout = "300s";
  std::string secret_file;
  bool insecure = false;
};

void add_coordinator_flags(CLI::App* app, CoordinatorFlags* f);
int run_coordinator(const CoordinatorFlags& f);
void add_server_flags(CLI::App* app, RoleFlags* f);
void add_worker_flags(CLI::App* app, RoleFlags* f);
void add_run_flags(CLI::App* app, RunFlags* f);
int run_server_role(const RoleFlags& f);
int run_worker_role(const RoleFlags& f);
int run_cluster(const RunFlags& f, const std::string& self_exe);
// `quicksilver cleanup [--dry-run]`: what launchers killed outright left behind.
int run_cleanup(bool dry_run);
// `quicksilver profile [--python PATH] ARGS`: runs `PYTHON -m quicksilver.profile ARGS` with
// the package beside this executable on PYTHONPATH (replaces this process). PYTHON is
// `python` when not empty, else choose_python's (quicksilver/launch/python.h).
int run_profile(const std::vector<std::string>& args, const std::string& python,
                const std::string& self_exe);

}  // namespace qs::cli
