// Private helpers shared by the worker and the server.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "quicksilver/engine/compute.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/policy/layout.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/sender.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

// validate_job (runtime.h) checks the options every node shares.

// The runtime's Timer (the training loop's first seam): the node's event loop
// (CLOCK_MONOTONIC).
class LoopTimer final : public Timer {
 public:
  explicit LoopTimer(transport::EventLoop& loop) : loop_(loop) {}
  TimeNs now() const override { return loop_.now(); }
  void schedule_at(TimeNs when, Callback fn) override { loop_.schedule_at(when, std::move(fn)); }

 private:
  transport::EventLoop& loop_;
};

// A worker's device (the loop's second seam), both runtimes alike: the caller's factory's
// (a real model: its steps end when the model says so), else the GPU emulated from the
// profile at `factor`, which lets `source` produce each backward's gradients and records
// its steps on `trace` (null: none) as `rank`'s track 0.
Result<std::unique_ptr<Compute>> make_compute(
    const std::function<std::unique_ptr<Compute>(Timer&)>& factory, Timer& timer,
    const Profile& profile, double factor, TensorSource& source, std::vector<TraceSpan>* trace,
    int rank);

// What a worker's and a server's authentication is for (transport::Handshake's context):
// a proof made for another use (the rendezvous) is refused here.
inline constexpr const char* kPsAuthContext = "quicksilver-ps";

// The static facts derived from a job (identical on every node).
struct JobLayout {
  explicit JobLayout(const JobOptions& job)
      : layout(job.profile), placement(layout, job.servers, job.policy_options.split_threshold) {}
  TensorLayout layout;
  Placement placement;
  // The policy context of a node whose compute runs at `compute_factor` times the profile
  // (a worker's WorkerOptions::compute_factor; 1 for a server, which computes nothing).
  PsContext context(const JobOptions& job, double compute_factor) const {
    return PsContext{&job.profile, &layout,       &placement, job.workers,
                     job.servers,  job.bandwidth, 0,          compute_factor};
  }
};

transport::SendOrder send_order(QueueDiscipline d);
// The socket options with JobOptions::commit_window applied, and the Sender's batch.
transport::SocketOptions socket_options(const JobOptions& job);
std::uint64_t sender_batch_bytes(const JobOptions& job);
transport::HelloBody hello_body(const JobOptions& job);

// The liveness of one connection (docs/reliability.md "What is detected, and how fast").
// Every tick (JobOptions::peer_timeout / 4) a node sends a heartbeat on each connection it
// wrote nothing to since the last tick, so a connection that carries no byte for
// peer_timeout means the peer or the link stalled, whatever the job is doing (computing,
// waiting for another peer). Loop thread only.
class Liveness {
 public:
  // Sends a heartbeat from `sender` on `c` if nothing was written to it since the last
  // call and its output is idle; returns how long `c` has read nothing (0 at the first
  // call). A failed send closes `c` (its owner's on_closed reports it).
  TimeNs tick(transport::Connection& c, TimeNs now, std::uint16_t sender);
  // The tick period of a job: a quarter of its peer timeout, at least 1 ms.
  static TimeNs period(const JobOptions& job) {
    return std::max<TimeNs>(job.peer_timeout / 4, kNsPerMs);
  }

 private:
  bool started_ = false;
  std::uint64_t read_ = 0, written_ = 0;
  TimeNs heard_ = 0;
};
// Explains how two hellos differ ("profile hash differs: ..."), empty when equal.
std::string hello_mismatch(const transport::HelloBody& mine, const transport::HelloBody& theirs);

// Known gradient content, chosen so that float32 sums of up to 2^15 workers are exact:
// small integers. value(w, it, t, i) = ((7w + 3it + 5t) & 255) + (i & 255).
void fill_gradient(float* dst, std::int64_t count, std::int64_t first_index, int worker,
                   std::int64_t iteration, TensorId tensor);
// Checks `sum[k]` == sum over all N workers of value(w, it, t, first_index + k); names the
// first wrong element.
Status check_sum(const float* sum, std::int64_t count, std::int64_t first_index, int workers,
                 std::int64_t iteration, TensorId tensor);
// The same for a sum over iterations first..last (an all-reduce bucket that merged them).
Status check_sum(const float* sum, std::int64_t count, std::int64_t first_index, int workers,
                 std::int64_t first_iteration, std::int64_t last_iteration, TensorId tensor);

// The same with `wire` on the wire (compression): every element rounded as the runtime does.
Status check_sum(const float* sum, std::int64_t count, std::int64_t first_index, int workers,
                 std::int64_t iteration, TensorId tensor, transport::WireDType wire);

// dst[i] += src[i] for i < n (vectorised). src may be unaligned.
void add_floats(float* dst, const std::byte* src, std::size_t n);

// n float32 elements to and from the wire's dtype (transport::WireDType; little-endian,
// bf16/fp16 rounded to nearest even), and the server's sum: dst[i] += the element src[i]
// carries. src/dst byte buffers may be unaligned.
void encode_floats(const float* src, std::size_t n, transport::WireDType d, std::byte* dst);
void decode_floats(const std::byte* src, std::size_t n, transport::WireDType d, float* dst);
// x as it arrives after one trip through the wire's dtype (rounded to nearest even).
float round_to_wire(float x, transport::WireDType d);
void add_wire(float* dst, const std::byte* src, std::size_t n, transport::WireDType d);
// float16 without the CPU's F16C (what encode_floats/decode_floats use where it lacks
// it): for the test that both agree bit for bit.
void encode_fp16_portable(const float* src, std::size_t n, std::byte* dst);
void decode_fp16_portable(const std::byte* src, std::size_t n, float* dst);
// The all-reduce's compressed sums (known content): with 2 workers exactly the rounded
// gradients added and rounded; with more within the rounding bound of every hop.
Status check_compressed_allreduce(const float* sum, std::int64_t count, std::int64_t first_index,
                                  int workers, std::int64_t first_iteration,
                                  std::int64_t last_iteration, TensorId tensor,
                                  transport::WireDType wire);
// The all-reduce's reduction of compressed elements (gloo's ReduceFn signature): c[i] =
// a[i] + b[i], added in float32 and rounded to nearest even; c may be a.
void reduce_bf16(void* c, const void* a, const void* b, std::size_t n);
void reduce_fp16(void* c, const void* a, const void* b, std::size_t n);

}  // namespace qs::runtime
