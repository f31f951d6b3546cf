// Delayed updates for a real model under DeFT: which sums update which layer when
// (DelayedUpdateTarget::on_update_ready, on_updates), over any engine.
//
// Fed worker 0's policy inputs in worker 0's order (its own RecordingPolicy, or the
// replica applying them, each input before the policy acts on it), so every worker hands
// over the same updates at the same points. A layer's update over iterations
// [first, last] is due before the forward pass after `last` when every byte of it was
// issued during that backward pass (the iteration's update is not delayed: DeFT's Fig. 9
// first batch; the layer's forward waits for its sums, as WFBP's); otherwise before the
// first forward pass that worker 0 began after every sum of it was reduced; after
// training, at once. A worker never waits for more than worker 0 had (its replica applies
// a completion only once it completed that collective itself).
#pragma once

#include <functional>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "policy_replica.h"
#include "quicksilver/runtime/tensors.h"

namespace qs::runtime {

class DelayedUpdates {
 public:
  // `fail`: the source refused an update (loop thread).
  DelayedUpdates(const TensorLayout& layout, DelayedUpdateTarget& target,
                 std::function<void(const Status&)> fail)
      : layout_(layout), target_(target), fail_(std::move(fail)) {}
  // Loop thread: this worker issued `b`.
  void issued(const CollectiveBucket& b);
  // Loop thread: worker 0's input `r`, in worker 0's order.
  void track(const PolicyRecord& r);

 private:
  struct Progress {
    std::vector<Bytes> issued, reduced;  // per layer
    std::vector<char> handed;            // per layer: handed over before its sums were in
    int layers_reduced = 0;
  };
  using Range = std::pair<std::int64_t, std::int64_t>;
  Progress& progress_of(Range range);
  void hand_over(std::int64_t before);

  const TensorLayout& layout_;
  DelayedUpdateTarget& target_;
  std::function<void(const Status&)> fail_;
  std::unordered_map<std::uint64_t, CollectiveBucket> buckets_;  // issued, by id
  std::map<Range, Progress> progress_;                           // by range
  std::vector<LayerUpdate> due_;                                 // complete, not yet handed over
  bool training_over_ = false;
};

}  // namespace qs::runtime
