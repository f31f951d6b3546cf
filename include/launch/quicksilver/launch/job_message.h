// The job a child process of a launch runs (`quicksilver coordinator`, `server`,
// `worker`), serialised once: one versioned JSON document per child, which the launcher
// writes into its run's directory and the child reads (`quicksilver worker --job FILE`).
// The same struct is what those commands' flags fill when a person starts a node by hand,
// so that both ways reach the node's options through one mapping (job_options here, the
// role's own part in the CLI): a setting cannot be passed one way and lost the other.
//
// One codec both ways: encode() writes every field, decode() reads what encode() writes.
// The launcher and its children are the same executable (/proc/self/exe), so a message
// of another version is refused rather than read as well as possible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/runtime/settings.h"
#include "quicksilver/transport/wire.h"

namespace qs {

// The format's version, the message's "version" field. Bumped whenever a field changes
// meaning, appears or goes.
inline constexpr int kJobMessageVersion = 1;

// Which command the message is for.
enum class ChildRole { kCoordinator, kServer, kWorker };
const char* child_role_name(ChildRole r);  // "coordinator", "server", "worker"

// Each field's default is its command-line flag's (docs/cli.md), so that a message and a
// command line that leave a setting out mean the same. Field comments name the flag.
struct JobMessage {
  ChildRole role = ChildRole::kWorker;

  // ---- The job: the same for every child of one run.
  // --model: a profile JSON file (the launcher's: the scaled profile of the run) or a
  // built-in model, with --device and --batch-size (0: the model's own).
  std::string model = "vgg16";
  std::string device = "rtx3090";
  int batch_size = 0;
  std::string policy = "all";  // --policy: exactly one, for a server or worker
  // Every registered knob (quicksilver/policy/registry.h), encoded exactly (Knob::format).
  // knobs.seed is `seed` (decode sets it; it is not a knob).
  PolicyOptions knobs;
  Architecture architecture = Architecture::kPs;  // --architecture
  int workers = 4;                                // --workers
  int servers = 4;                                // --servers
  int iterations = 5;                             // --iterations, warm-up included
  int warmup = 1;                                 // --warmup
  Rate bandwidth = Rate::gbps(10);                // --bandwidth: the nominal NIC rate
  std::uint64_t seed = 1;                         // --seed
  // --allreduce: gloo's algorithm when gloo_algorithm is empty (ring or rhd).
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::kRing;
  std::string gloo_algorithm;  // --gloo-algorithm (all-reduce workers)
  double second_link = 0;      // --second-link: DeFT's second link's slowdown (0: none)
  transport::WireDType compression = transport::WireDType::kFloat32;  // --compression
  // --congestion, --commit-window, --connect-timeout, --peer-timeout, --no-checksum
  // (runtime/settings.h: each under its table name).
  runtime::RuntimeSettings settings;
  // --secret-file (empty: the CLI reads $QUICKSILVER_SECRET_FILE), or --insecure.
  std::string secret_file;
  bool insecure = false;

  // ---- This child.
  int id = 0;                          // --server-id, --worker-id (the all-reduce rank)
  std::string listen = "127.0.0.1:0";  // --listen HOST:PORT (server, coordinator)
  std::string coordinator;             // --coordinator HOST:PORT (server, worker)
  std::vector<std::string> connect;    // --connect: server s's HOST:PORT at [s] (PS worker)
  std::vector<std::string> links;      // --link: this host's address per link (all-reduce)
  Rate pacing_rate{0};                 // --pacing-rate per connection (0: none)
  Rate nic_rate{0};                    // --nic-rate (worker; 0: unknown)
  double slowdown = 1;                 // --slowdown: the worker's compute slowdown
  int die_at_iteration = -1;           // --die-at-iteration (testing; -1: never)
  bool announce_start = false;         // --announce-start: print "training starts"
  bool verify = true;                  // not --no-verify
  std::string gloo_via;                // --gloo-via RANK=HOST:PORT (testing)
  std::string trace;                   // --trace: the worker's Chrome trace file
  std::string trace_detail = "auto";   // --trace-detail
  bool json = false;                   // --json: the report as one JSON line
  TimeNs timeout = 300 * kNsPerSec;    // --timeout (coordinator)

  friend bool operator==(const JobMessage&, const JobMessage&) = default;
};

// The job's part of a message, the same for every child of a run: `policy` with the
// job's knobs, the cluster's shape, iterations, warm-up, bandwidth, seed and compression,
// and for an all-reduce job its algorithm and DeFT's second link. From the Job that
// `simulate` checks (the CLI's make_job), so the launcher and the role commands fill it
// one way; the model, the runtime's settings and the child's own fields are the caller's.
Result<JobMessage> job_part(const Job& job, const std::string& policy);

// The message as one JSON document (`{"version": 1, "role": ..., ...}`), every field
// written. Times are integer nanoseconds ("..._ns"), rates integer bit/s ("..._bps"),
// the knobs an object of their exact texts.
std::string encode(const JobMessage& m);
// What encode() wrote. Errors (invalid_argument, the message's name for what is wrong):
// not JSON, not an object, no "version" or another one (the launcher and its children
// must be the same build), a field missing its type or its range, naming the field
// ("job message: field 'peer_timeout_ns': ..."), an unknown field, an unknown knob or a
// knob's value its flag refuses. A field left out keeps its default (a message written by
// hand may be short).
Result<JobMessage> decode(std::string_view text);

// encode() into `path` (created or replaced). Errors name the file.
Status write_job_message(const JobMessage& m, const std::string& path);
// decode() of the file at `path` (at most 1 MiB). Errors name the file.
Result<JobMessage> read_job_message(const std::string& path);

// The runtime's job of a server or worker: the profile loaded (`model`, `device`,
// `batch_size`), the policy and its knobs, the transport's settings; checked as every node
// checks its job before it opens a socket (runtime::validate_job, or
// validate_collective_job for --architecture allreduce). Errors name the flag.
Result<runtime::JobOptions> job_options(const JobMessage& m);

}  // namespace qs
