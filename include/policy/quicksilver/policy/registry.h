// The policy registry: every scheduling policy's name, architecture, factory and knobs, in
// one table that everything else is generated from: the CLI's flags and --help, the
// arguments the launcher passes to its child processes, the launcher's scaling of byte
// sizes, the runtime's configuration hash, and the knob tables in docs/ (`quicksilver
// policies --markdown`).
//
// Built-in policies register from their own source files (one line each in
// src/policy/registry.cc); a policy outside the library (a test, an experiment) registers
// itself with register_policy() before the first simulation or run. The registry is built
// once, on first use, and only grows afterwards: lookups never see an entry change.
// Thread safety: every function here may be called from any thread; register_policy()
// while another thread simulates is allowed but pointless (register first).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/policy/ps_policy.h"

namespace qs {

enum class Architecture { kPs, kAllReduce };

enum class KnobType { kBytes, kTime, kInt, kDouble, kBool };

// One knob: a field of PolicyOptions (in fact of one policy's own options struct) and how
// it is spelt, documented, validated, scaled and hashed.
struct Knob {
  std::string name;  // the field's name, e.g. "packet_size"
  std::string flag;  // the command-line flag, e.g. "--packet-size"
  KnobType type = KnobType::kBytes;
  std::string help;  // one line, without the default (generated)
  // A byte size that the launcher scales with the tensor sizes when it scales an emulated
  // cluster down (partitions, slices, buckets: their counts stay the paper's). Mercury's
  // packet is a transport parameter and does not scale.
  bool scales = false;
  // Part of the runtime's configuration hash: nodes whose values differ refuse each other.
  bool hashed = true;
  // A byte size that cuts the gradients into units (packets, partitions, slices): an
  // iteration has about (model bytes / value) of them, which check_unit_budget bounds.
  bool cuts = false;
  // Where the value lives: a PolicyOptions member of the knob's type (kBytes and kTime:
  // std::int64_t; kInt: int; kDouble: double; kBool: bool).
  std::variant<std::int64_t PolicyOptions::*, int PolicyOptions::*, double PolicyOptions::*,
               bool PolicyOptions::*>
      field;
  // Validation beyond parsing: accepts(value) false -> "<flag> <requirement>". Null: any
  // value the parser takes (sizes: > 0 always; times: >= 0 always).
  bool (*accepts)(double) = nullptr;
  const char* requirement = "";

  // The unit shown in docs: "bytes", "time", "integer", "number", "flag".
  std::string_view unit() const;
  // The value as an exact command-line argument ("32768B", "200000ns", "12", "1.65";
  // bools "true"/"false"): parse() of it gives the same value back.
  std::string format(const PolicyOptions& o) const;
  // The value for people (help, docs): "32KiB", "200us", "1.65", "false".
  std::string display(const PolicyOptions& o) const;
  // Parses `text` (a command-line value) into `o`. Errors name the flag.
  Status parse(std::string_view text, PolicyOptions* o) const;
  // As parse(), with a bare number a byte knob's bytes: a value as Python gives it
  // (knobs={"packet_size": 4096}) and as a --script run passes it on to its session.
  Status parse_bare(std::string_view text, PolicyOptions* o) const;
  // Byte knobs only: reads / writes the value.
  std::int64_t get_int(const PolicyOptions& o) const;
  void set_int(PolicyOptions* o, std::int64_t v) const;
  bool get_bool(const PolicyOptions& o) const;
};

using PsFactory =
    std::function<Result<std::unique_ptr<PsPolicy>>(const PolicyOptions&, const PsContext&)>;
using AllReduceFactory = std::function<Result<std::unique_ptr<AllReducePolicy>>(
    const PolicyOptions&, const AllReduceContext&)>;

// One policy on one architecture (a name may exist on both: wfbp, bytescheduler, oracle).
struct PolicySpec {
  std::string name;
  Architecture architecture = Architecture::kPs;
  std::string summary;             // one line for the docs table
  std::vector<std::string> knobs;  // names of the knobs it reads (registered by whoever owns them)
  // Position in listings (`--policy all`, the docs); equal ranks keep registration order.
  int rank = 1000;
  // Its buckets may merge iterations (DeFT): a sum over several iterations updates the
  // parameters once, on the policy's schedule, and forward passes do not wait for every
  // sum of the last backward. A real model's integration applies updates accordingly.
  bool delays_updates = false;
  // Whether it moves gradients at all: false for the oracle, the compute-only bound (its
  // policy object's communicates() says the same). What the runtimes, the launcher and the
  // integrations ask instead of a name.
  bool communicates = true;
  PsFactory make_ps;                // set for kPs
  AllReduceFactory make_allreduce;  // set for kAllReduce
};

// The read side of the registry. Pointers it returns stay valid for the process.
class PolicyRegistry {
 public:
  // The entry for `name` on `architecture`; null when there is none.
  const PolicySpec* find(std::string_view name, Architecture architecture) const;
  // The knob named `name` (the field's name); null when there is none.
  const Knob* find_knob(std::string_view name) const;
  // Policies of one architecture by rank; all names (PS first, then all-reduce-only ones).
  std::vector<std::string> names(Architecture architecture) const;
  std::vector<std::string> all_names() const;
  bool is_known(std::string_view name) const;
  // Whether the policy `name` moves gradients (PolicySpec::communicates; false for a name
  // no architecture knows).
  bool communicates(std::string_view name) const;
  // Every knob, in registration order (the order of flags and docs rows).
  std::vector<const Knob*> knobs() const;
  // Policies (of any architecture) whose spec lists knob `name`, by rank.
  std::vector<std::string> policies_using(std::string_view knob) const;

  // Adds knobs first (each name once), then the policy (each (name, architecture) once;
  // its knobs must exist). Errors: a duplicate or a knob the spec lists but nobody added.
  Status add(std::vector<Knob> knobs, std::vector<PolicySpec> policies);

  PolicyRegistry();
  ~PolicyRegistry();
  PolicyRegistry(const PolicyRegistry&) = delete;
  PolicyRegistry& operator=(const PolicyRegistry&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The process's registry, built with the built-in policies on first use.
const PolicyRegistry& policy_registry();
// Registers a policy (and the knobs it owns) from outside the library. Typical use, at
// namespace scope in the policy's own file:
//   const bool kRegistered = qs::register_policy({spec}).is_ok();
Status register_policy(std::vector<PolicySpec> policies, std::vector<Knob> knobs = {});

// Units (packets, partitions, slices) per iteration are bounded before a simulation or a
// run starts: every unit is an event in the simulator and a frame in the runtime, so a
// 1-byte packet would run for hours and hold gigabytes. Per worker, and (PS, where every
// worker is simulated) over all workers. The simulator's cost is about 2 queue events and
// 32 bytes of queue per unit and worker (issue 14; docs/benchmarks.md "Simulator at
// scale"): VGG-16 with 32 KiB packets on 1024 workers and 1024 servers is 26.3 Mi units,
// one iteration in about 7 s and 650 MB on 2 cores; the bound, 32 Mi, about 1.3 times that.
// (Before issue 14 the bound was 4 Mi: 16 Mi took 28 s and 1.4 GB for two iterations.)
inline constexpr std::int64_t kMaxUnitsPerIteration = std::int64_t{1} << 20;  // 1,048,576
inline constexpr std::int64_t kMaxUnitsPerIterationAllWorkers = std::int64_t{1}
                                                                << 25;  // 33,554,432
// Checks `policy` (on `architecture`) with `options` on `profile` and `workers` against
// those bounds, counting the units of every knob the policy reads that `cuts`: on PS, per
// server's slice of each tensor as the placement makes them over `servers` (a unit never
// straddles two servers, so a tensor split over M servers is cut M times); on all-reduce,
// per tensor. Errors name the knob, its value, the count and the bound; an unknown policy
// is OK here (the caller reports it).
Status check_unit_budget(const Profile& profile, std::string_view policy, Architecture architecture,
                         const PolicyOptions& options, int workers, int servers = 1);

// The text the runtime's configuration hash is taken of: every hashed knob as
// "name=value" (Knob::format), in registration order, '|'-separated.
std::string hashed_knob_text(const PolicyOptions& o);
// The names of the hashed knobs, comma-separated (the hello mismatch message).
std::string hashed_knob_names();

// Markdown tables of the knobs read by the policies of `architecture` (flag, field,
// default, unit, scales, hashed, policies, meaning), as docs/policies-*.md embed them.
std::string knob_markdown(Architecture architecture);

}  // namespace qs
