#include "bucket_reducer.h"

#include <cstring>
#include <stdexcept>

#include "../runtime_internal.h"
#include "communicator_util.h"
#include "quicksilver/transport/clock.h"

namespace qs::runtime {

std::string describe(const CollectiveBucket& b) {
  return "bucket #" + std::to_string(b.id) + " (iteration " + std::to_string(b.first_iteration) +
         (b.last_iteration != b.first_iteration ? ".." + std::to_string(b.last_iteration) : "") +
         ", " + std::to_string(b.chunks.size()) + " chunks, " + format_size(b.bytes()) + ", link " +
         std::to_string(b.link) + ")";
}

BucketReducer::BucketReducer(Settings s, Communicator& comm,
                             const std::vector<TensorBuffer>& buffers, GradientStaging* staging,
                             DelayedUpdateTarget* delayed, std::function<void(const Status&)> fail)
    : s_(std::move(s)),
      comm_(comm),
      buffers_(buffers),
      staging_(staging),
      delayed_(delayed),
      fail_(std::move(fail)),
      scratch_(static_cast<std::size_t>(s_.links)) {}

bool BucketReducer::run(int li, const CollectiveBucket& b, TimeNs* t0, TimeNs* t1) {
  // One chunk of this iteration's gradients: reduced in place in its sum buffer (no copy
  // at all when the caller's sum is its gradient, as PyTorch's is).
  if (staging_ == nullptr && b.chunks.size() == 1) {
    const Chunk& c = b.chunks[0];
    const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                      count = static_cast<std::size_t>(c.length / 4);
    const TensorBuffer& t = buffers_[static_cast<std::size_t>(c.tensor)];
    if (t.sum != t.gradient) std::memcpy(t.sum + first, t.gradient + first, count * sizeof(float));
    *t0 = transport::steady_now();
    reduce(li, b, t.sum + first, count);
    *t1 = transport::steady_now();
    return check(b, nullptr);
  }
  Scratch& s = scratch_[static_cast<std::size_t>(li)];
  s.data.resize(static_cast<std::size_t>(b.bytes() / 4));
  float* out = s.data.data();
  // Gather: this worker's gradients, summed over the bucket's iterations.
  for (const Chunk& c : b.chunks) {
    if (staging_ != nullptr) {
      staging_->read(b, c, out);
    } else {
      std::memcpy(out,
                  buffers_[static_cast<std::size_t>(c.tensor)].gradient +
                      static_cast<std::size_t>(c.offset / 4),
                  static_cast<std::size_t>(c.length));
    }
    out += c.length / 4;
  }
  if (staging_ != nullptr) staging_->consumed(b);  // every byte of a range read: its buffer is free
  *t0 = transport::steady_now();
  reduce(li, b, s.data.data(), s.data.size());
  *t1 = transport::steady_now();
  // Scatter into the sums (the caller posts the completion after: posting first would let
  // the loop reuse them): with delayed updates, into the source's buffer for the bucket's
  // iterations.
  const float* in = s.data.data();
  for (std::size_t i = 0; s_.scatter && i < b.chunks.size(); ++i) {
    const Chunk& c = b.chunks[i];
    const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                      count = static_cast<std::size_t>(c.length / 4);
    float* to = delayed_ != nullptr
                    ? delayed_->merged_sum(c.tensor, b.first_iteration, b.last_iteration)
                    : buffers_[static_cast<std::size_t>(c.tensor)].sum;
    if (to == nullptr) throw std::runtime_error("no buffer for the merged sums of " + describe(b));
    std::memcpy(to + first, in, count * sizeof(float));
    in += count;
  }
  return check(b, s.data.data());
}

// Reduces the bucket's gradients at `data` across the workers on the link, every message
// checked where the engine's wire can corrupt; an error names the bucket and the worker at
// fault (a corrupted message's sender, the peer a wait timed out on).
void BucketReducer::reduce(int li, const CollectiveBucket& b, float* data, std::size_t count) {
  AllReduceCall call;
  call.checksums = s_.checksums;
  // The root cause first: the worker's other threads (decisions, reports) would otherwise
  // report the closed connections of peers failing in turn.
  call.on_corrupted = [this](int, const std::string& what) { fail_(unavailable(what)); };
  if (s_.tamper) {
    call.tamper = [this, li](int from, std::byte* p, std::size_t n) { s_.tamper(li, from, p, n); };
  }
  try {
    all_reduce_floats(comm_, li, data, count, s_.wire, scratch_[static_cast<std::size_t>(li)].wire,
                      call);
  } catch (const std::exception& e) {
    throw std::runtime_error("all-reduce of " + describe(b) + ": " + e.what());
  }
}

// Known content: every reduced element exactly (before the loop may reuse the buffers).
// `reduced`: the bucket's elements in chunk order (the link's buffer), or null when the one
// chunk was reduced in place in its sum buffer. Checked there, before the scatter: under
// DeFT two buckets of one chunk (different iterations) may run at once on two links, and
// the sum buffer holds whichever scattered last.
bool BucketReducer::check(const CollectiveBucket& b, const float* reduced) {
  for (std::size_t i = 0; s_.check && i < b.chunks.size(); ++i) {
    const Chunk& c = b.chunks[i];
    const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                      count = static_cast<std::size_t>(c.length / 4);
    const float* at =
        reduced != nullptr ? reduced : buffers_[static_cast<std::size_t>(c.tensor)].sum + first;
    Status st =
        s_.wire == transport::WireDType::kFloat32
            ? check_sum(at, static_cast<std::int64_t>(count), static_cast<std::int64_t>(first),
                        s_.workers, b.first_iteration, b.last_iteration, c.tensor)
            : check_compressed_allreduce(at, static_cast<std::int64_t>(count),
                                         static_cast<std::int64_t>(first), s_.workers,
                                         b.first_iteration, b.last_iteration, c.tensor, s_.wire);
    if (!st.is_ok()) {
      fail_(st);
      return false;
    }
    if (reduced != nullptr) reduced += count;
  }
  return true;
}

}  // namespace qs::runtime
