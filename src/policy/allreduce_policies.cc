// The all-reduce policies of the MG-WFBP and DeFT comparisons, and their registration.
// US-Byte lives in usbyte.cc, DeFT in deft.cc, the MG-WFBP algorithms in mgwfbp.cc.
#include <algorithm>

#include "allreduce_plans.h"
#include "allreduce_policies.h"
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
class Oracle final : public AllReducePolicy {
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
    const TimeNs above = k + 1 < out.layer.size() ? m.ready[static_cast<std::size_t>(out.layer[k + 1])] : 0;
    out.problem.tb.push_back(m.ready[static_cast<std::size_t>(out.layer[k])] - above);
    out.problem.bytes.push_back(ctx.layout->layer_bytes(out.layer[k]));
  }
  return out;
}

std::vector<std::vector<std::vector<Chunk>>> buckets_from_merges(const AllReduceContext& ctx,
                                                                 const LearnableLayers& ll,
                                                                 const MergeSet& merged) {
  std::vector<std::vector<std::vector<Chunk>>> at(static_cast<std::size_t>(ctx.layout->num_layers()));
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
  const double gap = opt > 0 ? 100.0 * static_cast<double>(t - opt) / static_cast<double>(opt) : 0.0;
  char buf[256];
  std::snprintf(buf, sizeof buf,
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

// ByteScheduler (Peng et al., SOSP'19) in all-reduce mode, with the PS version's credit
// window (credit_window.h): tensors are cut into partitions kept in the scheduler's own
// priority queue (lowest tensor first, then FIFO); the most urgent is handed to the FIFO
// collective library while the unfinished bytes fit in the credit (always at least one),
// each paying the startup time. In all-reduce the acknowledgement
// that frees credit is the collective's completion. Layer l's forward waits for its own
// partitions only.
class ByteSchedulerAr final : public AllReducePolicy {
 public:
  ByteSchedulerAr(const AllReduceContext& ctx, Bytes partition, Bytes credit, TimeNs startup)
      : ctx_(ctx), partition_(partition), startup_(startup), window_(credit) {}
  std::string_view name() const override { return "bytescheduler"; }
  ForwardGate forward_gate() const override { return ForwardGate::kPerLayer; }
  void on_iteration_start(std::int64_t iteration, TimeNs, CollectiveSink&) override {
    iteration_ = iteration;
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink& out) override {
    for (TensorId t = ctx_.layout->first_tensor(layer); t < ctx_.layout->end_tensor(layer); ++t) {
      const TensorInfo& info = ctx_.layout->tensor(t);
      if (info.bytes == 0) continue;
      for (const Chunk& c : split_chunk(Chunk{t, 0, info.bytes}, partition_, info.element_size)) {
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
    dispatch(out);
  }

 private:
  void dispatch(CollectiveSink& out) {
    window_.release([&](CollectiveBucket b) {
      b.id = next_id_++;
      out.all_reduce(b, startup_);
    });
  }

  AllReduceContext ctx_;
  Bytes partition_;
  TimeNs startup_;
  CreditWindow<CollectiveBucket> window_;
  std::uint64_t next_id_ = 0;
  std::int64_t iteration_ = 0;
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
      {.name = "ddp_bucket_size", .flag = "--ddp-bucket-size", .type = KnobType::kBytes, .help = "bucket cap",
       .scales = true, .field = knob_field(&DdpOptions::ddp_bucket_size)},
      {.name = "ddp_first_bucket_size", .flag = "--ddp-first-bucket-size", .type = KnobType::kBytes,
       .help = "first bucket cap", .scales = true, .field = knob_field(&DdpOptions::ddp_first_bucket_size)},
  };
  constexpr Architecture kAr = Architecture::kAllReduce;
  std::vector<PolicySpec> policies = {
      {.name = "oracle", .architecture = kAr, .summary = "compute only: no gradient is reduced", .rank = 0,
       .make_allreduce = [](const PolicyOptions&, const AllReduceContext&) -> Result<Ptr> {
         return Ptr(new Oracle());
       }},
      {.name = "wfbp", .architecture = kAr, .summary = "one all-reduce per layer", .rank = 10,
       .make_allreduce = merged("wfbp")},
      {.name = "synceasgd", .architecture = kAr, .summary = "one all-reduce after the backward pass", .rank = 20,
       .make_allreduce = merged("synceasgd")},
      {.name = "mgwfbp", .architecture = kAr, .summary = "layers merged by MG-WFBP Algorithm 1", .rank = 30,
       .make_allreduce = merged("mgwfbp")},
      {.name = "mgwfbp-opt", .architecture = kAr, .summary = "the exact optimal merge", .rank = 40,
       .make_allreduce = merged("mgwfbp-opt")},
      {.name = "ddp", .architecture = kAr, .summary = "PyTorch DDP buckets",
       .knobs = {"ddp_bucket_size", "ddp_first_bucket_size"}, .rank = 50,
       .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.ddp_bucket_size, "ddp bucket size", "ddp"));
         QS_RETURN_IF_ERROR(need_positive(o.ddp_first_bucket_size, "ddp first bucket size", "ddp"));
         int count = 0;
         auto at = ddp_buckets(ctx, o.ddp_first_bucket_size, o.ddp_bucket_size, &count);
         return Ptr(new StaticBuckets("ddp", std::move(at),
                                      {std::to_string(count) + " buckets (first " +
                                       format_size(o.ddp_first_bucket_size) + ", then " +
                                       format_size(o.ddp_bucket_size) + ")"}));
       }},
      {.name = "bytescheduler", .architecture = kAr, .summary = "partitions through a credit window",
       .knobs = {"partition_size", "credit_size", "startup_time"}, .rank = 60,
       .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx) -> Result<Ptr> {
         QS_RETURN_IF_ERROR(need_positive(o.partition_size, "--partition-size", "bytescheduler"));
         QS_RETURN_IF_ERROR(need_positive(o.credit_size, "--credit-size", "bytescheduler"));
         return Ptr(new ByteSchedulerAr(ctx, o.partition_size, o.credit_size, o.startup_time));
       }},
  };
  return r.add(std::move(knobs), std::move(policies));
}

}  // namespace qs
