// `quicksilver advise`: which policy, with which knobs, for this model on this network
// (issue 30). Every policy of the job's architecture is simulated with its byte-size knobs
// tuned by a coarse pattern search, and ranked by predicted iteration time; the pick's
// sensitivity to the network is swept (bandwidth 0.1x to 10x, worker count halved and
// doubled, latency 100us and 1ms, or a tenth and ten times the job's), with the top three
// candidates' tuned knobs and one measured iteration each. A PS job of more than 4 workers
// is searched on a 4-worker proxy of itself, and one of more than 32 swept on a 16-worker
// one (advisor.cc, proxy_cluster); every printed time is the job's own simulation.
// Deterministic: the same job gives the same advice.
//
// Candidates: every communicating policy of job.cluster.architecture (`oracle`, the
// compute-only bound, is reported as the bound, never ranked); a policy that delays
// updates (DeFT) only with allow_stale, since its merged updates change the optimisation.
// The search starts from the policy's default knobs (job.policy_options) and keeps a
// point only when it is faster, so an entry is never predicted slower than the same
// policy with the default knobs under the same simulation (job.sim): the first entry is
// never slower than the best that `simulate --policy all` finds.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/engine/job.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/policy/registry.h"

namespace qs {

struct AdviseOptions {
  bool allow_stale = false;  // rank the policies that delay updates (DeFT) too
  bool sensitivity = true;   // sweep the pick against bandwidth and worker count
  int threads = 2;           // simulations run at once (>= 1)
  // A search point or a sweep candidate whose only question is whether it beats the best
  // so far is simulated only until it is known not to (SimOptions::stop_at_least). Exact:
  // the same advice either way (tested); false simulates every run whole.
  bool stop_losers = true;
  // Called as the search goes: "bytescheduler: 7 simulations". May be empty.
  std::function<void(std::string_view)> progress;
};

struct AdvisedPolicy {
  std::string policy;
  PolicyOptions options;  // the job's knobs with the tuned ones set
  // The tuned knobs as their flags spell them ("partition_size" -> "4MiB"); empty when
  // the policy has none to tune.
  std::vector<std::pair<std::string, std::string>> knobs;
  TimeNs iteration_time = 0;  // predicted, job.sim's statistic, with the tuned knobs
  TimeNs default_time = 0;    // the same with the job's knobs
  int simulations = 0;        // distinct points simulated for it
  int stopped = 0;            // of those, stopped once they could no longer win
};

// One line of the sensitivity sweep: at `value` of what was varied, which candidate is
// predicted fastest and how fast.
struct SensitivityPoint {
  std::string varied;  // "bandwidth", "workers", "latency"
  double factor = 1;   // of the job's value (latency from 0: 0)
  std::string value;   // "1Gbps", "32"
  std::string best;    // the policy, as ranked at that point
  TimeNs iteration_time = 0;
};

struct Advice {
  std::vector<AdvisedPolicy> ranking;  // fastest first; ties by policy rank
  TimeNs bound = 0;                    // the oracle's iteration time (compute only)
  std::vector<SensitivityPoint> sweep;
  // The sweep in words: "mercury stays best from 1Gbps to 100Gbps; below, bytescheduler
  // (partition_size 4MiB, credit_size 16MiB)".
  std::vector<std::string> sensitivity;
  int simulations = 0;  // in all
  int stopped = 0;      // of those, stopped once they could no longer win (stop_losers)
  // Policies left out, with why ("deft: delays updates (give --allow-stale)", a policy
  // whose default knobs this job refuses).
  std::vector<std::string> notes;
};

// The knobs advise() tunes for `spec`: its byte sizes that scale with the tensors
// (partitions, credits, slices, buckets), not the placement's split threshold; none for
// the policies that plan their own (US-Byte, DeFT).
std::vector<const Knob*> tuned_knobs(const PolicySpec& spec);

// Errors: an invalid job (the simulator's), no candidate (every policy refused), a
// simulation error of the default point of a policy (named).
Result<Advice> advise(const Job& job, const AdviseOptions& options);

}  // namespace qs
