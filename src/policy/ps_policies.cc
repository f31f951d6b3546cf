// The parameter-server policies of the Mercury paper's comparison (sections III and V-B),
// and their registration (knob tables included). Prophet lives in prophet.cc.
#include "ps_policies.h"

#include <algorithm>
#include <functional>

#include "credit_window.h"
#include "knob_table.h"
#include "quicksilver/core/check.h"

namespace qs {
namespace {

// Emits one unit per placement slice of every tensor of `layer`, in declaration order.
void push_slices(const PsContext& ctx, int layer, PushSink& out) {
  for (TensorId t = ctx.layout->first_tensor(layer); t < ctx.layout->end_tensor(layer); ++t) {
    for (const Slice& s : ctx.placement->slices(t)) out.push(PushUnit{s.chunk, s.server, t}, 0);
  }
}

// Cuts tensor `t` into units of at most `max_bytes` within its placement slices and
// interleaves them round-robin across the slices, so that one worker's units of a split
// tensor spread over all server links at once instead of visiting the servers one after
// another (with N workers in lockstep, the latter would queue all N at one server). The
// papers do not say; MXNet-based systems get the same effect from hashing partition keys
// over servers.
}  // namespace

void push_interleaved(const PsContext& ctx, TensorId t, Bytes max_bytes,
                      const std::function<void(const PushUnit&)>& out) {
  const auto& slices = ctx.placement->slices(t);
  const Bytes align = ctx.layout->tensor(t).element_size;
  std::vector<std::vector<Chunk>> per_slice;
  per_slice.reserve(slices.size());
  std::size_t most = 0;
  for (const Slice& s : slices) {
    per_slice.push_back(split_chunk(s.chunk, max_bytes, align));
    most = std::max(most, per_slice.back().size());
  }
  for (std::size_t k = 0; k < most; ++k) {
    for (std::size_t s = 0; s < slices.size(); ++s) {
      if (k < per_slice[s].size()) out(PushUnit{per_slice[s][k], slices[s].server, t});
    }
  }
}

namespace {

// oracle: compute only (Mercury eq. 9). The engine never waits for communication.
class Oracle final : public PsPolicy {
 public:
  std::string_view name() const override { return "oracle"; }
  bool communicates() const override { return false; }
  bool wants_acks() const override { return false; }
  QueueDiscipline discipline() const override { return QueueDiscipline::kFifo; }
  void on_gradient_ready(int, TimeNs, PushSink&) override {}
};

// wfbp: native PS, layer-wise FIFO (Mercury eq. 6-7). Each tensor is one message per
// server slice; the transport sends in the order gradients became ready and the server
// answers the pull once the whole slice is aggregated.
// tictac: the same messages, but the transport picks the most urgent tensor whenever the
// link frees (priority order at tensor granularity, no partitioning, no preemption of a
// message already started).
class TensorLevel final : public PsPolicy {
 public:
  TensorLevel(const PsContext& ctx, bool priority) : ctx_(ctx), priority_(priority) {}
  std::string_view name() const override { return priority_ ? "tictac" : "wfbp"; }
  QueueDiscipline discipline() const override {
    return priority_ ? QueueDiscipline::kPriority : QueueDiscipline::kFifo;
  }
  bool wants_acks() const override { return false; }
  void on_gradient_ready(int layer, TimeNs, PushSink& out) override {
    push_slices(ctx_, layer, out);
  }

 private:
  PsContext ctx_;
  bool priority_;
};

// mercury (Mercury IV-A key ideas 1-3, IV-C): every tensor goes to the transport as soon
// as its backward ends, cut into packets; the sending buffer holds one FIFO per priority
// (priority = tensor index, "the packets of the i-th tensor are stored at the i-th FIFO
// queue") and the sender always takes the most urgent packet, so preemption happens at
// packet granularity. The servers aggregate and return each packet on its own.
// mercury-nopreempt: the same packets sent FIFO (the paper's "W/O Preemption" breakdown).
//
// Packets of a tensor split over several servers are interleaved across its slices
// (push_interleaved).
//
// Deviation: the paper's PS keeps summed packets in a plain "Ready Queue" (IV-C, Fig. 8)
// that the PS Sender empties in order; by default our servers serve it by priority too
// (server_discipline() = discipline()). mercury_server_fifo = true serves it in the
// order the sums completed, as the paper describes (docs/reproductions.md, Fig. 12,
// measures the difference).
class Mercury final : public PsPolicy {
 public:
  Mercury(const PsContext& ctx, Bytes packet_size, bool preempt, bool server_fifo)
      : ctx_(ctx), packet_size_(packet_size), preempt_(preempt), server_fifo_(server_fifo) {}
  std::string_view name() const override { return preempt_ ? "mercury" : "mercury-nopreempt"; }
  QueueDiscipline discipline() const override {
    return preempt_ ? QueueDiscipline::kPriority : QueueDiscipline::kFifo;
  }
  QueueDiscipline server_discipline() const override {
    return server_fifo_ ? QueueDiscipline::kFifo : discipline();
  }
  bool wants_acks() const override { return false; }
  bool packet_level() const override { return true; }
  void on_gradient_ready(int layer, TimeNs, PushSink& out) override {
    for (TensorId t = ctx_.layout->first_tensor(layer); t < ctx_.layout->end_tensor(layer); ++t) {
      push_interleaved(ctx_, t, packet_size_, [&](const PushUnit& u) { out.push(u, 0); });
    }
  }

 private:
  PsContext ctx_;
  Bytes packet_size_;
  bool preempt_;
  bool server_fifo_;
};

// User-level partitioning with a credit window (Mercury III-A; ByteScheduler, SOSP'19):
// partitions wait in the scheduler's own priority queue; the scheduler hands the most
// urgent one to the FIFO communication library while the unacknowledged bytes fit in the
// credit (always at least one partition), and each handed-over partition pays the
// startup time first. An acknowledgement frees its credit.
// p3 is the stop-and-wait special case: a window of one slice (Mercury III-A: "If the
// credit size is set equal to the partition size, the credit-based preemption
// degenerates to the stop-and-wait preemption").
class CreditScheduler final : public PsPolicy {
 public:
  CreditScheduler(std::string_view name, const PsContext& ctx, Bytes partition, Bytes credit,
                  TimeNs startup)
      : name_(name),
        ctx_(ctx),
        partition_(partition),
        credit_(credit),
        startup_(startup),
        window_(credit) {}
  std::string_view name() const override { return name_; }
  QueueDiscipline discipline() const override { return QueueDiscipline::kFifo; }
  // A credit of at most one partition lets one partition go at a time (CreditWindow).
  bool stop_and_wait() const override { return credit_ <= partition_; }

  void on_gradient_ready(int layer, TimeNs, PushSink& out) override {
    for (TensorId t = ctx_.layout->first_tensor(layer); t < ctx_.layout->end_tensor(layer); ++t) {
      push_interleaved(ctx_, t, partition_,
                       [&](const PushUnit& u) { window_.add(u, u.priority, u.chunk.length); });
    }
    dispatch(out);
  }
  void on_push_acked(const PushUnit& unit, TimeNs, PushSink& out) override {
    window_.finished(unit.chunk.length);
    dispatch(out);
  }

 private:
  void dispatch(PushSink& out) {
    window_.release([&](const PushUnit& u) { out.push(u, startup_); });
  }

  std::string name_;
  PsContext ctx_;
  Bytes partition_;
  Bytes credit_;
  TimeNs startup_;
  CreditWindow<PushUnit> window_;
};

}  // namespace

Status check_push_unit(const PushUnit& u, const TensorLayout& layout, const Placement& placement) {
  if (u.chunk.tensor < 0 || u.chunk.tensor >= layout.num_tensors()) {
    return internal_error("policy pushed unknown tensor " + std::to_string(u.chunk.tensor));
  }
  if (u.chunk.length <= 0 || u.chunk.offset < 0)
    return internal_error("policy pushed an empty unit");
  if (u.server < 0 || u.server >= placement.num_servers()) {
    return internal_error("policy pushed to unknown server " + std::to_string(u.server));
  }
  if (placement.owning_slice(u.chunk, u.server) == nullptr)
    return internal_error("policy pushed a unit that straddles servers or leaves its tensor");
  if (u.priority < 0 || u.priority > layout.num_tensors()) {
    return internal_error("policy priority " + std::to_string(u.priority) + " out of range");
  }
  return Status::ok();
}

Status register_ps_policies(PolicyRegistry& r) {
  using Ptr = std::unique_ptr<PsPolicy>;
  std::vector<Knob> knobs = {
      {.name = "packet_size",
       .flag = "--packet-size",
       .type = KnobType::kBytes,
       .help = "packet payload",
       .cuts = true,
       .field = knob_field(&MercuryOptions::packet_size)},
      {.name = "mercury_server_fifo",
       .flag = "--mercury-server-fifo",
       .type = KnobType::kBool,
       .help = "servers send summed packets in completion order (the paper's Ready Queue), not by "
               "priority",
       .field = knob_field(&MercuryOptions::mercury_server_fifo)},
      {.name = "partition_size",
       .flag = "--partition-size",
       .type = KnobType::kBytes,
       .help = "partition size",
       .scales = true,
       .cuts = true,
       .field = knob_field(&ByteSchedulerOptions::partition_size)},
      {.name = "credit_size",
       .flag = "--credit-size",
       .type = KnobType::kBytes,
       .help = "credit window",
       .scales = true,
       .field = knob_field(&ByteSchedulerOptions::credit_size)},
      {.name = "slice_size",
       .flag = "--slice-size",
       .type = KnobType::kBytes,
       .help = "slice size (P3: 50,000 fp32 parameters)",
       .scales = true,
       .cuts = true,
       .field = knob_field(&P3Options::slice_size)},
      {.name = "startup_time",
       .flag = "--startup-time",
       .type = KnobType::kTime,
       .help = "user-level startup time per partition, slice or block (Mercury III-A)",
       .field = knob_field(&StartupOptions::startup_time)},
  };
  auto mercury = [](bool preempt) {
    return [preempt](const PolicyOptions& o, const PsContext& ctx) -> Result<Ptr> {
      QS_RETURN_IF_ERROR(
          need_positive(o.packet_size, "--packet-size", preempt ? "mercury" : "mercury-nopreempt"));
      return Ptr(new Mercury(ctx, o.packet_size, preempt, o.mercury_server_fifo));
    };
  };
  std::vector<PolicySpec> policies = {
      {.name = "oracle",
       .summary = "compute only: no gradient leaves the worker",
       .rank = 0,
       .communicates = false,
       .make_ps = [](const PolicyOptions&, const PsContext&) -> Result<Ptr> {
         return Ptr(new Oracle());
       }},
      {.name = "wfbp",
       .summary = "a tensor's slice per server, FIFO",
       .knobs = {"split_threshold"},
       .rank = 10,
       .make_ps = [](const PolicyOptions&, const PsContext& ctx) -> Result<Ptr> {
         return Ptr(new TensorLevel(ctx, false));
       }},
      {.name = "p3",
       .summary = "slices, stop-and-wait",
       .knobs = {"slice_size", "startup_time", "split_threshold"},
       .rank = 20,
       .make_ps = [](const PolicyOptions& o, const PsContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.slice_size, "--slice-size", "p3"));
         return Ptr(new CreditScheduler("p3", ctx, o.slice_size, 0, o.startup_time));
       }},
      {.name = "tictac",
       .summary = "whole tensors by priority",
       .knobs = {"split_threshold"},
       .rank = 30,
       .make_ps = [](const PolicyOptions&, const PsContext& ctx) -> Result<Ptr> {
         return Ptr(new TensorLevel(ctx, true));
       }},
      {.name = "bytescheduler",
       .summary = "partitions through a credit window",
       .knobs = {"partition_size", "credit_size", "startup_time", "split_threshold"},
       .rank = 40,
       .make_ps = [](const PolicyOptions& o, const PsContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.partition_size, "--partition-size", "bytescheduler"));
         QS_RETURN_IF_ERROR(need_positive(o.credit_size, "--credit-size", "bytescheduler"));
         return Ptr(new CreditScheduler("bytescheduler", ctx, o.partition_size, o.credit_size,
                                        o.startup_time));
       }},
      {.name = "mercury-nopreempt",
       .summary = "packets, FIFO",
       .knobs = {"packet_size", "split_threshold"},
       .rank = 60,
       .make_ps = mercury(false)},
      {.name = "mercury",
       .summary = "packets by priority (preemption at packet granularity)",
       .knobs = {"packet_size", "mercury_server_fifo", "split_threshold"},
       .rank = 70,
       .make_ps = mercury(true)},
  };
  return r.add(std::move(knobs), std::move(policies));
}

}  // namespace qs
