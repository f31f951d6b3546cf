// US-Byte (Gao et al., TPDS 2023) as the DeFT paper section II-B describes it: unequal-sized
// tensor blocks and a non-sequential communication order found by a low-complexity greedy,
// on top of ByteScheduler's mechanism (a user-level queue handing blocks to the FIFO
// collective library under a credit window, each block paying the startup time).
//
// II-B gives the ideas, not the algorithm; our reading, stated so that it can be argued
// with:
//  - partition: start from ByteScheduler's equal cut at the partition size (fusing small
//    neighbouring tensors), then greedily fuse neighbouring blocks while the predicted
//    iteration time drops ("different scheduling order can further reduce the total
//    communication overhead": fewer startups where they are on the critical path);
//  - order: list scheduling; whenever the link frees, among the released blocks (at most
//    the 8 most urgent) take the one that, followed by priority order, gives the earliest
//    predicted end of the next forward pass (priority order wins ties, so the plan is never
//    worse than priority order under the model).
// The model is the engine's: one collective at a time, T_ar = a + bM, per-layer forward
// gate (IterationModel).
#include <algorithm>
#include <limits>

#include "allreduce_plans.h"
#include "allreduce_policies.h"
#include "knob_table.h"
#include "quicksilver/core/check.h"

namespace qs {
IterationModel IterationModel::from(const AllReduceContext& ctx) {
  IterationModel m;
  const Profile& p = *ctx.profile;
  const int n = p.num_layers();
  m.ready.assign(static_cast<std::size_t>(n), 0);
  m.forward.assign(static_cast<std::size_t>(n), 0);
  m.backward.assign(static_cast<std::size_t>(n), 0);
  TimeNs t = 0;
  for (int l = n - 1; l >= 0; --l) {
    const LayerSpec& s = p.layers[static_cast<std::size_t>(l)];
    m.backward[static_cast<std::size_t>(l)] = scale_time(s.backward, ctx.compute_factor);
    t += m.backward[static_cast<std::size_t>(l)];
    m.ready[static_cast<std::size_t>(l)] = t;
    m.forward[static_cast<std::size_t>(l)] = scale_time(s.update + s.forward, ctx.compute_factor);
  }
  m.backward_end = t;
  m.cost = ctx.links.at(0);
  return m;
}

TimeNs IterationModel::forward_total() const {
  TimeNs s = 0;
  for (TimeNs f : forward) s += f;
  return s;
}

std::vector<Block> cut_blocks(const TensorLayout& layout, Bytes partition) {
  QS_CHECK(partition > 0);
  std::vector<Block> out;
  Block cur;
  auto flush = [&]() {
    if (cur.bytes > 0) out.push_back(std::move(cur));
    cur = Block{};
  };
  for (TensorId t = layout.num_tensors() - 1; t >= 0; --t) {
    const TensorInfo& info = layout.tensor(t);
    if (info.bytes == 0) continue;
    for (const Chunk& c : split_chunk(Chunk{t, 0, info.bytes}, partition, info.element_size)) {
      if (cur.bytes > 0 && cur.bytes + c.length > partition) flush();
      if (cur.bytes == 0) cur.layer = info.layer;
      cur.chunks.push_back(c);
      cur.bytes += c.length;
      cur.layer = std::min(cur.layer, info.layer);
    }
  }
  flush();
  return out;
}

Block fuse(const Block& a, const Block& b) {
  Block f = a;
  f.chunks.insert(f.chunks.end(), b.chunks.begin(), b.chunks.end());
  f.bytes += b.bytes;
  f.layer = std::min(a.layer, b.layer);
  return f;
}

std::vector<int> priority_order(const std::vector<Block>& blocks) {
  std::vector<int> order(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) order[i] = static_cast<int>(i);
  // Strict: (layer, backward position); positions are unique.
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    const Block& a = blocks[static_cast<std::size_t>(x)];
    const Block& b = blocks[static_cast<std::size_t>(y)];
    return a.layer != b.layer ? a.layer < b.layer : x > y;
  });
  return order;
}

TimeNs predict_forward_end(const IterationModel& m, const std::vector<Block>& blocks,
                           const std::vector<int>& order, const TensorLayout& layout) {
  const std::size_t n = blocks.size();
  std::vector<bool> done(n, false);
  std::vector<TimeNs> layer_done(m.forward.size(), 0);
  TimeNs link = 0;
  for (std::size_t step = 0; step < n; ++step) {
    int pick = -1;
    TimeNs earliest = std::numeric_limits<TimeNs>::max();
    for (int i : order) {
      if (done[static_cast<std::size_t>(i)]) continue;
      const TimeNs r = m.ready[static_cast<std::size_t>(blocks[static_cast<std::size_t>(i)].layer)];
      earliest = std::min(earliest, r);
      if (r <= link) {
        pick = i;
        break;
      }
    }
    if (pick < 0) {
      link = earliest;
      for (int i : order) {
        if (!done[static_cast<std::size_t>(i)] &&
            m.ready[static_cast<std::size_t>(blocks[static_cast<std::size_t>(i)].layer)] <= link) {
          pick = i;
          break;
        }
      }
    }
    QS_CHECK(pick >= 0);
    const Block& b = blocks[static_cast<std::size_t>(pick)];
    done[static_cast<std::size_t>(pick)] = true;
    link = std::max(link, m.ready[static_cast<std::size_t>(b.layer)]) + m.cost.time(b.bytes);
    for (const Chunk& c : b.chunks) {
      TimeNs& d = layer_done[static_cast<std::size_t>(layout.tensor(c.tensor).layer)];
      d = std::max(d, link);
    }
  }
  TimeNs t = m.backward_end;
  for (std::size_t l = 0; l < m.forward.size(); ++l) t = std::max(t, layer_done[l]) + m.forward[l];
  return t;
}

UsBytePlan plan_usbyte(const IterationModel& m, const TensorLayout& layout, Bytes partition) {
  UsBytePlan plan;
  plan.blocks = cut_blocks(layout, partition);
  auto& blocks = plan.blocks;
  // Unequal sizes: fuse neighbours while the prediction improves.
  TimeNs best = predict_forward_end(m, blocks, priority_order(blocks), layout);
  for (int pass = 0; pass < 8; ++pass) {
    bool improved = false;
    for (std::size_t k = 0; k + 1 < blocks.size();) {
      std::vector<Block> trial;
      trial.reserve(blocks.size() - 1);
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (i == k) {
          trial.push_back(fuse(blocks[k], blocks[k + 1]));
          ++i;
        } else {
          trial.push_back(blocks[i]);
        }
      }
      const TimeNs t = predict_forward_end(m, trial, priority_order(trial), layout);
      if (t < best) {
        best = t;
        blocks = std::move(trial);
        improved = true;
      } else {
        ++k;
      }
    }
    if (!improved) break;
  }
  // Non-sequential order: greedy list scheduling with a one-step look-ahead.
  const std::vector<int> prio = priority_order(blocks);
  std::vector<bool> placed(blocks.size(), false);
  TimeNs link = 0;
  constexpr int kCandidates = 8;
  for (std::size_t step = 0; step < blocks.size(); ++step) {
    TimeNs earliest = std::numeric_limits<TimeNs>::max();
    for (int i : prio) {
      if (!placed[static_cast<std::size_t>(i)]) {
        earliest = std::min(
            earliest, m.ready[static_cast<std::size_t>(blocks[static_cast<std::size_t>(i)].layer)]);
      }
    }
    const TimeNs now = std::max(link, earliest);
    std::vector<int> cands;
    for (int i : prio) {
      if (!placed[static_cast<std::size_t>(i)] &&
          m.ready[static_cast<std::size_t>(blocks[static_cast<std::size_t>(i)].layer)] <= now) {
        cands.push_back(i);
        if (static_cast<int>(cands.size()) == kCandidates) break;
      }
    }
    int choice = cands.front();
    if (cands.size() > 1) {
      TimeNs best_t = std::numeric_limits<TimeNs>::max();
      for (int c : cands) {
        std::vector<int> trial = plan.order;
        trial.push_back(c);
        for (int i : prio) {
          if (!placed[static_cast<std::size_t>(i)] && i != c) trial.push_back(i);
        }
        const TimeNs t = predict_forward_end(m, blocks, trial, layout);
        if (t < best_t) {
          best_t = t;
          choice = c;
        }
      }
    }
    placed[static_cast<std::size_t>(choice)] = true;
    plan.order.push_back(choice);
    link = now + m.cost.time(blocks[static_cast<std::size_t>(choice)].bytes);
  }
  return plan;
}

namespace {

// The runtime side: blocks are released when their lowest layer's gradient is ready and
// handed to the FIFO library in plan order (the first released block of the plan) under
// the credit window; the collective's completion is the acknowledgement.
class UsByte final : public AllReducePolicy {
 public:
  UsByte(const AllReduceContext& ctx, const PolicyOptions& o)
      : ctx_(ctx), credit_(o.credit_size), startup_(o.startup_time) {
    plan_ = plan_usbyte(IterationModel::from(ctx), *ctx.layout, o.partition_size);
    released_.assign(plan_.blocks.size(), false);
    issued_.assign(plan_.blocks.size(), false);
    rank_.assign(plan_.blocks.size(), 0);
    for (std::size_t r = 0; r < plan_.order.size(); ++r)
      rank_[static_cast<std::size_t>(plan_.order[r])] = static_cast<int>(r);
  }
  std::string_view name() const override { return "usbyte"; }
  ForwardGate forward_gate() const override { return ForwardGate::kPerLayer; }

  void on_iteration_start(std::int64_t iteration, TimeNs, CollectiveSink&) override {
    iteration_ = iteration;
    std::fill(released_.begin(), released_.end(), false);
    std::fill(issued_.begin(), issued_.end(), false);
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink& out) override {
    for (std::size_t i = 0; i < plan_.blocks.size(); ++i) {
      if (plan_.blocks[i].layer == layer) released_[i] = true;
    }
    dispatch(out);
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs, CollectiveSink& out) override {
    in_flight_ -= b.bytes();
    QS_CHECK(in_flight_ >= 0);
    dispatch(out);
  }
  std::vector<std::string> report() const override {
    Bytes lo = std::numeric_limits<Bytes>::max(), hi = 0;
    for (const Block& b : plan_.blocks) lo = std::min(lo, b.bytes), hi = std::max(hi, b.bytes);
    int out_of_priority = 0;
    const std::vector<int> prio = priority_order(plan_.blocks);
    for (std::size_t i = 0; i < prio.size(); ++i) out_of_priority += prio[i] != plan_.order[i];
    return {std::to_string(plan_.blocks.size()) + " blocks of " + format_size(lo) + " to " +
            format_size(hi) + "; " + std::to_string(out_of_priority) +
            " positions of the plan differ from priority order"};
  }

 private:
  void dispatch(CollectiveSink& out) {
    for (int pos : plan_.order) {
      const std::size_t i = static_cast<std::size_t>(pos);
      if (issued_[i] || !released_[i]) continue;
      const Block& b = plan_.blocks[i];
      if (in_flight_ > 0 && in_flight_ + b.bytes > credit_) return;
      issued_[i] = true;
      in_flight_ += b.bytes;
      CollectiveBucket cb;
      cb.chunks = b.chunks;
      cb.priority = rank_[i];
      cb.first_iteration = cb.last_iteration = iteration_;
      cb.id = next_id_++;
      out.all_reduce(cb, startup_);
    }
  }

  AllReduceContext ctx_;
  Bytes credit_;
  TimeNs startup_;
  UsBytePlan plan_;
  std::vector<bool> released_, issued_;
  std::vector<int> rank_;
  std::int64_t iteration_ = 0;
  Bytes in_flight_ = 0;
  std::uint64_t next_id_ = 0;
};

}  // namespace

std::unique_ptr<AllReducePolicy> make_usbyte(const AllReduceContext& ctx, const PolicyOptions& o) {
  return std::make_unique<UsByte>(ctx, o);
}

Status register_usbyte(PolicyRegistry& r) {
  return r.add(
      {}, {{.name = "usbyte",
            .architecture = Architecture::kAllReduce,
            .summary = "unequal blocks in a non-sequential plan order, credit window",
            .knobs = {"partition_size", "credit_size", "startup_time"},
            .rank = 70,
            .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx)
                -> Result<std::unique_ptr<AllReducePolicy>> {
              QS_RETURN_IF_ERROR(need_positive(o.partition_size, "--partition-size", "usbyte"));
              QS_RETURN_IF_ERROR(need_positive(o.credit_size, "--credit-size", "usbyte"));
              return make_usbyte(ctx, o);
            }}});
}

}  // namespace qs
