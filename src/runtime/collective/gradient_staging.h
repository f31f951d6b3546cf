// DeFT's staging in the all-reduce runtime, over any engine. Under delayed updates a
// bucket of iteration i may run after the backward of i + 1 rewrote the gradients, and
// carries the sum over a range of iterations first..last. So when a layer's backward ends
// its gradients are added to the running sum of their range (the policy's merged_from:
// decided when the iteration started), which the link threads read when they reduce its
// buckets; the sum's buffer goes back to a pool once every byte of the range was read. A
// replica may not know the range of an iteration yet when its backward ends (it applies
// worker 0's inputs as it reaches them): that iteration is copied aside and added to its
// range as soon as it is known, at the latest when a bucket carrying it is issued. So the
// staging holds a few buffers of the model's gradients' size (a range being summed, one
// whose buckets are still queued, an iteration aside, one spare), however many
// iterations DeFT merges and however long the run; the sums are those of adding the
// iterations in order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "quicksilver/core/mutex.h"
#include "quicksilver/engine/compute.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/tensors.h"

namespace qs::runtime {

class GradientStaging {
 public:
  // `merged_from`: the policy's (AllReducePolicy::merged_from), -1 while unknown.
  GradientStaging(const TensorLayout& layout, const std::vector<TensorBuffer>& buffers,
                  std::function<std::int64_t(std::int64_t)> merged_from);
  // Loop thread: the backward of `layer` in iteration `it` ended.
  void snapshot(int layer, std::int64_t it);
  // Loop thread: the iterations set aside whose range is known now join it, in order.
  void settle();
  // Link thread: `c`'s elements of the sum over b's range, to `out`. Throws when none is
  // staged.
  void read(const CollectiveBucket& b, const Chunk& c, float* out);
  // Link thread: every chunk of `b` was read; a range's buffer is freed once every byte of
  // the range was.
  void consumed(const CollectiveBucket& b);
  // The buffers allocated at most (the report).
  std::int64_t buffers_max() const;

 private:
  using Buffer = std::unique_ptr<float[]>;  // the model's gradients' size
  struct Range {
    Buffer sums;
    Bytes read = 0;
  };
  struct Aside {  // an iteration whose range is not known yet: the layers whose backward ended
    Buffer gradients;
    std::vector<char> layers;
  };
  Buffer take() QS_EXCLUDES(mu_);
  void give_back_locked(Buffer b) QS_REQUIRES(mu_);
  float* range_sum(std::int64_t first);
  void add_layer(float* to, const float* from, int layer, std::int64_t it, std::int64_t first);

  const TensorLayout& layout_;
  const std::vector<TensorBuffer>& buffers_;
  std::function<std::int64_t(std::int64_t)> merged_from_;
  std::vector<std::size_t> bases_;       // each tensor's first element in a buffer
  std::map<std::int64_t, Aside> aside_;  // loop thread only
  mutable Mutex mu_;                     // the link threads read the ranges
  std::map<std::int64_t, Range> ranges_ QS_GUARDED_BY(mu_);  // by first iteration
  std::vector<Buffer> spare_ QS_GUARDED_BY(mu_);
  std::int64_t allocated_ QS_GUARDED_BY(mu_) = 0;
  std::int64_t allocated_max_ QS_GUARDED_BY(mu_) = 0;
};

// A Compute whose backward steps snapshot their layer into the staging when they end.
class StagingCompute final : public Compute {
 public:
  StagingCompute(GradientStaging& staging, Compute& inner) : staging_(staging), inner_(inner) {}
  void run(const ComputeStep& step, TimeNs earliest, Done done) override;

 private:
  GradientStaging& staging_;
  Compute& inner_;
};

}  // namespace qs::runtime
