// The tensors a runtime worker moves: its caller's buffers, not the worker's own.
//
// A TensorSource registers one TensorBuffer per tensor of the job's profile (where the
// gradient is read from, where its sum is pulled into) and hears, per layer, when the
// gradients are about to be produced and when the sums are back. `quicksilver run` and the
// tests use KnownContent (synthetic gradients whose sums are checked exactly); the PyTorch
// integration registers the model's own .grad and parameter storage.
//
// Thread safety: every call comes from the worker's loop thread.
#pragma once

#include <cstdint>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/layout.h"

namespace qs::runtime {

struct TensorBuffer {
  TensorId id = 0;                    // the profile's tensor id (forward order)
  const float* gradient = nullptr;    // this worker's gradient: read while it is pushed
  float* sum = nullptr;               // the pulled sum lands here (may equal gradient)
  std::int64_t elements = 0;          // must equal the profile's element count
  // Smaller is more urgent. The policies take priorities from the profile's order, so the
  // registry must list tensors with strictly increasing priority by id (the forward order
  // in which a model uses its parameters); the default is the id itself.
  int priority = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The registry, one entry per tensor of the profile. Called once, before training; the
  // pointers must stay valid until the worker's run() returns.
  virtual std::vector<TensorBuffer> tensors() = 0;
  // The backward of `layer` in `iteration` starts: its gradients must be in place when it
  // ends. An emulated GPU calls this; a real backward writes the gradients itself.
  virtual void on_backward(int layer, std::int64_t iteration) { (void)layer, (void)iteration; }
  // Every sum of `layer`'s tensors for `iteration` is in its `sum` buffers: the layer's
  // parameters may be updated now. An error stops the worker with it.
  virtual Status on_layer_ready(int layer, std::int64_t iteration) {
    (void)layer, (void)iteration;
    return Status::ok();
  }
};

// Checks a registry against the profile: one entry per tensor, in id order, non-null
// buffers, element counts as profiled, priorities strictly increasing.
Status check_registry(const std::vector<TensorBuffer>& tensors, const TensorLayout& layout);

// Synthetic gradients with known content, owned here: value(w, it, t, i) =
// ((7w + 3it + 5t) & 255) + (i & 255), small integers whose float32 sums over up to 2^15
// workers are exact. With `verify`, every pulled element is checked against the exact sum
// and the first wrong one is named.
class KnownContent final : public TensorSource {
 public:
  KnownContent(const Profile& profile, int worker, int workers, bool verify);
  std::vector<TensorBuffer> tensors() override;
  void on_backward(int layer, std::int64_t iteration) override;
  Status on_layer_ready(int layer, std::int64_t iteration) override;
  // Iterations whose every element was checked (0 without verify).
  int iterations_verified() const;

 private:
  TensorLayout layout_;
  int worker_, workers_;
  bool verify_;
  std::vector<std::size_t> base_;  // by tensor: its first float in the buffers
  std::vector<float> gradients_, sums_;
  std::int64_t layers_checked_ = 0;
};

}  // namespace qs::runtime
