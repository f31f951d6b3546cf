// One link's data path in the all-reduce runtime, over any engine: a bucket's gradients
// gathered (from the registry, or DeFT's staged sums), reduced across the workers on the
// link, scattered into the sum buffers, and, for known content, every element checked.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "gradient_staging.h"
#include "quicksilver/core/status.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/communicator.h"
#include "quicksilver/runtime/tensors.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

class BucketReducer {
 public:
  struct Settings {
    int links = 1;
    int workers = 1;
    transport::WireDType wire = transport::WireDType::kFloat32;
    bool checksums = true;
    // Known content: every reduced element checked exactly (runtime_internal.h).
    bool check = false;
    // The sums written back: not for staged known content, whose sums nobody reads (and
    // two buckets of one chunk may run at once on DeFT's two links).
    bool scatter = true;
    // CollectiveOptions::tamper_received.
    std::function<void(int link, int from, std::byte* data, std::size_t bytes)> tamper;
  };
  // `staging`: DeFT's (null: the registry's gradients are read in place). `delayed`: where
  // delayed updates' sums go (null: TensorBuffer::sum). `fail`: the root cause of a
  // collective's failure, as soon as it is known (any thread).
  BucketReducer(Settings s, Communicator& comm, const std::vector<TensorBuffer>& buffers,
                GradientStaging* staging, DelayedUpdateTarget* delayed,
                std::function<void(const Status&)> fail);
  // Link thread: runs `b` on `link`; its start and end in `t0`, `t1`. False when a sum was
  // wrong (told to `fail`); throws when the engine fails, naming the bucket.
  bool run(int link, const CollectiveBucket& b, TimeNs* t0, TimeNs* t1);

 private:
  struct Scratch {
    std::vector<float> data;      // the bucket being reduced
    std::vector<std::byte> wire;  // compression: the same in the wire's dtype
  };
  void reduce(int link, const CollectiveBucket& b, float* data, std::size_t count);
  bool check(const CollectiveBucket& b, const float* reduced);

  const Settings s_;
  Communicator& comm_;
  const std::vector<TensorBuffer>& buffers_;
  GradientStaging* staging_;
  DelayedUpdateTarget* delayed_;
  std::function<void(const Status&)> fail_;
  std::vector<Scratch> scratch_;  // per link, its thread's only
};

// "bucket #3 (iteration 2..3, 4 chunks, 1.2 MiB, link 1)"
std::string describe(const CollectiveBucket& b);

}  // namespace qs::runtime
