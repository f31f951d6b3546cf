// PolicyOptions: every scheduler knob in one options struct, each with the default its
// paper or reference system uses (STYLE.md practice 6). The CLI fills it from flags; tests
// shrink sizes to reach multi-packet and multi-partition paths on tiny profiles.
#pragma once

#include <cstdint>

#include "quicksilver/core/units.h"

namespace qs {

struct PolicyOptions {
  // mercury / mercury-nopreempt: transport packet payload (Mercury IV-C; paper uses ~16-32 KB).
  Bytes packet_size = 32 * kKiB;
  // bytescheduler: partition size and credit window. (4 MB, 20 MB) is the optimum the
  // Mercury paper (Fig. 4) found for VGG-16 at 10 Gbps; the tuner searches both.
  Bytes partition_size = 4'000'000;
  Bytes credit_size = 20'000'000;
  // p3: slice size. P3 (Jayarajan et al., SysML'19) slices at 50,000 parameters (fp32).
  Bytes slice_size = 200'000;
  // User-level scheduling startup time paid by every partition / slice / block that a
  // user-level scheduler hands to the communication library (Mercury III-A: engine core
  // scheduling, library pre-processing; "less than 1 ms"). The message-level
  // acknowledgement delay is not part of it: the engines model acknowledgements as
  // messages that take the link latency.
  TimeNs startup_time = 200 * kNsPerUs;
  // Parameter servers: tensors of at least this many bytes are split over all servers.
  Bytes split_threshold = 1 * kMiB;

  // ---- all-reduce policies ----
  // ddp: PyTorch DistributedDataParallel bucket_cap_mb = 25 (MiB) and the smaller first
  // bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB).
  Bytes ddp_bucket_size = 25 * kMiB;
  Bytes ddp_first_bucket_size = 1 * kMiB;
  // deft: link speed ratio mu (DeFT III-C) and the Preserver's epsilon (IV-C).
  double deft_mu = 1.65;
  double deft_epsilon = 0.01;
  int deft_max_retries = 10;
  // Random seed for policies that draw (DeFT's Preserver loss model).
  std::uint64_t seed = 1;
};

}  // namespace qs
