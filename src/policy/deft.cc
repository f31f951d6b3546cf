// DeFT (Meng & Sun, 2024): delayed updates scheduled as knapsack problems.
//
//  - Buckets (III-D): tensors cut at the partition size, re-partitioned with US-Byte's
//    unequal sizes (usbyte.cc), then every bucket whose communication exceeds the smallest
//    knapsack capacity (the forward time / mu) is split.
//  - Stages (III-B): each backward and each forward stage solves a knapsack whose capacity
//    is the stage's computation time and whose items are bucket communications (weight =
//    profit = time). Two queues: the current task queue (buckets of older iterations still
//    to reduce) and the future task queue (every bucket of one or more newer iterations,
//    summed locally). Four cases, as section III-B numbers them (see on_iteration_start and
//    on_forward_start). A range of iterations is applied as one parameter update once all
//    its buckets are reduced: an update of k iterations is a step with batch size kB (IV-C1).
//  - Two links (III-C): two knapsacks, the second (slower link) with 1/mu of the capacity in
//    first-link time; the paper's greedy (smaller knapsack first, longer items first), and
//    an exact search where the instance is small (the greedy's losses are counted).
//  - Preserver (IV-C): a dry run gives the update sequence's batch sizes: the policy itself
//    driven on the job's model (profile times scaled by the compute factor, each link
//    running one collective at a time at a + bM, the stages' gates), so that it certifies
//    the schedule the engine executes, collectives that spill past their stage included.
//    The random-walk loss model of Yin et al. compares one period of it with fixed-batch
//    training; outside [1 - epsilon, 1 + epsilon] every capacity is raised and the solver
//    reruns (at most deft_max_retries times). With the default constants the loss model
//    is a fixed rule: at most one skipped update per period (docs/policies-allreduce.md).
//
// Deliberate choices where the paper is silent:
//  - The knapsacks pool computation time and ignore dependencies (as the paper intends), so
//    a stage's collectives may run past its end. We let them spill over by one stage: a
//    stage starts only once every collective issued before the previous stage began has
//    completed (forward_ready / backward_ready). Without some such bound a schedule whose
//    communication exceeds the computation would cost nothing in the simulator.
//  - Each stage's capacities are reduced by the links' backlog (work already queued).
//  - "Case 2 or 3" is decided by whether the knapsack over the current task queue with the
//    whole backward time takes every bucket.
#include "deft.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "allreduce_policies.h"
#include "knob_table.h"
#include "quicksilver/core/check.h"

namespace qs {

// ---- knapsacks ----

KnapsackSolution greedy_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0, TimeNs cap1) {
  std::vector<std::pair<TimeNs, int>> sacks;  // (capacity, link)
  if (cap0 >= 0) sacks.emplace_back(cap0, 0);
  if (cap1 >= 0) sacks.emplace_back(cap1, 1);
  std::sort(sacks.begin(), sacks.end());  // smaller capacity first; ties: link 0
  std::vector<int> order(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const KnapsackItem& x = items[static_cast<std::size_t>(a)];
    const KnapsackItem& y = items[static_cast<std::size_t>(b)];
    return x.time != y.time ? x.time > y.time : a < b;  // longer first; unique index breaks ties
  });
  std::vector<int> link(items.size(), -1);
  for (auto [cap, l] : sacks) {
    TimeNs left = cap;
    for (int i : order) {
      if (link[static_cast<std::size_t>(i)] < 0 &&
          items[static_cast<std::size_t>(i)].time <= left) {
        link[static_cast<std::size_t>(i)] = l;
        left -= items[static_cast<std::size_t>(i)].time;
      }
    }
  }
  KnapsackSolution s;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (link[i] < 0) continue;
    s.ids.push_back(items[i].id);
    s.links.push_back(link[i]);
    s.total += items[i].time;
  }
  return s;
}

namespace {

struct ExactSearch {
  std::vector<TimeNs> w;  // sorted descending
  std::vector<TimeNs> suffix;
  std::vector<int> cur, best;
  TimeNs best_total = -1, limit = 0;
  void run(std::size_t i, TimeNs left0, TimeNs left1, TimeNs total) {
    if (total > best_total) best_total = total, best = cur;
    if (i == w.size() || best_total == limit) return;
    if (total + suffix[i] <= best_total) return;  // bound
    if (w[i] <= left0) {
      cur[i] = 0;
      run(i + 1, left0 - w[i], left1, total + w[i]);
    }
    if (w[i] <= left1 && left1 != left0) {  // equal capacities: symmetric, skip
      cur[i] = 1;
      run(i + 1, left0, left1 - w[i], total + w[i]);
    }
    cur[i] = -1;
    run(i + 1, left0, left1, total);
  }
};

}  // namespace

KnapsackSolution exact_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0, TimeNs cap1) {
  QS_CHECK(items.size() <= 24);
  std::vector<int> order(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const TimeNs x = items[static_cast<std::size_t>(a)].time,
                 y = items[static_cast<std::size_t>(b)].time;
    return x != y ? x > y : a < b;
  });
  ExactSearch s;
  for (int i : order) s.w.push_back(items[static_cast<std::size_t>(i)].time);
  s.suffix.assign(s.w.size() + 1, 0);
  for (std::size_t i = s.w.size(); i-- > 0;) s.suffix[i] = s.suffix[i + 1] + s.w[i];
  s.cur.assign(s.w.size(), -1);
  s.best = s.cur;
  const TimeNs c0 = std::max<TimeNs>(cap0, -1), c1 = std::max<TimeNs>(cap1, -1);
  s.limit = std::min(s.suffix[0], std::max<TimeNs>(c0, 0) + std::max<TimeNs>(c1, 0));
  s.run(0, c0, c1, 0);
  std::vector<int> link(items.size(), -1);
  for (std::size_t k = 0; k < order.size(); ++k)
    link[static_cast<std::size_t>(order[k])] = s.best[k];
  KnapsackSolution out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (link[i] < 0) continue;
    out.ids.push_back(items[i].id);
    out.links.push_back(link[i]);
    out.total += items[i].time;
  }
  return out;
}

// ---- the loss model of IV-C2 ----

double LossModel::step(double s, int k) const {
  // A step with k merged batches is a step with batch kB (IV-C1): the move is
  // eta * N(mu, sigma^2 / (kB)), rebounding at the objective S*.
  const double b = batch * k;
  const double d = s - target - lr * mu;
  const double sd = lr * sigma / std::sqrt(b);
  // No noise (sigma measured as 0, e.g. with one worker): the walk is the deterministic
  // move, rebounding at S* (the limit of the expectation below as sigma -> 0).
  if (!(sd > 0)) return std::abs(d) + target;
  const double a = d / sd;
  const double phi = 0.5 * std::erfc(-a / std::sqrt(2.0)) - 0.5 * std::erfc(a / std::sqrt(2.0));
  return d * phi + sd * std::sqrt(2.0 / M_PI) * std::exp(-a * a / 2) + target;
}

double LossModel::after(const std::vector<int>& ks) const {
  double s = s0;
  for (int k : ks) s = step(s, k);
  return s;
}

double LossModel::ratio(const std::vector<int>& ks) const {
  int n = 0;
  for (int k : ks) n += k;
  if (n == 0) return 0.0;
  return after(std::vector<int>(static_cast<std::size_t>(n), 1)) / after(ks);
}

// ---- the policy ----

namespace {

double deft_mu(const AllReduceContext& ctx, const PolicyOptions& o) {
  if (o.deft_mu > 0) return o.deft_mu;
  if (ctx.links.size() < 2) return 1.0;
  // Measured: the ratio of the links' modelled times at the partition size (Fig. 6 measures
  // it above 4,194,304 parameters, where it is flat).
  const Bytes m = std::max<Bytes>(o.deft_partition_size, 16 * kMiB);
  const double t0 = static_cast<double>(ctx.links[0].time(m));
  return t0 > 0 ? static_cast<double>(ctx.links[1].time(m)) / t0 : 1.0;
}

Block piece_of(const std::vector<Chunk>& chunks, const TensorLayout& layout) {
  Block b;
  b.chunks = chunks;
  b.layer = std::numeric_limits<int>::max();
  for (const Chunk& c : chunks) {
    b.bytes += c.length;
    b.layer = std::min(b.layer, layout.tensor(c.tensor).layer);
  }
  return b;
}

// Splits `b` into `k` pieces of about equal size, cutting at element boundaries.
std::vector<Block> split_block(const Block& b, int k, const TensorLayout& layout) {
  const Bytes target = (b.bytes + k - 1) / k;
  std::vector<Block> out;
  std::vector<Chunk> cur;
  Bytes have = 0;
  for (Chunk c : b.chunks) {
    const Bytes align = layout.tensor(c.tensor).element_size;
    while (c.length > 0) {
      Bytes take = std::min(c.length, target - have);
      if (take < c.length) take = std::max(align, take / align * align);
      take = std::min(take, c.length);
      cur.push_back(Chunk{c.tensor, c.offset, take});
      c.offset += take;
      c.length -= take;
      have += take;
      if (have >= target) {
        out.push_back(piece_of(cur, layout));
        cur.clear();
        have = 0;
      }
    }
  }
  if (!cur.empty()) out.push_back(piece_of(cur, layout));
  return out;
}

}  // namespace

std::vector<Block> deft_buckets(const AllReduceContext& ctx, const PolicyOptions& o, int* split) {
  const IterationModel m = IterationModel::from(ctx);
  std::vector<Block> blocks = plan_usbyte(m, *ctx.layout, o.deft_partition_size).blocks;
  const double mu = deft_mu(ctx, o);
  const TimeNs cap = static_cast<TimeNs>(static_cast<double>(m.forward_total()) /
                                         (ctx.links.size() > 1 ? mu : 1.0));
  std::vector<Block> out;
  *split = 0;
  for (const Block& b : blocks) {
    if (m.cost.time(b.bytes) <= cap) {
      out.push_back(b);
      continue;
    }
    // III-D: re-partition until the communication fits the smallest knapsack; at most 64
    // pieces and none under 4 KiB. Deliberate: not at all when the startup a alone
    // exceeds the knapsack (no piece could fit, and every piece would pay a again: a
    // real model on a slow, high-latency link split 72 KB into 17 buckets of 3 ms each).
    if (m.cost.a >= cap) {
      out.push_back(b);
      continue;
    }
    const int most = static_cast<int>(std::clamp<Bytes>(b.bytes / (4 * kKiB), 1, 64));
    int k = 2;
    while (k < most && m.cost.time((b.bytes + k - 1) / k) > cap) ++k;
    k = std::min(k, most);
    if (k <= 1) {
      out.push_back(b);
      continue;
    }
    ++*split;
    for (Block& p : split_block(b, k, *ctx.layout)) out.push_back(std::move(p));
  }
  return out;
}

DeftPolicy::DeftPolicy(const AllReduceContext& ctx, const PolicyOptions& o,
                       std::vector<Block> buckets, double capacity_scale)
    : ctx_(ctx),
      opts_(o),
      buckets_(std::move(buckets)),
      scale_(capacity_scale),
      exact_max_(o.deft_exact_max_items),
      link_cost_(ctx.links) {
  feedback_ = o.deft_loss_feedback;
  epsilon_ = o.deft_epsilon;
  capacity_step_ = o.deft_capacity_step;
  target_ = o.deft_loss_target;
  max_retries_ = o.deft_max_retries;
  horizon_ = o.deft_horizon;
  const IterationModel m = IterationModel::from(ctx);
  two_links_ = ctx.links.size() > 1;
  mu_ = deft_mu(ctx, o);
  backward_total_ = m.backward_end;
  forward_total_ = m.forward_total();
  TimeNs prev = 0;
  for (const Block& b : buckets_) {
    comm_.push_back(link_cost_[0].time(b.bytes));
    const TimeNs r = std::max(prev, m.ready[static_cast<std::size_t>(b.layer)]);
    ready_.push_back(r);
    step_.push_back(r - prev);
    prev = r;
  }
  link_free_.assign(link_cost_.size(), 0);
  link_busy_.assign(link_cost_.size(), 0);
}

// Deliberate (the paper is silent): III-D splits a bucket until it fits the smallest
// knapsack, which cannot work when the startup a alone exceeds it (a slow, high-latency
// link: a real model's 72 KB took 3 ms per collective against 1 ms of compute). Such a
// bucket fits no stage, and without this rule it is never reduced (one update in 281
// iterations). So when the shortest old bucket is longer than an idle stage, the
// backward stage takes it anyway once the iterations merged behind it (the future task
// queue, with this one) bring enough computation to cover it: k >= its time / one
// iteration's compute. Merging then amortises its startup as DeFT intends (the update of
// k iterations is one step of batch kB), and the Preserver's raises shorten k.
void DeftPolicy::take_one_if_none_fits(KnapsackSolution& sol,
                                       const std::vector<KnapsackItem>& items,
                                       std::int64_t iteration) const {
  if (!sol.ids.empty() || items.empty()) return;
  const KnapsackItem* best = &items[0];
  for (const KnapsackItem& it : items) {
    if (it.time < best->time) best = &it;
  }
  const double stage = scale_ * static_cast<double>(backward_total_);
  if (static_cast<double>(best->time) <= stage)
    return;  // it fits an idle stage: the knapsack's call
  const double per_iteration =
      std::max(1.0, scale_ * static_cast<double>(backward_total_ + forward_total_));
  const std::int64_t merged = future_ ? iteration - future_first_ + 1 : 1;
  if (static_cast<double>(merged) < std::ceil(static_cast<double>(best->time) / per_iteration))
    return;
  sol.ids.push_back(best->id);
  sol.links.push_back(emptiest_link());
  sol.total += best->time;
}

std::pair<TimeNs, TimeNs> DeftPolicy::capacities(TimeNs compute, TimeNs now) const {
  const double c = scale_ * static_cast<double>(compute);
  auto backlog = [&](std::size_t l) {
    return static_cast<double>(std::max<TimeNs>(0, link_free_[l] - now));
  };
  const TimeNs cap0 = static_cast<TimeNs>(std::max(0.0, c - backlog(0)));
  const TimeNs cap1 = two_links_ ? static_cast<TimeNs>(std::max(0.0, (c - backlog(1)) / mu_)) : -1;
  return {cap0, cap1};
}

KnapsackSolution DeftPolicy::naive_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0,
                                            TimeNs cap1) {
  ++knapsacks_;
  KnapsackSolution g = greedy_knapsack(items, cap0, cap1);
  if (static_cast<int>(items.size()) > exact_max_) return g;
  KnapsackSolution e = exact_knapsack(items, cap0, cap1);
  if (e.total > g.total) {
    ++greedy_losses_;
    greedy_lost_ += e.total - g.total;
    return e;
  }
  return g;
}

// Algorithm 1: order1 = NaiveKnapsack(list, remainTime); order2 =
// RecursiveKnapsack(list - C_N, remainTime - T_{N-1}); the larger sum wins (order2 on ties).
KnapsackSolution DeftPolicy::recursive_knapsack(const std::vector<KnapsackItem>& items,
                                                const std::vector<TimeNs>& step, TimeNs cap0,
                                                TimeNs cap1, std::size_t from) {
  if (from >= items.size()) return {};
  const std::vector<KnapsackItem> rest(items.begin() + static_cast<std::ptrdiff_t>(from),
                                       items.end());
  KnapsackSolution order1 = naive_knapsack(rest, cap0, cap1);
  if (from + 1 >= items.size()) return order1;
  const TimeNs t = step[from + 1];
  if (cap0 - t < 0 && (cap1 < 0 || cap1 - static_cast<TimeNs>(static_cast<double>(t) / mu_) < 0)) {
    return order1;  // order2 would be empty
  }
  KnapsackSolution order2 = recursive_knapsack(
      items, step, cap0 - t,
      cap1 < 0 ? cap1 : cap1 - static_cast<TimeNs>(static_cast<double>(t) / mu_), from + 1);
  return order1.total > order2.total ? order1 : order2;
}

void DeftPolicy::open_range(std::int64_t first, std::int64_t last) {
  open_[{first, last}] = static_cast<int>(buckets_.size());
}

void DeftPolicy::issue(const Item& it, int link, TimeNs now, CollectiveSink& out) {
  const Block& b = buckets_[static_cast<std::size_t>(it.bucket)];
  CollectiveBucket cb;
  cb.chunks = b.chunks;
  cb.link = link;
  cb.priority = b.layer;
  cb.first_iteration = it.first;
  cb.last_iteration = it.last;
  cb.id = next_id_++;
  in_flight_[cb.id] = InFlight{it.first, it.last, stage_, link};
  ++in_flight_per_stage_[stage_];
  const std::size_t l = static_cast<std::size_t>(link);
  link_free_[l] = std::max(now, link_free_[l]) + link_cost_[l].time(b.bytes);
  ++link_busy_[l];
  out.all_reduce(cb, 0);
}

void DeftPolicy::on_iteration_start(std::int64_t iteration, TimeNs now, CollectiveSink& out) {
  QS_CHECK(selected_new_.empty());
  ++stage_;
  iteration_ = iteration;
  // Whichever case follows, this iteration joins the future task queue's range, or opens
  // one: its buckets cover merged_from_..(this or a later iteration).
  merged_from_ = future_ ? future_first_ : iteration;
  DeftStage rec;
  rec.iteration = iteration;
  const int n = static_cast<int>(buckets_.size());
  auto [cap0, cap1] = capacities(backward_total_, now);
  TimeNs used0 = 0, used1 = 0;
  if (!current_.empty()) {
    std::vector<KnapsackItem> items;
    for (std::size_t i = 0; i < current_.size(); ++i)
      items.push_back({static_cast<int>(i), comm(current_[i].bucket)});
    KnapsackSolution sol = naive_knapsack(items, cap0, cap1);
    take_one_if_none_fits(sol, items, iteration);
    std::vector<bool> chosen(current_.size(), false);
    for (std::size_t k = 0; k < sol.ids.size(); ++k) {
      const std::size_t i = static_cast<std::size_t>(sol.ids[k]);
      chosen[i] = true;
      issue(current_[i], sol.links[k], now, out);
      (sol.links[k] == 0 ? used0 : used1) += comm(current_[i].bucket);
      ++rec.issued_old;
    }
    std::vector<Item> left;
    for (std::size_t i = 0; i < current_.size(); ++i) {
      if (!chosen[i]) left.push_back(current_[i]);
    }
    current_ = std::move(left);
    if (!current_.empty()) {
      // Case 2: the backward time cannot cover the old buckets: the knapsack above chose
      // among them; this iteration's buckets go to (or merge into) the future task queue.
      rec.which_case = 2;
      if (future_) {
        future_last_ = iteration;
      } else {
        future_ = true;
        future_first_ = future_last_ = iteration;
      }
      rec.current_after = static_cast<int>(current_.size());
      rec.future_after = future_;
      stages_.push_back(rec);
      return;
    }
    rec.which_case = 3;  // Case 3: all old buckets go first, then Algorithm 1 on the rest
  } else {
    rec.which_case = in_flight_.empty() ? 4 : 3;  // Case 4: nothing left of older iterations
  }
  // Cases 3 and 4: this iteration's buckets, merged with the future task queue's, are
  // the items of Algorithm 1; the capacity is the backward time after the first bucket is
  // ready, less what the old buckets took.
  const std::int64_t first = future_ ? future_first_ : iteration;
  future_ = false;
  open_range(first, iteration);
  std::vector<KnapsackItem> items;
  for (int j = 0; j < n; ++j) items.push_back({j, comm(j)});
  const TimeNs t_first = n > 0 ? step_[0] : 0;
  const TimeNs c0 = std::max<TimeNs>(0, cap0 - used0 - t_first);
  const TimeNs c1 =
      cap1 < 0 ? -1
               : std::max<TimeNs>(
                     0, cap1 - used1 - static_cast<TimeNs>(static_cast<double>(t_first) / mu_));
  const KnapsackSolution sol = recursive_knapsack(items, step_, c0, c1);
  std::vector<int> link(static_cast<std::size_t>(n), -1);
  for (std::size_t k = 0; k < sol.ids.size(); ++k)
    link[static_cast<std::size_t>(sol.ids[k])] = sol.links[k];
  for (int j = 0; j < n; ++j) {
    Item it{j, first, iteration, false};
    if (link[static_cast<std::size_t>(j)] >= 0) {
      selected_new_.emplace_back(it, link[static_cast<std::size_t>(j)]);
      ++rec.issued_new;
    } else {
      current_.push_back(it);
    }
  }
  rec.current_after = static_cast<int>(current_.size());
  rec.future_after = false;
  stages_.push_back(rec);
}

void DeftPolicy::on_gradient_ready(int layer, TimeNs now, CollectiveSink& out) {
  std::vector<std::pair<Item, int>> later;
  for (const auto& [it, link] : selected_new_) {
    if (buckets_[static_cast<std::size_t>(it.bucket)].layer == layer) {
      issue(it, link, now, out);
    } else {
      later.emplace_back(it, link);
    }
  }
  selected_new_ = std::move(later);
}

void DeftPolicy::on_forward_start(int layer, TimeNs now, CollectiveSink& out) {
  if (layer != 0) return;
  QS_CHECK(selected_new_.empty());
  ++stage_;
  DeftStage rec;
  rec.iteration = iteration_;
  rec.forward = true;
  rec.which_case = 1;
  if (!current_.empty()) {
    // Case 1: the old buckets have no dependency on the forward pass: a naive knapsack
    // with the forward time as capacity.
    auto [cap0, cap1] = capacities(forward_total_, now);
    std::vector<KnapsackItem> items;
    for (std::size_t i = 0; i < current_.size(); ++i)
      items.push_back({static_cast<int>(i), comm(current_[i].bucket)});
    const KnapsackSolution sol = naive_knapsack(items, cap0, cap1);
    std::vector<bool> chosen(current_.size(), false);
    for (std::size_t k = 0; k < sol.ids.size(); ++k) {
      chosen[static_cast<std::size_t>(sol.ids[k])] = true;
      issue(current_[static_cast<std::size_t>(sol.ids[k])], sol.links[k], now, out);
      ++rec.issued_old;
    }
    std::vector<Item> left;
    for (std::size_t i = 0; i < current_.size(); ++i) {
      if (!chosen[i]) left.push_back(current_[i]);
    }
    current_ = std::move(left);
  }
  rec.current_after = static_cast<int>(current_.size());
  rec.future_after = future_;
  stages_.push_back(rec);
}

void DeftPolicy::on_collective_done(const CollectiveBucket& b, TimeNs now, CollectiveSink&) {
  auto f = in_flight_.find(b.id);
  QS_CHECK(f != in_flight_.end());
  const InFlight fl = f->second;
  in_flight_.erase(f);
  if (--in_flight_per_stage_[fl.stage] == 0) in_flight_per_stage_.erase(fl.stage);
  const std::size_t l = static_cast<std::size_t>(fl.link);
  if (--link_busy_[l] == 0) link_free_[l] = now;
  auto r = open_.find({fl.first, fl.last});
  QS_CHECK(r != open_.end());
  if (--r->second == 0) {
    updates_.push_back(DeftUpdate{fl.first, fl.last, now});
    open_.erase(r);
  }
}

std::int64_t DeftPolicy::merged_from(std::int64_t iteration) const {
  return iteration == iteration_ ? merged_from_ : -1;
}

// A stage may start once everything issued before the previous stage began is reduced.
bool DeftPolicy::forward_ready(int layer) const {
  if (layer != 0) return true;
  return in_flight_per_stage_.empty() || in_flight_per_stage_.begin()->first >= stage_;
}

bool DeftPolicy::backward_ready() const {
  return in_flight_per_stage_.empty() || in_flight_per_stage_.begin()->first >= stage_;
}

int DeftPolicy::emptiest_link() const {
  std::size_t best = 0;
  for (std::size_t l = 1; l < link_free_.size(); ++l) {
    if (link_free_[l] < link_free_[best]) best = l;
  }
  return static_cast<int>(best);
}

void DeftPolicy::on_training_end(TimeNs now, CollectiveSink& out) {
  ++stage_;
  for (const Item& it : current_) issue(it, emptiest_link(), now, out);
  current_.clear();
  if (future_) {
    open_range(future_first_, future_last_);
    for (int j = 0; j < static_cast<int>(buckets_.size()); ++j) {
      issue(Item{j, future_first_, future_last_, false}, emptiest_link(), now, out);
    }
    future_ = false;
  }
}

// The Preserver on measured training (IV-C, Fig. 7): the Solver's schedule runs for a
// while; then the batch-size sequence it executed (the updates completed meanwhile, as
// their cycle) is judged with the loss model of IV-C2 fed the window's measured loss s_A,
// squared gradient norm mu, gradient noise sigma, learning rate and batch; outside
// [1 - epsilon, 1 + epsilon] every capacity is raised (at most deft_max_retries times in a
// run), which lets more buckets through per stage and so updates more often.
// Deliberate: judged every deft_horizon iterations for the whole run (the paper judges
// each new solution "for several iterations"); the window's means, not one sample, since
// a single iteration's loss and noise are themselves noisy.
void DeftPolicy::on_feedback(const TrainingFeedback& f, TimeNs, CollectiveSink&) {
  if (!feedback_) return;
  window_.push_back(f);
  if (static_cast<int>(window_.size()) < horizon_) return;
  std::vector<int> ks;
  for (std::size_t i = judged_updates_; i < updates_.size(); ++i) {
    ks.push_back(static_cast<int>(updates_[i].last - updates_[i].first + 1));
    covered_ = std::max(covered_, updates_[i].last + 1);
  }
  judged_updates_ = updates_.size();
  // Iterations measured that no update has applied yet are, at the least, one more merged
  // update (as in the dry run): a schedule that stops updating must not pass.
  if (f.iteration + 1 > covered_) ks.push_back(static_cast<int>(f.iteration + 1 - covered_));
  if (ks.empty()) return;
  PreserverJudgement j;
  j.iteration = f.iteration;
  j.cycle = batch_cycle(ks);
  const double n = static_cast<double>(window_.size());
  double noise_sq = 0;
  for (const TrainingFeedback& w : window_) {
    j.loss += w.loss / n;
    j.grad_sq += w.grad_sq / n;
    noise_sq += w.noise * w.noise / n;
    j.batch += w.batch / n;
  }
  j.noise = std::sqrt(noise_sq);
  j.lr = window_.back().lr;
  window_.clear();
  LossModel loss;
  loss.s0 = j.loss;
  loss.target = target_;
  loss.lr = j.lr;
  loss.mu = j.grad_sq;
  loss.sigma = j.noise;
  loss.batch = std::max(j.batch, 1.0);
  j.ratio = loss.ratio(j.cycle);
  // IV-C3: on a failed test the Solver reruns with a raised capacity, and the Preserver
  // tests its new schedule, until one passes or ten raises are spent. The new schedules
  // are tested as the dry run predicts them (the executed one is judged again after the
  // next window), with the loss model fed this window's measurements: one raise per
  // window would take the whole run to reach a passing capacity.
  if (!(std::abs(j.ratio - 1.0) <= epsilon_) && retries_ < max_retries_) {
    j.raised = true;
    while (retries_ < max_retries_) {
      scale_ *= 1.0 + capacity_step_;
      ++retries_;
      j.resolved = batch_cycle(deft_dry_run(ctx_, opts_, buckets_, scale_, horizon_));
      j.resolved_ratio = loss.ratio(j.resolved);
      if (std::abs(j.resolved_ratio - 1.0) <= epsilon_) break;
    }
  }
  ratio_ = j.ratio;
  cycle_ = j.cycle;
  judgements_.push_back(std::move(j));
}

std::vector<std::string> DeftPolicy::report() const {
  std::vector<std::string> r;
  Bytes lo = std::numeric_limits<Bytes>::max(), hi = 0;
  for (const Block& b : buckets_) lo = std::min(lo, b.bytes), hi = std::max(hi, b.bytes);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%zu buckets of %s to %s (%d split by III-D); %s, mu %.3g",
                buckets_.size(), format_size(lo).c_str(), format_size(hi).c_str(), split_buckets_,
                two_links_ ? "two links" : "one link", mu_);
  r.emplace_back(buf);
  std::int64_t covered = 0;
  std::string seq;
  for (std::size_t i = 0; i < updates_.size(); ++i) {
    const DeftUpdate& u = updates_[i];
    covered = std::max(covered, u.last + 1);
    if (i < 40) seq += (seq.empty() ? "" : " ") + std::to_string(u.last - u.first + 1) + "B";
  }
  if (updates_.size() > 40) seq += " ...";
  std::snprintf(
      buf, sizeof buf,
      "update frequency %.3f (%zu updates for %lld iterations); effective batch sizes: %s",
      covered > 0 ? static_cast<double>(updates_.size()) / static_cast<double>(covered) : 0.0,
      updates_.size(), static_cast<long long>(covered), seq.c_str());
  r.emplace_back(buf);
  int cases[5] = {0, 0, 0, 0, 0};
  for (const DeftStage& s : stages_) ++cases[s.which_case];
  std::snprintf(
      buf, sizeof buf,
      "stages: case 1 x%d, case 2 x%d, case 3 x%d, case 4 x%d; %d knapsacks, the greedy lost %d "
      "(by %s in total)",
      cases[1], cases[2], cases[3], cases[4], knapsacks_, greedy_losses_,
      format_time(greedy_lost_).c_str());
  r.emplace_back(buf);
  std::string cyc;
  for (int k : cycle_) cyc += (cyc.empty() ? "" : " ") + std::to_string(k) + "B";
  if (feedback_) {
    if (judgements_.empty()) {
      std::snprintf(
          buf, sizeof buf,
          "Preserver (measured training): no judgement yet (every %d iterations); capacity x%.3f",
          horizon_, scale_);
    } else {
      const PreserverJudgement& j = judgements_.back();
      std::snprintf(buf, sizeof buf,
                    "Preserver (measured training): %zu judgements, capacity raised %d times "
                    "(x%.3f); the last, at "
                    "iteration %lld: loss ratio %.4f over the cycle [%s], loss %.4g, |g|^2 %.4g, "
                    "sigma %.4g, lr %.4g, "
                    "batch %.0f",
                    judgements_.size(), retries_, scale_, static_cast<long long>(j.iteration),
                    j.ratio, cyc.c_str(), j.loss, j.grad_sq, j.noise, j.lr, j.batch);
      if (j.raised) {
        std::string res;
        for (int k : j.resolved) res += (res.empty() ? "" : " ") + std::to_string(k) + "B";
        r.emplace_back(buf);
        std::snprintf(
            buf, sizeof buf,
            "  after it the Solver re-solved to the cycle [%s] (dry run), loss ratio %.4f",
            res.c_str(), j.resolved_ratio);
      }
    }
  } else {
    std::snprintf(buf, sizeof buf,
                  "Preserver: loss ratio %.4f over the cycle [%s] after %d retries; capacity x%.3f",
                  ratio_, cyc.c_str(), retries_, scale_);
  }
  r.emplace_back(buf);
  return r;
}

// ---- the Preserver's dry run ----

namespace {

// The links of the dry run: each runs one collective at a time in the order issued (DeFT's
// links are FIFO), T = a + bM on its own cost, as the engine's AllReduceLinks do.
class DryRunLinks final : public CollectiveSink {
 public:
  explicit DryRunLinks(const std::vector<AllReduceCost>& costs)
      : costs_(costs), free_(costs.size(), 0) {}
  void all_reduce(const CollectiveBucket& b, TimeNs delay) override {
    Bytes bytes = 0;
    for (const Chunk& c : b.chunks) bytes += c.length;
    const std::size_t l = static_cast<std::size_t>(b.link);
    free_[l] = std::max(free_[l], now_ + delay) + costs_[l].time(bytes);
    done_.emplace(std::pair{free_[l], seq_++}, b);
  }
  void set_now(TimeNs now) { now_ = now; }
  TimeNs now() const { return now_; }
  bool idle() const { return done_.empty(); }
  // Reports every collective that ends by `t` (in end order) and moves the clock to `t`.
  void run_until(TimeNs t, DeftPolicy& p) {
    while (!done_.empty() && done_.begin()->first.first <= t) complete_next(p);
    now_ = std::max(now_, t);
  }
  // Reports the next collective to end, moving the clock to its end.
  void complete_next(DeftPolicy& p) {
    auto it = done_.begin();
    now_ = std::max(now_, it->first.first);
    const CollectiveBucket b = it->second;
    done_.erase(it);
    p.on_collective_done(b, now_, *this);
  }

 private:
  std::vector<AllReduceCost> costs_;
  std::vector<TimeNs> free_;
  // (end, issue order) -> collective: a strict order, the issue order breaking ties.
  std::map<std::pair<TimeNs, std::uint64_t>, CollectiveBucket> done_;
  std::uint64_t seq_ = 0;
  TimeNs now_ = 0;
};

}  // namespace

std::vector<int> deft_dry_run(const AllReduceContext& ctx, const PolicyOptions& o,
                              const std::vector<Block>& buckets, double capacity_scale,
                              int iterations) {
  DeftPolicy p(ctx, o, buckets, capacity_scale);
  const IterationModel m = IterationModel::from(ctx);
  DryRunLinks links(ctx.links);
  const int layers = ctx.layout->num_layers();
  for (int i = 0; i < iterations; ++i) {
    // The backward waits for the policy's gate (a stage starts once everything issued
    // before the previous stage began is reduced), as TrainingLoop::try_backward.
    while (!p.backward_ready() && !links.idle()) links.complete_next(p);
    const TimeNs start = links.now();
    p.on_iteration_start(i, start, links);
    for (int l = layers - 1; l >= 0; --l) {
      const TimeNs t = start + m.ready[static_cast<std::size_t>(l)];
      links.run_until(t, p);
      p.on_gradient_ready(l, t, links);
    }
    links.run_until(start + m.backward_end, p);
    // The forward stage waits for its gate too (TrainingLoop::try_forward), then runs.
    while (!p.forward_ready(0) && !links.idle()) links.complete_next(p);
    p.on_forward_start(0, links.now(), links);
    links.run_until(links.now() + m.forward_total(), p);
  }
  while (!links.idle()) links.complete_next(p);
  std::vector<int> ks;
  std::int64_t covered = 0;
  for (const DeftUpdate& u : p.updates()) {
    ks.push_back(static_cast<int>(u.last - u.first + 1));
    covered = std::max(covered, u.last + 1);
  }
  // Iterations no update has applied by the horizon are, at the least, one more merged
  // update: a schedule that stops updating must not pass for one that updates rarely.
  if (covered < iterations) ks.push_back(static_cast<int>(iterations - covered));
  return ks;
}

std::vector<int> batch_cycle(const std::vector<int>& ks) {
  // The shortest period p that repeats over the whole second half (the first half is the
  // warm-up): ks[j] == ks[j - p] for every j there. Comparing only the last period with
  // the one before it would judge ... 1 2 2 1 2 2 as [2], a skip fewer than it has.
  const std::size_t n = ks.size();
  for (std::size_t p = 1; 2 * p <= n; ++p) {
    bool periodic = true;
    for (std::size_t j = std::max(p, n - n / 2); j < n && periodic; ++j)
      periodic = ks[j] == ks[j - p];
    if (periodic) return std::vector<int>(ks.end() - static_cast<std::ptrdiff_t>(p), ks.end());
  }
  return std::vector<int>(ks.begin() + static_cast<std::ptrdiff_t>(n / 2), ks.end());
}

Result<std::unique_ptr<AllReducePolicy>> make_deft(const AllReduceContext& ctx,
                                                   const PolicyOptions& o) {
  if (o.deft_partition_size <= 0)
    return invalid_argument("deft: the partition size must be positive");
  if (!(o.deft_mu >= 0)) return invalid_argument("deft: mu must be >= 0 (0 = measured)");
  if (!(o.deft_epsilon > 0 && o.deft_epsilon < 1))
    return invalid_argument("deft: epsilon must be in (0, 1)");
  if (o.deft_max_retries < 0 || o.deft_max_retries > 100)
    return invalid_argument("deft: retries must be in 0..100");
  if (o.deft_exact_max_items < 0 || o.deft_exact_max_items > 20) {
    return invalid_argument("deft: exact knapsack limit must be in 0..20 items");
  }
  if (o.deft_horizon < 2 || o.deft_horizon > 1000)
    return invalid_argument("deft: the horizon must be in 2..1000");
  if (!(o.deft_capacity_step > 0))
    return invalid_argument("deft: the capacity step must be positive");
  if (!(o.deft_capacity_scale > 0 && o.deft_capacity_scale <= 100)) {
    return invalid_argument("deft: the capacity scale must be in (0, 100]");
  }
  int split = 0;
  std::vector<Block> buckets = deft_buckets(ctx, o, &split);
  LossModel loss;
  loss.s0 = o.deft_loss_s0;
  loss.target = o.deft_loss_target;
  loss.lr = o.deft_lr;
  loss.mu = o.deft_loss_mu;
  loss.sigma = o.deft_loss_sigma;
  loss.batch = static_cast<double>(ctx.profile->batch_size) * ctx.workers;
  double scale = o.deft_capacity_scale, ratio = 0.0;
  int retries = 0;
  std::vector<int> cycle;
  // Judged on measured training instead (on_feedback): the Solver's schedule runs first.
  for (int r = 0; !o.deft_loss_feedback; ++r) {
    cycle = batch_cycle(deft_dry_run(ctx, o, buckets, scale, o.deft_horizon));
    ratio = loss.ratio(cycle);
    if (std::abs(ratio - 1.0) <= o.deft_epsilon || r == o.deft_max_retries) break;
    scale *= 1.0 + o.deft_capacity_step;  // IV-C3: raise the capacity and solve again
    retries = r + 1;
  }
  auto p = std::make_unique<DeftPolicy>(ctx, o, std::move(buckets), scale);
  p->set_preserver(retries, ratio, std::move(cycle));
  p->split_buckets_ = split;
  return std::unique_ptr<AllReducePolicy>(std::move(p));
}

Status register_deft(PolicyRegistry& r) {
  auto knob = [](const char* name, const char* flag, KnobType type, const char* help, auto field,
                 bool (*accepts)(double) = nullptr, const char* requirement = "") {
    return Knob{.name = name,
                .flag = flag,
                .type = type,
                .help = help,
                .field = knob_field(field),
                .accepts = accepts,
                .requirement = requirement};
  };
  std::vector<Knob> knobs = {
      knob("deft_mu", "--deft-mu", KnobType::kDouble, "speed ratio of the two links",
           &DeftOptions::deft_mu, knob_positive, "must be positive"),
      knob(
          "deft_epsilon", "--deft-epsilon", KnobType::kDouble, "Preserver epsilon",
          &DeftOptions::deft_epsilon, [](double v) { return v > 0 && v < 1; }, "must be in (0, 1)"),
      knob("deft_partition_size", "--deft-partition-size", KnobType::kBytes,
           "bucket partition size (III-D)", &DeftOptions::deft_partition_size),
      knob(
          "deft_exact_max_items", "--deft-exact-items", KnobType::kInt,
          "also solve knapsacks of at most this many buckets exactly (0: the paper's greedy only)",
          &DeftOptions::deft_exact_max_items, [](double v) { return v >= 0 && v <= 20; },
          "must be in 0..20"),
      knob(
          "deft_max_retries", "--deft-max-retries", KnobType::kInt,
          "Preserver: capacity raises at most (0: the Preserver off)",
          &DeftOptions::deft_max_retries, [](double v) { return v >= 0 && v <= 100; },
          "must be in 0..100"),
      knob("deft_capacity_step", "--deft-capacity-step", KnobType::kDouble,
           "Preserver: each retry multiplies the knapsack capacities by 1 + this",
           &DeftOptions::deft_capacity_step, knob_positive, "must be positive"),
      knob(
          "deft_capacity_scale", "--deft-capacity-scale", KnobType::kDouble,
          "every knapsack capacity starts multiplied by this (the Preserver raises it)",
          &DeftOptions::deft_capacity_scale, [](double v) { return v > 0 && v <= 100; },
          "must be in (0, 100]"),
      knob(
          "deft_horizon", "--deft-horizon", KnobType::kInt,
          "Preserver: iterations of the dry run (measured training: between judgements)",
          &DeftOptions::deft_horizon, [](double v) { return v >= 2 && v <= 1000; },
          "must be in 2..1000"),
      knob("deft_loss_s0", "--deft-loss-s0", KnobType::kDouble,
           "Preserver loss model: start state s_A", &DeftOptions::deft_loss_s0),
      knob("deft_loss_target", "--deft-loss-target", KnobType::kDouble,
           "Preserver loss model: objective S*", &DeftOptions::deft_loss_target),
      knob("deft_lr", "--deft-lr", KnobType::kDouble, "Preserver loss model: learning rate eta",
           &DeftOptions::deft_lr),
      knob("deft_loss_mu", "--deft-loss-mu", KnobType::kDouble,
           "Preserver loss model: per-sample gradient mean", &DeftOptions::deft_loss_mu),
      knob("deft_loss_sigma", "--deft-loss-sigma", KnobType::kDouble,
           "Preserver loss model: per-sample gradient deviation", &DeftOptions::deft_loss_sigma),
      knob("deft_loss_feedback", "--deft-loss-feedback", KnobType::kBool,
           "Preserver: judge the executed schedule every horizon with the loss, gradient and lr "
           "that real training "
           "measures (PyTorch sets it)",
           &DeftOptions::deft_loss_feedback),
  };
  // The partitions and buckets are byte sizes of the model's tensors.
  knobs[2].scales = true;
  knobs[2].cuts = true;
  std::vector<std::string> names;
  for (const Knob& k : knobs) names.push_back(k.name);
  return r.add(std::move(knobs),
               {{.name = "deft",
                 .architecture = Architecture::kAllReduce,
                 .summary = "delayed updates: two knapsacks per stage over two links",
                 .knobs = std::move(names),
                 .rank = 80,
                 .delays_updates = true,
                 .make_allreduce = [](const PolicyOptions& o, const AllReduceContext& ctx) {
                   return make_deft(ctx, o);
                 }}});
}

}  // namespace qs
