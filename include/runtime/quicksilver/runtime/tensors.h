// The tensors a runtime worker moves: its caller's buffers, not the worker's own.
//
// A TensorSource registers one TensorBuffer per tensor of the job's profile (where the
// gradient is read from, where its sum is pulled into) and hears, per layer, when the
// gradients are about to be produced and when the sums are back. `quicksilver run` and the
// tests use KnownContent (synthetic gradients whose sums are checked exactly); the PyTorch
// integration registers the model's own .grad and parameter storage.
//
// Thread safety: every call comes from the worker's loop thread, except merged_sum (the
// all-reduce worker's link threads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

// Where a model keeps a tensor, and what its elements are.
enum class MemorySpace : std::uint8_t { kHost, kDevice };
enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16 };
const char* memory_space_name(MemorySpace m);
const char* dtype_name(DType d);
int dtype_size(DType d);  // bytes per element
// "cpu"/"host" -> kHost, "cuda"/"device" -> kDevice; "float32", "bfloat16", "float16".
Result<MemorySpace> parse_memory_space(const std::string& text);
Result<DType> parse_dtype(const std::string& text);

// One tensor of the registry. The transport reads gradients from, and writes sums into,
// host float32 memory: `gradient`/`sum` always point there. The model's own tensor is
// described by `space` and `dtype`:
// - in place (host float32, not `staged`): gradient/sum are the model's own storage (its
//   .grad): no copy, the fast path;
// - staged (any other tensor, or on request): gradient/sum are a host float32 staging
//   buffer of the same element count, and the source's Staging component (for PyTorch,
//   python/quicksilver/staging.py) keeps the one contract: it fills the buffer before it
//   reports the gradient (gradient_ready / on_backward's end), and copies the sum back out
//   only after the transport said it is in (sum_ready / on_layer_ready); between the two
//   the buffer is the transport's. The transport itself does not copy.
// The dtype on the wire is the job's (JobOptions::wire_dtype: float32, bf16 or fp16; see
// transport/wire.h), independent of `dtype`: sums are float32 whatever the model's dtype.
struct TensorBuffer {
  TensorId id = 0;                  // the profile's tensor id (forward order)
  const float* gradient = nullptr;  // this worker's gradient: read while it is pushed
  float* sum = nullptr;             // the pulled sum lands here (may equal gradient)
  std::int64_t elements = 0;        // must equal the profile's element count
  // Smaller is more urgent. The policies take priorities from the profile's order, so the
  // registry must list tensors with strictly increasing priority by id (the forward order
  // in which a model uses its parameters); the default is the id itself.
  int priority = 0;
  MemorySpace space = MemorySpace::kHost;  // the model's tensor
  DType dtype = DType::kFloat32;
  bool staged = false;  // gradient/sum are a staging buffer, not the model's storage
};

// A delayed update (a policy whose PolicySpec::delays_updates, DeFT): `layer`'s parameters
// are updated once with the sums over iterations first..last, i.e. one step with batch
// size (last - first + 1) * B (DeFT IV-C1).
struct LayerUpdate {
  int layer = 0;
  std::int64_t first = 0, last = 0;
  // Its sums are all reduced. An update of the iteration just computed is due before the
  // next forward pass as soon as all of it was issued in the backward pass (DeFT's "updated
  // immediately after the iteration", Fig. 9), while its sums may still be on the way:
  // on_update_ready follows, and the layer's forward must wait for it.
  bool ready = true;
};
// LayerUpdate's `before` when training has ended: applied after the last iteration.
inline constexpr std::int64_t kAfterTraining = INT64_MAX;

// What a model that applies delayed updates itself offers the runtime: the one interface
// a delayed-update policy (PolicySpec::delays_updates: DeFT today) needs of it, and the
// only one. The all-reduce worker scatters the sums of tensor t over iterations
// first..last into merged_sum's buffer (instead of TensorBuffer::sum: a sum over several
// iterations may land while the model is already computing the next), and hands the
// updates over at points every worker agrees on (worker 0's: their parameters stay equal).
class DelayedUpdateTarget {
 public:
  virtual ~DelayedUpdateTarget() = default;
  // A buffer of tensor t's element count for its sums over first..last, valid until its
  // update was handed over (on_updates) and used. Called from the worker's link threads.
  virtual float* merged_sum(TensorId t, std::int64_t first, std::int64_t last) = 0;
  // `due` (possibly empty) must be applied before the forward pass that follows the
  // backward pass number `before` (1 = the first), i.e. before the forward whose gate has
  // opened for `before` backward passes; kAfterTraining: after the last iteration. Calls
  // come in increasing `before`; an update is all reduced when handed over, unless it says
  // it is not (LayerUpdate::ready).
  virtual Status on_updates(std::int64_t before, const std::vector<LayerUpdate>& due) = 0;
  // An update handed over not ready is now: its sums are in merged_sum's buffers.
  virtual Status on_update_ready(const LayerUpdate& u) = 0;
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
  // A source that applies delayed updates itself (a real model): its target; null (the
  // default): the sums go to TensorBuffer::sum, and the worker's known-content checks or
  // the caller apply them.
  virtual DelayedUpdateTarget* delayed_updates() { return nullptr; }
};

// Checks a registry against the profile: one entry per tensor, in id order, non-null
// buffers, element counts as profiled, priorities strictly increasing, and every tensor
// that is not host float32 staged.
Status check_registry(const std::vector<TensorBuffer>& tensors, const TensorLayout& layout);

// Synthetic gradients with known content, owned here: value(w, it, t, i) =
// ((7w + 3it + 5t) & 255) + (i & 255), small integers whose float32 sums over up to 2^15
// workers are exact. With `verify`, every pulled element is checked against the exact sum
// and the first wrong one is named.
class KnownContent final : public TensorSource {
 public:
  // `wire`: the job's wire dtype; compressed sums are checked as rounded the same way.
  KnownContent(const Profile& profile, int worker, int workers, bool verify,
               transport::WireDType wire = transport::WireDType::kFloat32);
  std::vector<TensorBuffer> tensors() override;
  void on_backward(int layer, std::int64_t iteration) override;
  Status on_layer_ready(int layer, std::int64_t iteration) override;
  // Iterations whose every element was checked (0 without verify).
  int iterations_verified() const;

 private:
  TensorLayout layout_;
  int worker_, workers_;
  bool verify_;
  transport::WireDType wire_;
  std::vector<std::size_t> base_;  // by tensor: its first float in the buffers
  std::vector<float> gradients_, sums_;
  std::int64_t layers_checked_ = 0;
};

}  // namespace qs::runtime
