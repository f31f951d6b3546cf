#include "gradient_staging.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace qs::runtime {

GradientStaging::GradientStaging(const TensorLayout& layout,
                                 const std::vector<TensorBuffer>& buffers,
                                 std::function<std::int64_t(std::int64_t)> merged_from)
    : layout_(layout), buffers_(buffers), merged_from_(std::move(merged_from)) {
  std::size_t at = 0;
  for (const TensorInfo& ti : layout_.tensors()) {
    bases_.push_back(at);
    at += static_cast<std::size_t>(ti.bytes / 4);
  }
}

GradientStaging::Buffer GradientStaging::take() {
  MutexLock lock(mu_);
  if (!spare_.empty()) {
    Buffer b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }
  ++allocated_;
  allocated_max_ = std::max(allocated_, allocated_max_);
  return std::make_unique_for_overwrite<float[]>(
      static_cast<std::size_t>(layout_.total_bytes() / 4));
}

// One spare is kept (the next range needs one soon); the rest are freed.
void GradientStaging::give_back_locked(Buffer b) {
  if (spare_.empty()) {
    spare_.push_back(std::move(b));
  } else {
    --allocated_;
  }
}

float* GradientStaging::range_sum(std::int64_t first) {
  {
    MutexLock lock(mu_);
    auto r = ranges_.find(first);
    if (r != ranges_.end()) return r->second.sums.get();
  }
  Buffer b = take();
  float* at = b.get();
  MutexLock lock(mu_);
  ranges_[first].sums = std::move(b);
  return at;
}

// Adds `layer`'s gradients of iteration `it` (at `from`, laid out as the staging
// buffers: the registry's when null) to the range sum `to` whose first iteration is
// `first`: the first iteration is copied, the others added, in order.
void GradientStaging::add_layer(float* to, const float* from, int layer, std::int64_t it,
                                std::int64_t first) {
  for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
    const TensorBuffer& b = buffers_[static_cast<std::size_t>(t)];
    const std::size_t n = static_cast<std::size_t>(b.elements);
    const std::size_t base = bases_[static_cast<std::size_t>(t)];
    const float* src = from != nullptr ? from + base : b.gradient;
    float* dst = to + base;
    if (it == first) {
      std::memcpy(dst, src, n * sizeof(float));
    } else {
      for (std::size_t k = 0; k < n; ++k) dst[k] += src[k];
    }
  }
}

void GradientStaging::snapshot(int layer, std::int64_t it) {
  settle();
  const std::int64_t first = merged_from_(it);
  if (first < 0) {  // a replica that has not applied worker 0's start of `it` yet
    Aside& a = aside_[it];
    if (!a.gradients) {
      a.gradients = take();
      a.layers.assign(static_cast<std::size_t>(layout_.num_layers()), 0);
    }
    for (TensorId t = layout_.first_tensor(layer); t < layout_.end_tensor(layer); ++t) {
      const TensorBuffer& b = buffers_[static_cast<std::size_t>(t)];
      std::memcpy(a.gradients.get() + bases_[static_cast<std::size_t>(t)], b.gradient,
                  static_cast<std::size_t>(b.elements) * sizeof(float));
    }
    a.layers[static_cast<std::size_t>(layer)] = 1;
    return;
  }
  add_layer(range_sum(first), nullptr, layer, it, first);
}

void GradientStaging::settle() {
  while (!aside_.empty()) {
    auto a = aside_.begin();
    const std::int64_t first = merged_from_(a->first);
    if (first < 0) return;
    float* to = range_sum(first);
    for (int l = 0; l < layout_.num_layers(); ++l) {
      if (a->second.layers[static_cast<std::size_t>(l)])
        add_layer(to, a->second.gradients.get(), l, a->first, first);
    }
    {
      MutexLock lock(mu_);
      give_back_locked(std::move(a->second.gradients));
    }
    aside_.erase(a);
  }
}

void GradientStaging::read(const CollectiveBucket& b, const Chunk& c, float* out) {
  const float* src;
  {
    MutexLock lock(mu_);
    auto r = ranges_.find(b.first_iteration);
    if (r == ranges_.end()) {
      throw std::runtime_error("no gradients staged for iterations " +
                               std::to_string(b.first_iteration) + ".." +
                               std::to_string(b.last_iteration));
    }
    src = r->second.sums.get() + bases_[static_cast<std::size_t>(c.tensor)] +
          static_cast<std::size_t>(c.offset / 4);
  }
  std::memcpy(out, src, static_cast<std::size_t>(c.length / 4) * sizeof(float));
}

void GradientStaging::consumed(const CollectiveBucket& b) {
  MutexLock lock(mu_);
  auto r = ranges_.find(b.first_iteration);
  if (r != ranges_.end() && (r->second.read += b.bytes()) == layout_.total_bytes()) {
    give_back_locked(std::move(r->second.sums));
    ranges_.erase(r);
  }
}

std::int64_t GradientStaging::buffers_max() const {
  MutexLock lock(mu_);
  return allocated_max_;
}

void StagingCompute::run(const ComputeStep& step, TimeNs earliest, Done done) {
  if (step.pass != Pass::kBackward) return inner_.run(step, earliest, std::move(done));
  inner_.run(step, earliest, [this, step, done = std::move(done)](TimeNs end) {
    staging_.snapshot(step.layer, step.iteration);
    done(end);
  });
}

}  // namespace qs::runtime
