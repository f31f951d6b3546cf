// The all-reduce runtime's start-up, over any engine: the workers' agreement on the
// settings every collective depends on, and each link's cost fit T(M) = a + b*M
// (MG-WFBP section II-D), the same on every worker.
#pragma once

#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/communicator.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

// Least squares of time (ns) on size (bytes).
AllReduceCost fit_line(const std::vector<double>& sizes, const std::vector<double>& times);

// On the control channel: the slowest worker's compute factor (every collective waits
// for it), and whether the workers agree on checksums and on the wire's dtype. A worker
// without checksums would take a peer's checksum messages for data, so this one
// collective runs without, and a disagreement fails every worker naming the setting (as
// the PS path's hello does). Errors start with `who`.
Result<double> agree_at_start(Communicator& comm, const std::string& who, double compute_factor,
                              bool checksums, transport::WireDType wire);

struct CalibrationSettings {
  Bytes model_bytes = 0;        // the model's gradients
  double bytes_per_second = 0;  // the nominal rate (0: unknown)
  int repeats = 5;              // each size timed this often (the median counts)
  bool checksums = true;
  transport::WireDType wire = transport::WireDType::kFloat32;
};

// Times `link`'s all-reduce over a size sweep (as the job's buckets will run: the same
// compression) and fits the line; every worker returns the same fit (the mean of the
// workers' medians). `sweep`: the times, for the report.
Result<AllReduceCost> calibrate_link(Communicator& comm, int link, const CalibrationSettings& s,
                                     const std::string& who, std::string* sweep);

}  // namespace qs::runtime
