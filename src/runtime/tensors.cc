#include "quicksilver/runtime/tensors.h"

#include "runtime_internal.h"

namespace qs::runtime {

const char* memory_space_name(MemorySpace m) { return m == MemorySpace::kHost ? "host" : "device"; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "?";
}

int dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

Result<MemorySpace> parse_memory_space(const std::string& text) {
  if (text == "cpu" || text == "host") return MemorySpace::kHost;
  if (text == "cuda" || text == "device") return MemorySpace::kDevice;
  return invalid_argument("memory space '" + text + "': give cpu (host) or cuda (device)");
}

Result<DType> parse_dtype(const std::string& text) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (text == dtype_name(d)) return d;
  }
  return invalid_argument("dtype '" + text + "': give float32, bfloat16 or float16");
}

Status check_registry(const std::vector<TensorBuffer>& tensors, const TensorLayout& layout) {
  if (static_cast<int>(tensors.size()) != layout.num_tensors()) {
    return invalid_argument("the tensor registry has " + std::to_string(tensors.size()) +
                            " tensors, the profile " + std::to_string(layout.num_tensors()));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorBuffer& b = tensors[i];
    const TensorInfo& t = layout.tensor(static_cast<TensorId>(i));
    const std::string what = "tensor registry entry " + std::to_string(i);
    if (b.id != t.id)
      return invalid_argument(what + " has id " + std::to_string(b.id) +
                              " (entries go in id order)");
    if (b.gradient == nullptr || b.sum == nullptr)
      return invalid_argument(what + ": a buffer is missing");
    if (b.elements * 4 != t.bytes) {
      return invalid_argument(what + " has " + std::to_string(b.elements) +
                              " elements, the profile " + std::to_string(t.bytes / 4));
    }
    if ((b.space != MemorySpace::kHost || b.dtype != DType::kFloat32) && !b.staged) {
      return invalid_argument(
          what + " is " + dtype_name(b.dtype) + " in " + memory_space_name(b.space) +
          " memory: the transport reads host float32 only, so it must be staged (a host "
          "float32 buffer the source copies to and from)");
    }
    if (i > 0 && b.priority <= tensors[i - 1].priority) {
      return invalid_argument(what + ": priorities must increase with the id (the forward order)");
    }
  }
  return Status::ok();
}

KnownContent::KnownContent(const Profile& profile, int worker, int workers, bool verify,
                           transport::WireDType wire)
    : layout_(profile), worker_(worker), workers_(workers), verify_(verify), wire_(wire) {
  std::size_t floats = 0;
  for (const TensorInfo& t : layout_.tensors()) {
    base_.push_back(floats);
    floats += static_cast<std::size_t>(t.bytes / 4);
  }
  gradients_.assign(floats, 0.0f);
  sums_.assign(floats, 0.0f);
}

std::vector<TensorBuffer> KnownContent::tensors() {
  std::vector<TensorBuffer> r;
  for (const TensorInfo& t : layout_.tensors()) {
    const std::size_t b = base_[static_cast<std::size_t>(t.id)];
    r.push_back(TensorBuffer{t.id, gradients_.data() + b, sums_.data() + b, t.bytes / 4, t.id});
  }
  return r;
}

void KnownContent::on_backward(int layer, std::int64_t iteration) {
  if (!verify_) return;
  for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
    fill_gradient(gradients_.data() + base_[static_cast<std::size_t>(t)],
                  layout_.tensor(t).bytes / 4, 0, worker_, iteration, t);
  }
}

Status KnownContent::on_layer_ready(int layer, std::int64_t iteration) {
  if (!verify_) return Status::ok();
  for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
    QS_RETURN_IF_ERROR(check_sum(sums_.data() + base_[static_cast<std::size_t>(t)],
                                 layout_.tensor(t).bytes / 4, 0, workers_, iteration, t, wire_));
  }
  ++layers_checked_;
  return Status::ok();
}

int KnownContent::iterations_verified() const {
  return layout_.num_layers() > 0 ? static_cast<int>(layers_checked_ / layout_.num_layers()) : 0;
}

Result<std::unique_ptr<Compute>> make_compute(
    const std::function<std::unique_ptr<Compute>(Timer&)>& factory, Timer& timer,
    const Profile& profile, double factor, TensorSource& source, std::vector<TraceSpan>* trace,
    int rank) {
  if (factory) {
    std::unique_ptr<Compute> c = factory(timer);
    if (!c) return invalid_argument("the compute factory made no compute");
    return c;
  }
  return std::unique_ptr<Compute>(std::make_unique<EmulatedCompute>(
      profile, factor, timer,
      trace != nullptr ? SpanRecorder(trace, rank, 0, false) : SpanRecorder(),
      [&source](const ComputeStep& s) { source.on_backward(s.layer, s.iteration); }));
}

}  // namespace qs::runtime
