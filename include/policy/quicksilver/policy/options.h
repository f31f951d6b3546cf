// PolicyOptions: every scheduler knob, as the aggregate of one options struct per policy
// (or per architecture, for the knobs all policies of it share), each field with the
// default its paper or reference system uses (STYLE.md practice 6). Tests shrink sizes to
// reach multi-packet and multi-partition paths on tiny profiles.
//
// Each struct's knob table (flag, unit, help, whether it scales on the emulated cluster,
// whether it is hashed into the runtime's hello) is declared once, beside the policy that
// reads it, and registered in include/policy/quicksilver/policy/registry.h; the CLI flags, the
// launcher's job messages and scaling, the configuration hash and the docs' knob tables
// are generated from it. A field here without a table entry is a bug (a registry test
// checks every field's default against its entry).
#pragma once

#include <cstdint>

#include "quicksilver/core/units.h"

namespace qs {

// Parameter-server placement, shared by every PS policy (table: src/policy/layout.cc).
struct PlacementOptions {
  // Tensors of at least this many bytes are split over all servers.
  Bytes split_threshold = 1 * kMiB;

  friend bool operator==(const PlacementOptions&, const PlacementOptions&) = default;
};

// User-level schedulers (p3, bytescheduler, usbyte, prophet; table: src/policy/ps_policies.cc).
struct StartupOptions {
  // Scheduling startup time paid by every partition / slice / block that a user-level
  // scheduler hands to the communication library (Mercury III-A: engine core scheduling,
  // library pre-processing; "less than 1 ms"). The message-level acknowledgement delay is
  // not part of it: the engines model acknowledgements as messages that take the latency.
  TimeNs startup_time = 200 * kNsPerUs;

  friend bool operator==(const StartupOptions&, const StartupOptions&) = default;
};

// mercury / mercury-nopreempt (table: src/policy/ps_policies.cc).
struct MercuryOptions {
  // Transport packet payload (Mercury IV-C; the paper uses ~16-32 KB).
  Bytes packet_size = 32 * kKiB;
  // mercury: the servers send summed packets in the order their sums completed (the
  // paper's plain Ready Queue, IV-C) instead of by priority (our default, a deviation).
  bool mercury_server_fifo = false;

  friend bool operator==(const MercuryOptions&, const MercuryOptions&) = default;
};

// bytescheduler (both architectures) and usbyte (table: src/policy/ps_policies.cc).
struct ByteSchedulerOptions {
  // Partition size and credit window. (4 MB, 20 MB) is the optimum the Mercury paper
  // (Fig. 4) found for VGG-16 at 10 Gbps; the tuner searches both.
  Bytes partition_size = 4'000'000;
  Bytes credit_size = 20'000'000;
  // All-reduce form only: the tensor-fusion threshold of the collective library below
  // ByteScheduler (Horovod's HOROVOD_FUSION_THRESHOLD default, 64 MiB): partitions handed
  // over since the library's last cycle are fused into collectives of at most this size.
  // 1 byte: no fusion (every partition its own collective).
  Bytes fusion_size = 64 * kMiB;

  friend bool operator==(const ByteSchedulerOptions&, const ByteSchedulerOptions&) = default;
};

// p3 (table: src/policy/ps_policies.cc).
struct P3Options {
  // Slice size. P3 (Jayarajan et al., SysML'19) slices at 50,000 parameters (fp32).
  Bytes slice_size = 200'000;

  friend bool operator==(const P3Options&, const P3Options&) = default;
};

// prophet (Prophet, ICPP'21, Algorithm 1; docs/policies-ps.md; table: src/policy/prophet.cc).
struct ProphetOptions {
  // The unit Prophet's block assembler works on. Prophet runs inside BytePS, which cuts
  // every tensor into partitions of BYTEPS_PARTITION_BYTES (default 4,096,000 B); a block
  // is a run of whole partitions (paper 2.3: "only two partitions of gradient 1 can be
  // transmitted before gradient 0 is generated"). Every worker cuts the same partitions,
  // whatever its timing; blocks only decide when partitions leave.
  Bytes prophet_partition_size = 4'096'000;
  // How Algorithm 1 line 7 admits a partition into a block. false (default): only if it
  // ends within the window, T_used + E <= A (Constraint 11, and Fig. 5's "only two
  // partitions"). true: while the residual window is positive, T_used < A (section
  // 4.1's prose "only when the residual time A - T_used is positive"): the link never
  // idles for want of a window that fits a whole partition, at the price of the last
  // partition of a block running into the next step by less than its own E.
  bool prophet_allow_overrun = false;

  friend bool operator==(const ProphetOptions&, const ProphetOptions&) = default;
};

// ddp (table: src/policy/allreduce_policies.cc): PyTorch DistributedDataParallel
// bucket_cap_mb = 25 (MiB) and the smaller first bucket
// (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB).
struct DdpOptions {
  Bytes ddp_bucket_size = 25 * kMiB;
  Bytes ddp_first_bucket_size = 1 * kMiB;

  friend bool operator==(const DdpOptions&, const DdpOptions&) = default;
};

// deft (table: src/policy/deft.cc).
struct DeftOptions {
  // Link speed ratio mu (DeFT III-C) and the Preserver's epsilon (IV-C). deft_mu = 0
  // means "measured": the ratio of the two links' modelled collective times.
  double deft_mu = 1.65;
  double deft_epsilon = 0.01;
  int deft_max_retries = 10;
  // Initial partition size (III-D, "default to 6,500,000" parameters = 26 MB fp32),
  // before US-Byte's re-partition and the knapsack-capacity constraint.
  Bytes deft_partition_size = 26'000'000;
  // Knapsacks with at most this many items are also solved exactly (and the exact answer
  // is used); the greedy's losses are reported. 0 = greedy only (the paper).
  int deft_exact_max_items = 12;
  // Preserver (IV-C3): each retry multiplies every knapsack capacity by (1 + step).
  double deft_capacity_step = 0.1;
  // Every knapsack capacity starts multiplied by this (the Preserver's raises multiply it
  // further): below 1 the Solver delays and merges more, trading update frequency for
  // less exposed communication.
  double deft_capacity_scale = 1.0;
  // Preserver: iterations of the dry run that yields the batch-size sequence.
  int deft_horizon = 16;
  // Preserver loss model (IV-C2, Yin et al.'s random walk with rebound): the start state
  // s_A, the objective S*, the learning rate eta, and the per-sample gradient mean mu and
  // deviation sigma. Defaults reproduce Table V's setting (s_A ~ 0.21, S* = 0, eta = 0.01)
  // with mu and sigma chosen so that Table V's sequence (B, 2B, B over N = 4) gives its
  // ratio, ~0.993 (docs/policies-allreduce.md).
  double deft_loss_s0 = 0.2103;
  double deft_loss_target = 0.0;
  double deft_lr = 0.01;
  double deft_loss_mu = 0.144;
  double deft_loss_sigma = 40.0;
  // The Preserver judges the schedule executed, every deft_horizon iterations, with the
  // loss, gradient and learning rate that real training measured (on_feedback), instead of
  // certifying a dry run with the constants above before training (the paper's feedback
  // loop, IV-C and Fig. 7). Set by the PyTorch integration; emulated compute has no loss.
  bool deft_loss_feedback = false;

  friend bool operator==(const DeftOptions&, const DeftOptions&) = default;
};

// The aggregate every engine hands to a policy's factory: a policy reads its own struct's
// fields (and the shared ones it names in its registration).
struct PolicyOptions : PlacementOptions,
                       StartupOptions,
                       MercuryOptions,
                       ByteSchedulerOptions,
                       P3Options,
                       ProphetOptions,
                       DdpOptions,
                       DeftOptions {
  // Random seed for a policy that draws. None does today: DeFT's Preserver computes the
  // loss model's expectation in closed form and draws nothing. Not a knob: the job's
  // --seed sets it.
  std::uint64_t seed = 1;

  // Every field equal (the knobs and the seed): what a job message carries round trips.
  friend bool operator==(const PolicyOptions&, const PolicyOptions&) = default;
};

}  // namespace qs
