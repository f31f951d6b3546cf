// Private: the planning algorithms behind the all-reduce policies, exposed for the tests
// and the benchmarks. Pure functions of a model of the job (no engine, no clock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/policy/allreduce_policy.h"

namespace qs {

// ---------------------------------------------------------------------------------------
// MG-WFBP (mgwfbp.cc)

// The merge problem of MG-WFBP section III in the paper's terms: learnable layers 1..L;
// entry i of each vector is layer i+1.
struct MergeProblem {
  std::vector<TimeNs> tb;    // t_b^(l): backward time of layer l
  std::vector<Bytes> bytes;  // p^(l) in bytes
  AllReduceCost cost;        // T_ar (eq. 9)
  TimeNs tf = 0;             // t_f: the time the backward of layer L starts (eq. 6)

  int layers() const { return static_cast<int>(tb.size()); }
  // mu_b^(l) = tau_b^(l) + t_b^(l): when layer l's gradient is ready (eq. 6). 1-based.
  TimeNs ready(int l) const;
};

// merged[i] true: layer i+1 is a merged-gradient layer (Definition 1), its gradients go
// with layer i's. merged[0] (layer 1) is always false.
using MergeSet = std::vector<bool>;

// When the last all-reduce ends under `merged` (eq. 20-21 with Conditions 14-16: a group of
// layers is reduced once its lowest layer's gradient is ready and the link is free).
TimeNs merge_finish_time(const MergeProblem& p, const MergeSet& merged);
// The paper's Algorithm 1, as printed (see mgwfbp.cc for the two index gaps it leaves).
MergeSet mgwfbp_algorithm1(const MergeProblem& p);
// The exact optimum of eq. 23 over all 2^(L-1) merge sets, by dynamic programming over the
// lowest layer of the last group: O(L^2).
MergeSet optimal_merge(const MergeProblem& p);
// Brute force over every merge set (tests). Precondition: 1 <= L <= 24.
MergeSet exhaustive_merge(const MergeProblem& p);

// ---------------------------------------------------------------------------------------
// Shared timing model of one iteration on one link (usbyte.cc), used by US-Byte's planner
// and DeFT's partitioner.

// A block: byte ranges of one or more tensors reduced by one collective.
struct Block {
  std::vector<Chunk> chunks;  // in backward order
  Bytes bytes = 0;
  int layer = 0;  // lowest profile layer among its chunks: last ready, first needed
};

struct IterationModel {
  std::vector<TimeNs> ready;     // per profile layer: gradient ready, from backward start
  std::vector<TimeNs> forward;   // per profile layer: update + forward
  std::vector<TimeNs> backward;  // per profile layer
  TimeNs backward_end = 0;
  AllReduceCost cost;

  static IterationModel from(const AllReduceContext& ctx);
  TimeNs forward_total() const;
};

// Cuts every tensor, in backward order, into pieces of at most `partition` bytes and fuses
// consecutive pieces while the fused block stays within `partition` (ByteScheduler's cut
// with fusion of small tensors).
std::vector<Block> cut_blocks(const TensorLayout& layout, Bytes partition);
// Fuses blocks a and b (a before b in backward order).
Block fuse(const Block& a, const Block& b);
// When the next forward pass ends if `blocks` are reduced one at a time, each time taking
// the first block of `order` whose gradient is ready (waiting for the earliest when none
// is), and layer l's forward waits for its bytes (per-layer gate).
TimeNs predict_forward_end(const IterationModel& m, const std::vector<Block>& blocks,
                           const std::vector<int>& order, const TensorLayout& layout);
// Blocks by urgency: lowest layer first, then backward position.
std::vector<int> priority_order(const std::vector<Block>& blocks);

// US-Byte's plan: unequal-sized blocks and a non-sequential order.
struct UsBytePlan {
  std::vector<Block> blocks;
  std::vector<int> order;
};
UsBytePlan plan_usbyte(const IterationModel& m, const TensorLayout& layout, Bytes partition);

// ---------------------------------------------------------------------------------------
// DeFT (deft.cc)

// A knapsack item: its index and its communication time on link 0 (its weight and its
// profit).
struct KnapsackItem {
  int id = 0;
  TimeNs time = 0;
};
// An assignment: link (0 or 1) per selected item, in the order of the input list.
struct KnapsackSolution {
  std::vector<int> ids;
  std::vector<int> links;
  TimeNs total = 0;  // sum of the selected items' times (link-0 units)
};
// Problem 2 (III-C): two knapsacks with capacities cap[0] and cap[1] (link-0 time units;
// cap[1] < 0 means one knapsack). The paper's greedy: knapsacks by ascending capacity,
// items by descending time, an item goes into the first knapsack it fits.
KnapsackSolution greedy_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0, TimeNs cap1);
// The exact optimum by depth-first search with bounds. Precondition: items.size() <= 24.
KnapsackSolution exact_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0, TimeNs cap1);

// The expected loss E_B^{s}(s') of one update (IV-C2) for `k` merged batches of B samples.
struct LossModel {
  double s0 = 0.2103, target = 0.0, lr = 0.01, mu = 0.144, sigma = 40.0;
  double batch = 256;
  double step(double s, int k) const;
  // E after updates with batch multiples `ks`, from s0.
  double after(const std::vector<int>& ks) const;
  // E_{O_B} / E_{O_D} for O_D = ks over N = sum(ks) iterations (IV-C2's ratio).
  double ratio(const std::vector<int>& ks) const;
};

}  // namespace qs
