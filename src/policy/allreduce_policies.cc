// The all-reduce policies of the MG-WFBP and DeFT comparisons, and their registration.
// US-Byte lives in usbyte.cc, DeFT in deft.cc, the MG-WFBP algorithms in mgwfbp.cc.
#include "allreduce_policies.h"

#include <algorithm>

#include "allreduce_plans.h"
#include "credit_window.h"
#include "knob_table.h"
#include "quicksilver/core/check.h"
#include "quicksilver/policy/ps_policy.h"

namespace qs {

// Declared in the policy layer (the policies plan with it), so defined here: the sim
// layer depends on policy, never the other way round.
TimeNs AllReduceCost::time(Bytes m) const {
  return a + static_cast<TimeNs>(b_ns_per_byte * static_cast<double>(m) + 0.5);
}

Bytes CollectiveBucket::bytes() const {
  Bytes s = 0;
  for (const Chunk& c : chunks) s += c.length;
  return s;
}

namespace {

std::vector<Chunk> layer_chunks(const TensorLayout& layout, int layer) {
  std::vector<Chunk> v;
  for (TensorId t = layout.end_tensor(layer) - 1; t >= layout.first_tensor(layer); --t) {
    if (layout.tensor(t).bytes > 0) v.push_back(Chunk{t, 0, layout.tensor(t).bytes});
  }
  return v;
}

// oracle: compute only; the engine never waits for communication.
class AllReduceOracle final : public AllReducePolicy {
 public:
  std::string_view name() const override { return "oracle"; }
  bool communicates() const override { return false; }
  ForwardGate forward_gate() const override { return ForwardGate::kAfterAll; }
  void on_gradient_ready(int, TimeNs, CollectiveSink&) override {}
};

// A fixed set of buckets, each all-reduced as soon as the gradient of its last-ready layer
// is (WFBP), in that order; the next forward waits for the last all-reduce (MG-WFBP
// Algorithm 2 line 12; PyTorch DDP's finalize_backward). wfbp, synceasgd, mgwfbp,
// mgwfbp-opt and ddp differ only in the buckets.
class StaticBuckets final : public AllReducePolicy {
 public:
  // buckets_at[l]: the buckets issued when layer l's gradient is ready, in issue order.
  StaticBuckets(std::string name, std::vector<std::vector<std::vector<Chunk>>> buckets_at,
                std::vector<std::string> notes)
      : name_(std::move(name)), buckets_at_(std::move(buckets_at)), notes_(std::move(notes)) {}
  std::string_view name() const override { return name_; }
  ForwardGate forward_gate() const override { return ForwardGate::kAfterAll; }
  bool fixed_order() const override { return true; }
  void on_iteration_start(std::int64_t iteration, TimeNs, CollectiveSink&) override {
    iteration_ = iteration;
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink& out) override {
    for (const auto& chunks : buckets_at_[static_cast<std::size_t>(layer)]) {
      CollectiveBucket b;
      b.chunks = chunks;
      b.priority = layer;
      b.first_iteration = b.last_iteration = iteration_;
      b.id = next_id_++;
      out.all_reduce(b, 0);
    }
  }
  std::vector<std::string> report() const override { return notes_; }

 private:
  std::string name_;
  std::vector<std::vector<std::vector<Chunk>>> buckets_at_;
  std::vector<std::string> notes_;
  std::int64_t iteration_ = 0;
  std::uint64_t next_id_ = 0;
};

// The MG-WFBP problem of this job: learnable layers (those with bytes) in forward order.
struct LearnableLayers {
  std::vector<int> layer;  // profile layer of learnable layer k (0-based k = paper's k+1)
  MergeProblem problem;
};

LearnableLayers learnable_layers(const AllReduceContext& ctx) {
  const IterationModel m = IterationModel::from(ctx);
  LearnableLayers out;
  out.problem.cost = ctx.links.at(0);
  out.problem.tf = 0;
  for (int l = 0; l < ctx.layout->num_layers(); ++l) {
    if (ctx.layout->layer_bytes(l) > 0) out.layer.push_back(l);
  }
  for (std::size_t k = 0; k < out.layer.size(); ++k) {
    const TimeNs above =
        k + 1 < out.layer.size() ? m.ready[static_cast<std::size_t>(out.layer[k + 1])] : 0;
    out.problem.tb.push_back(m.ready[static_cast<std::size_t>(out.layer[k])] - above);
    out.problem.bytes.push_back(ctx.layout->layer_bytes(out.layer[k]));
  }
  return out;
}

std::vector<std::vector<std::vector<Chunk>>> buckets_from_merges(const AllReduceContext& ctx,
                                                                 const LearnableLayers& ll,
                                                                 const MergeSet& merged) {
  std::vector<std::vector<std::vector<Chunk>>> at(
      static_cast<std::size_t>(ctx.layout->num_layers()));
  std::vector<Chunk> carry;
  for (int k = static_cast<int>(ll.layer.size()) - 1; k >= 0; --k) {
    const int l = ll.layer[static_cast<std::size_t>(k)];
    for (const Chunk& c : layer_chunks(*ctx.layout, l)) carry.push_back(c);
    if (k > 0 && merged[static_cast<std::size_t>(k)]) continue;
    at[static_cast<std::size_t>(l)].push_back(std::move(carry));
    carry.clear();
  }
  return at;
}

std::string merge_note(const char* what, const LearnableLayers& ll, const MergeSet& m) {
  int groups = 0;
  for (std::size_t k = 0; k < m.size(); ++k) groups += !m[k];
  const TimeNs t = merge_finish_time(ll.problem, m);
  const TimeNs opt = merge_finish_time(ll.problem, optimal_merge(ll.problem));
  const double gap =
      opt > 0 ? 100.0 * static_cast<double>(t - opt) / static_cast<double>(opt) : 0.0;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%s: %zu learnable layers in %d all-reduces; modelled end of the last all-reduce %s "
      "after the backward start (exact optimum %s, +%.2f%%)",
      what, m.size(), groups, format_time(t).c_str(), format_time(opt).c_str(), gap);
  return buf;
}

// PyTorch DDP's bucket assignment (torch/csrc/distributed/c10d/reducer.cpp,
// compute_bucket_assignment_by_size): parameters in reverse order (the order their
// gradients become ready), appended to the open bucket, which closes once it reaches its
// limit (so a bucket may exceed it by its last parameter; a parameter is never split); the
// first bucket's limit is the small first-bucket size, the others bucket_cap_mb.
std::vector<std::vector<std::vector<Chunk>>> ddp_buckets(const AllReduceContext& ctx, Bytes first,
                                                         Bytes cap, int* count) {
  const TensorLayout& lay = *ctx.layout;
  std::vector<std::vector<std::vector<Chunk>>> at(static_cast<std::size_t>(lay.num_layers()));
  std::vector<Chunk> cur;
  Bytes size = 0, limit = first;
  int lowest = 0;
  *count = 0;
  for (TensorId t = lay.num_tensors() - 1; t >= 0; --t) {
    const TensorInfo& info = lay.tensor(t);
    if (info.bytes == 0) continue;
    cur.push_back(Chunk{t, 0, info.bytes});
    size += info.bytes;
    lowest = info.layer;
    if (size >= limit) {
      at[static_cast<std::size_t>(lowest)].push_back(std::move(cur));
      cur.clear();
      size = 0;
      limit = cap;
      ++*count;
    }
  }
  if (!cur.empty()) {
    at[static_cast<std::size_t>(lowest)].push_back(std::move(cur));
    ++*count;
  }
  return at;
}

// ByteScheduler's uniform cut (bytescheduler/common/bytecore.py post() and
// pytorch/horovod_task.py _partition_tensor): a tensor larger than the partition is cut
// into ceil(size / partition) nearly equal pieces (sizes differ by at most one element),
// not into full partitions and a remainder; a tensor within the partition stays whole.
std::vector<Chunk> uniform_partitions(const Chunk& whole, Bytes partition, Bytes element_size) {
  const std::int64_t elements = whole.length / element_size;
  const std::int64_t per = std::max<std::int64_t>(1, partition / element_size);
  if (elements <= per) return {whole};
  const std::int64_t n = (elements + per - 1) / per;
  std::vector<Chunk> out;
  out.reserve(static_cast<std::size_t>(n));
  Bytes offset = whole.offset;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t e = elements / n + (i < elements % n ? 1 : 0);
    out.push_back(Chunk{whole.tensor, offset, e * element_size});
    offset += e * element_size;
  }
  return out;
}

// ByteScheduler (Peng et al., SOSP'19) in all-reduce mode, as it runs on Horovod (the DeFT
// paper's baseline, Table III: "auto-tune & uniform" partitions, sequential order).
// Two queues, as in the original:
//  1. ByteScheduler's own (ByteCore): tensors cut into uniform partitions wait in a
//     priority queue (lowest tensor first, then FIFO) and are handed to the communication
//     library while the unfinished bytes fit in the credit (credit_window.h; always at
//     least one). In all-reduce the acknowledgement that frees credit is the collective's
//     completion.
//  2. The library's (Horovod, which ByteScheduler's patch leaves with its Tensor Fusion
//     on, HOROVOD_FUSION_THRESHOLD 64 MiB): Horovod's background thread performs its
//     collectives one cycle at a time; each cycle fuses everything handed to it since the
//     last one, in hand-over order, into collectives of at most the fusion threshold (a
//     partition is never split), performs them back to back, and only then starts the
//     next cycle. We model a cycle as starting when this policy's previous cycle's
//     collectives are all done (or at once when none is outstanding), each collective
//     paying the startup time.
// Without (2), every partition was its own collective: 314 on ResNet-101, each paying
// the startup and a; `--fusion-size 1B` restores that for comparison.
// Deliberate differences: no auto-tuning (the credit and partition are knobs; `quicksilver
// tune` searches them offline); Horovod's 5 ms cycle time is not modelled apart from the
// startup. Buckets depend only on the order of the calls (no clock, no randomness), so
// workers driven by the same event sequence cut the same buckets in the same order. The
// order matters: a gradient that becomes ready before a collective completes on one
// worker and after it on another would join different cycles. Horovod avoids that by
// negotiating readiness through its coordinator; a runtime driving this policy must
// likewise hand every worker's instance the same sequence (as it must for the credit
// window's order, which had the same dependence before fusion).
class ByteSchedulerAr final : public AllReducePolicy {
 public:
  ByteSchedulerAr(const AllReduceContext& ctx, Bytes partition, Bytes credit, Bytes fusion,
                  TimeNs startup)
      : ctx_(ctx), partition_(partition), fusion_(fusion), startup_(startup), window_(credit) {}
  std::string_view name() const override { return "bytescheduler"; }
  ForwardGate forward_gate() const override { return ForwardGate::kPerLayer; }
  void on_iteration_start(std::int64_t iteration, TimeNs, CollectiveSink&) override {
    iteration_ = iteration;
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink& out) override {
    for (TensorId t = ctx_.layout->first_tensor(layer); t < ctx_.layout->end_tensor(layer); ++t) {
      const TensorInfo& info = ctx_.layout->tensor(t);
      if (info.bytes == 0) continue;
      for (const Chunk& c :
           uniform_partitions(Chunk{t, 0, info.bytes}, partition_, info.element_size)) {
        CollectiveBucket b;
        b.chunks = {c};
        b.priority = t;
        b.first_iteration = b.last_iteration = iteration_;
        window_.add(std::move(b), t, c.length);
      }
    }
    dispatch(out);
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs, CollectiveSink& out) override {
    window_.finished(b.bytes());
    QS_CHECK(outstanding_ > 0);
    --outstanding_;
    dispatch(out);
  }
  std::vector<std::string> report() const override {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.2f partitions per collective (fusion threshold %s)",
                  collectives_ > 0
                      ? static_cast<double>(partitions_) / static_cast<double>(collectives_)
                      : 0.0,
                  format_size(fusion_).c_str());
    return {buf};
  }

 private:
  void dispatch(CollectiveSink& out) {
    window_.release([&](CollectiveBucket b) { library_.push_back(std::move(b)); });
    if (outstanding_ > 0 || library_.empty()) return;
    // One Horovod cycle: fuse what was handed over since the last one.
    CollectiveBucket fused;
    auto issue = [&]() {
      fused.id = next_id_++;
      out.all_reduce(fused, startup_);
      ++outstanding_;
      ++collectives_;
      fused = CollectiveBucket{};
    };
    for (CollectiveBucket& b : library_) {
      // A collective carries one iteration's gradients (its first/last_iteration mean
      // the same bytes of several iterations, never different bytes).
      if (!fused.chunks.empty() &&
          (fused.bytes() + b.bytes() > fusion_ || b.first_iteration != fused.first_iteration)) {
        issue();
      }
      if (fused.chunks.empty()) {
        fused.priority = b.priority;
        fused.first_iteration = fused.last_iteration = b.first_iteration;
      }
      fused.priority = std::min(fused.priority, b.priority);
      fused.chunks.insert(fused.chunks.end(), b.chunks.begin(), b.chunks.end());
      ++partitions_;
    }
    issue();
    library_.clear();
  }

  AllReduceContext ctx_;
  Bytes partition_;
  Bytes fusion_;
  TimeNs startup_;
  CreditWindow<CollectiveBucket> window_;
  std::vector<CollectiveBucket> library_;  // handed to the library, not yet in a cycle
  int outstanding_ = 0;                    // this cycle's collectives not yet done
  std::uint64_t next_id_ = 0;
  std::int64_t iteration_ = 0;
  std::int64_t collectives_ = 0, partitions_ = 0;
};

}  // namespace

Status register_allreduce_policies(PolicyRegistry& r) {
  using Ptr = std::unique_ptr<AllReducePolicy>;
  // wfbp, synceasgd, mgwfbp and mgwfbp-opt: a fixed merge of layers into buckets.
  auto merged = [](std::string name) {
    return [name](const PolicyOptions&, const AllReduceContext& ctx) -> Result<Ptr> {
      const LearnableLayers ll = learnable_layers(ctx);
      const std::size_t n = ll.layer.size();
      MergeSet m(n, false);
      std::vector<std::string> notes;
      if (name == "synceasgd") {
        // SyncEASGD as MG-WFBP models it (section V-B): one all-reduce of all gradients
        // after the whole backward pass: every layer above layer 1 is merged.
        for (std::size_t k = 1; k < n; ++k) m[k] = true;
      } else if (name == "mgwfbp") {
        m = mgwfbp_algorithm1(ll.problem);
        notes.push_back(merge_note("Algorithm 1", ll, m));
      } else if (name == "mgwfbp-opt") {
        m = optimal_merge(ll.problem);
        notes.push_back(merge_note("exact optimum", ll, m));
      }
      return Ptr(new StaticBuckets(name, buckets_from_merges(ctx, ll, m), std::move(notes)));
    };
  };
  std::vector<Knob> knobs = {
      {.name = "ddp_bucket_size",
       .flag = "--ddp-bucket-size",
       .type = KnobType::kBytes,
       .help = "bucket cap",
       .scales = true,
       .field = knob_field(&DdpOptions::ddp_bucket_size)},
      {.name = "ddp_first_bucket_size",
       .flag = "--ddp-first-bucket-size",
       .type = KnobType::kBytes,
       .help = "first bucket cap",
       .scales = true,
       .field = knob_field(&DdpOptions::ddp_first_bucket_size)},
      {.name = "fusion_size",
       .flag = "--fusion-size",
       .type = KnobType::kBytes,
       .help = "the library's tensor-fusion threshold (Horovod's; 1B: no fusion)",
       .scales = true,
       .field = knob_field(&ByteSchedulerOptions::fusion_size)},
  };
  constexpr Architecture kAr = Architecture::kAllReduce;
  std::vector<PolicySpec> policies = {
      {.name = "oracle",
       .architecture = kAr,
       .summary = "compute only: no gradient is reduced",
       .rank = 0,
       .communicates = false,
       .make_allreduce = [](const PolicyOptions&, const AllReduceContext&) -> Result<Ptr> {
         return Ptr(new AllReduceOracle());
       }},
      {.name = "wfbp",
       .architecture = kAr,
       .summary = "one all-reduce per layer",
       .rank = 10,
       .make_allreduce = merged("wfbp")},
      {.name = "synceasgd",
       .architecture = kAr,
       .summary = "one all-reduce after the backward pass",
       .rank = 20,
       .make_allreduce = merged("synceasgd")},
      {.name = "mgwfbp",
       .architecture = kAr,
       .summary = "layers merged by MG-WFBP Algorithm 1",
       .rank = 30,
       .make_allreduce = merged("mgwfbp")},
      {.name = "mgwfbp-opt",
       .architecture = kAr,
       .summary = "the exact optimal merge",
       .rank = 40,
       .make_allreduce = merged("mgwfbp-opt")},
      {.name = "ddp",
       .architecture = kAr,
       .summary = "PyTorch DDP buckets",
       .knobs = {"ddp_bucket_size", "ddp_first_bucket_size"},
       .rank = 50,
       .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.ddp_bucket_size, "ddp bucket size", "ddp"));
         QS_RETURN_IF_ERROR(need_positive(o.ddp_first_bucket_size, "ddp first bucket size", "ddp"));
         int count = 0;
         auto at = ddp_buckets(ctx, o.ddp_first_bucket_size, o.ddp_bucket_size, &count);
         return Ptr(new StaticBuckets(
             "ddp", std::move(at),
             {std::to_string(count) + " buckets (first " + format_size(o.ddp_first_bucket_size) +
              ", then " + format_size(o.ddp_bucket_size) + ")"}));
       }},
      {.name = "bytescheduler",
       .architecture = kAr,
       .summary = "partitions through a credit window",
       .knobs = {"partition_size", "credit_size", "fusion_size", "startup_time"},
       .rank = 60,
       .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.partition_size, "--partition-size", "bytescheduler"));
         QS_RETURN_IF_ERROR(need_positive(o.credit_size, "--credit-size", "bytescheduler"));
         QS_RETURN_IF_ERROR(need_positive(o.fusion_size, "--fusion-size", "bytescheduler"));
         return Ptr(new ByteSchedulerAr(ctx, o.partition_size, o.credit_size, o.fusion_size,
                                        o.startup_time));
       }},
  };
  return r.add(std::move(knobs), std::move(policies));
}

}  // namespace qs
