// Knob tuning by simulation: the partition size and credit size of `bytescheduler`, and
// the slice size of `p3`, chosen by running the simulator itself on the job.
//
// ByteScheduler (Peng et al., SOSP'19, section 4) tunes (partition, credit) online with
// Bayesian optimisation, because every probe there is a real training iteration: noisy
// and expensive (Prophet 2.2 measures the cost: the training rate fluctuates while the
// tuner explores). Here a probe is one deterministic simulation that costs milliseconds
// and returns the same time every time, so there is no noise to model and a plain search
// is both cheaper to trust and easy to check: a log-spaced grid over both knobs (the
// iteration time is piecewise constant in them, with steps where the number of
// partitions per tensor changes, so a gradient-free search is needed anyway), then a
// local pattern search from the best few grid points with a shrinking multiplicative step.
// The defaults given in `base` are always evaluated too, so the result is never worse
// than them.
#pragma once

#include <functional>
#include <string>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/options.h"
#include "quicksilver/sim/simulator.h"

namespace qs {

struct TuneOptions {
  // "bytescheduler" (partition and credit) or "p3" (slice size only).
  std::string policy = "bytescheduler";
  // Partition (or slice) sizes searched: log-spaced from min_size to max_size.
  Bytes min_size = 64 * kKiB;
  Bytes max_size = 64 * kMiB;
  int grid_points = 11;  // partition sizes on the grid (>= 2): a factor 2 apart by default
  // Credits searched at each grid partition size: partition * 2^k, k = 0..credit_doublings
  // (credit = partition is stop-and-wait, Mercury III-A).
  int credit_doublings = 5;
  // Pattern-search rounds after the grid; each halves the (log) step. 0 = grid only.
  int refine_rounds = 4;
  // Refinement starts from this many of the best points found so far (multi-start).
  int starts = 3;
  // Called after each distinct point simulated, with the count so far (a progress line).
  std::function<void(int simulations)> on_simulation;
};

struct TuneResult {
  PolicyOptions options;      // `base` with the best knobs set
  Bytes partition_size = 0;   // bytescheduler: partition; p3: slice
  Bytes credit_size = 0;      // bytescheduler only (0 for p3)
  TimeNs iteration_time = 0;  // steady-state median of the best
  TimeNs default_time = 0;    // the same for `base`'s knobs
  int simulations = 0;        // distinct (partition, credit) points simulated
};

// Searches the knobs of options.policy for `profile` on `cluster`, simulating with `sim`
// (its iteration count sets the cost of each probe). Ties in iteration time go to the
// smaller partition, then the smaller credit, so the result is unique. Errors: an
// unsupported policy, an empty or inverted size range, or a simulation error.
Result<TuneResult> tune(const Profile& profile, const PolicyOptions& base,
                        const ClusterConfig& cluster, const SimOptions& sim,
                        const TuneOptions& options = {});

}  // namespace qs
