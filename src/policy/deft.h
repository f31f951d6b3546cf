// Private: DeFT (Meng & Sun, 2024), exposed for the tests and the benchmarks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "allreduce_plans.h"
#include "quicksilver/policy/allreduce_policy.h"

namespace qs {

// One stage decision of section III-B.
struct DeftStage {
  std::int64_t iteration = 0;
  bool forward = false;       // the forward stage (Case 1) or the backward stage (Cases 2-4)
  int which_case = 0;         // 1..4
  int issued_old = 0;         // buckets of the current task queue issued in this stage
  int issued_new = 0;         // buckets of this iteration (possibly merged) selected
  int current_after = 0;      // unissued buckets left in the current task queue
  bool future_after = false;  // the future task queue holds iterations after the stage
};

// A parameter update: the gradients of iterations first..last applied together, i.e. one
// step with batch size (last - first + 1) * B (IV-C1).
struct DeftUpdate {
  std::int64_t first = 0, last = 0;
  TimeNs time = 0;
};

class DeftPolicy final : public AllReducePolicy {
 public:
  // Buckets: the partition of III-D (built by make_deft, or given by a test in backward
  // order). `capacity_scale` multiplies every knapsack capacity (the Preserver's retries).
  DeftPolicy(const AllReduceContext& ctx, const PolicyOptions& o, std::vector<Block> buckets,
             double capacity_scale);

  std::string_view name() const override { return "deft"; }
  ForwardGate forward_gate() const override { return ForwardGate::kPolicy; }
  void on_iteration_start(std::int64_t iteration, TimeNs now, CollectiveSink& out) override;
  void on_gradient_ready(int layer, TimeNs now, CollectiveSink& out) override;
  void on_forward_start(int layer, TimeNs now, CollectiveSink& out) override;
  void on_collective_done(const CollectiveBucket& b, TimeNs now, CollectiveSink& out) override;
  bool forward_ready(int layer) const override;
  bool backward_ready() const override;
  std::int64_t merged_from(std::int64_t iteration) const override;
  void on_training_end(TimeNs now, CollectiveSink& out) override;
  // With deft_loss_feedback: every deft_horizon iterations of measurements, the
  // Preserver's judgement of the updates executed meanwhile (PreserverJudgement).
  void on_feedback(const TrainingFeedback& f, TimeNs now, CollectiveSink& out) override;
  std::vector<std::string> report() const override;

  const std::vector<DeftStage>& stages() const { return stages_; }
  const std::vector<DeftUpdate>& updates() const { return updates_; }
  const std::vector<Block>& buckets() const { return buckets_; }
  int greedy_losses() const { return greedy_losses_; }
  int knapsacks_solved() const { return knapsacks_; }
  double mu() const { return mu_; }
  // The Preserver's outcome: E_OB / E_OD over the cycle it judged, the capacity raises it
  // took and the capacity multiplier the policy runs with.
  double preserver_ratio() const { return ratio_; }
  int preserver_retries() const { return retries_; }
  double capacity_scale() const { return scale_; }
  const std::vector<int>& preserver_cycle() const { return cycle_; }
  // The Preserver's judgements of measured training (deft_loss_feedback), in order.
  struct PreserverJudgement {
    std::int64_t iteration = 0;  // the last measured iteration it judged
    std::vector<int> cycle;      // the executed schedule's batch multiples
    double loss = 0, grad_sq = 0, noise = 0, lr = 0, batch = 0;  // window means (lr: last)
    double ratio = 1.0;                                          // E_OB / E_OD
    bool raised = false;  // the capacities were raised after it
    // When raised: the last re-solved schedule the Preserver tested (the dry run's cycle
    // at the final capacity) and its ratio.
    std::vector<int> resolved;
    double resolved_ratio = 1.0;
  };
  const std::vector<PreserverJudgement>& judgements() const { return judgements_; }
  // Set by make_deft: the Preserver's outcome, for the report.
  void set_preserver(int retries, double ratio, std::vector<int> cycle) {
    retries_ = retries, ratio_ = ratio, cycle_ = std::move(cycle);
  }

  // Algorithm 1 (RecursiveKnapsack) over items in backward order (first ready first);
  // step[i] is the computation between item i-1's and item i's readiness (T_{N-1} for
  // i = 1). Capacities in link-0 time; cap1 < 0: one link.
  KnapsackSolution recursive_knapsack(const std::vector<KnapsackItem>& items,
                                      const std::vector<TimeNs>& step, TimeNs cap0, TimeNs cap1,
                                      std::size_t from = 0);
  // NaiveKnapsack: the exact solution where the instance is small (recording whether the
  // paper's greedy would have lost), the greedy otherwise.
  KnapsackSolution naive_knapsack(const std::vector<KnapsackItem>& items, TimeNs cap0, TimeNs cap1);

 private:
  struct Item {
    int bucket = 0;
    std::int64_t first = 0, last = 0;
    bool issued = false;
  };
  struct InFlight {
    std::int64_t first = 0, last = 0;
    std::int64_t stage = 0;
    int link = 0;
  };

  TimeNs comm(int bucket) const { return comm_[static_cast<std::size_t>(bucket)]; }
  void issue(const Item& it, int link, TimeNs now, CollectiveSink& out);
  // The link whose queued work ends first (link 0 on ties).
  int emptiest_link() const;
  // No old bucket fits even an idle backward stage: the knapsack takes the shortest once
  // enough iterations merged behind it (deft.cc).
  void take_one_if_none_fits(KnapsackSolution& sol, const std::vector<KnapsackItem>& items,
                             std::int64_t iteration) const;
  // Capacities (link-0 units) of a stage of `compute` ns, less each link's backlog.
  std::pair<TimeNs, TimeNs> capacities(TimeNs compute, TimeNs now) const;
  void open_range(std::int64_t first, std::int64_t last);

  AllReduceContext ctx_;
  PolicyOptions opts_;  // the dry runs of the Preserver's re-solves (on_feedback)
  std::vector<Block> buckets_;
  std::vector<TimeNs> comm_;   // per bucket: T_ar on link 0
  std::vector<TimeNs> ready_;  // per bucket: gradient ready after the backward start
  std::vector<TimeNs> step_;   // per bucket: computation since the previous bucket
  TimeNs backward_total_ = 0, forward_total_ = 0;
  double mu_ = 1.65;
  bool two_links_ = false;
  double scale_ = 1.0;
  int exact_max_ = 12;
  std::vector<AllReduceCost> link_cost_;

  std::vector<Item> current_;                        // the current task queue
  bool future_ = false;                              // the future task queue: every bucket of
  std::int64_t future_first_ = 0, future_last_ = 0;  // iterations first..last
  std::vector<std::pair<Item, int>> selected_new_;   // (item, link) issued when ready
  std::map<std::pair<std::int64_t, std::int64_t>, int> open_;  // range -> buckets not yet reduced
  std::map<std::uint64_t, InFlight> in_flight_;
  std::map<std::int64_t, int> in_flight_per_stage_;
  std::vector<TimeNs> link_free_;  // estimated end of each link's queued work
  std::vector<int> link_busy_;     // collectives in flight per link
  std::int64_t stage_ = 0;         // increments at every stage start
  std::int64_t iteration_ = 0;
  std::int64_t merged_from_ = 0;  // iteration_'s range starts here (merged_from)
  std::uint64_t next_id_ = 0;

  std::vector<DeftStage> stages_;
  std::vector<DeftUpdate> updates_;
  int greedy_losses_ = 0, knapsacks_ = 0;
  TimeNs greedy_lost_ = 0;
  int retries_ = 0;
  double ratio_ = 1.0;
  std::vector<int> cycle_;
  int split_buckets_ = 0;
  // deft_loss_feedback: the measurements since the last judgement, and where it stood.
  bool feedback_ = false;
  double epsilon_ = 0.01, capacity_step_ = 0.1, target_ = 0.0;
  int max_retries_ = 10, horizon_ = 16;
  std::vector<TrainingFeedback> window_;
  std::size_t judged_updates_ = 0;  // updates_ before this index were judged already
  std::int64_t covered_ = 0;        // iterations the judged updates applied
  std::vector<PreserverJudgement> judgements_;
  friend Result<std::unique_ptr<AllReducePolicy>> make_deft(const AllReduceContext&,
                                                            const PolicyOptions&);
};

// The batch-size multiples of DeFT's updates over `iterations` iterations of a dry run on
// the model: the compute chain from the profile (scaled by ctx.compute_factor), each link
// one collective at a time at its a + bM (ctx.links), the policy's stage gates; the
// schedule the all-reduce engine executes on a constant bandwidth, up to the order of
// events at equal times.
std::vector<int> deft_dry_run(const AllReduceContext& ctx, const PolicyOptions& o,
                              const std::vector<Block>& buckets, double capacity_scale,
                              int iterations);
// The shortest cycle that repeats over the second half of `ks` (its second half if none
// does).
std::vector<int> batch_cycle(const std::vector<int>& ks);
// III-D: DeFT's buckets for this job (partition, US-Byte re-partition, capacity constraint).
std::vector<Block> deft_buckets(const AllReduceContext& ctx, const PolicyOptions& o, int* split);

}  // namespace qs
