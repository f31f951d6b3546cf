// The all-reduce runtime's seam to a collective engine (docs/architecture.md, "A new
// engine"): what CollectiveWorker needs of the network, and nothing else. The worker's
// units (the agreement on bucket order, the policy replica, DeFT's staging, the
// calibration, the watchdog: src/runtime/collective/) are written against this interface
// only; gloo over TCP (gloo_communicator.cc) is one implementation, and a test engine in
// one process (tests/inprocess_communicator.h) another.
//
// Contract:
//   - links() independent channels carry the gradients' all-reduces. Each link is driven
//     by one thread of the worker, one collective at a time, in the same order on every
//     rank (the agreement makes it so); links run concurrently with each other and with
//     the control channel.
//   - The control channel (link kControl) carries the start-up collectives, the final
//     barrier, and the small messages of ControlBuffer.
//   - Every call names the peer at fault when one is: PeerError. Any other failure throws
//     std::runtime_error (the worker turns both into its error, with its name).
//   - data is host memory (TensorBuffer's staging puts device tensors there first). An
//     engine for device memory (NCCL) takes the same calls with device pointers and a
//     stream of its own; docs/architecture.md says how one is added without torch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "quicksilver/core/units.h"

namespace qs::runtime {

// A collective failed because of one peer: its message was corrupted, it never came, or
// its connection closed. `peer` is that peer's rank.
class PeerError : public std::runtime_error {
 public:
  PeerError(int peer, const std::string& what) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// What an all-reduce computes, element by element, and so the element's size: float32 or
// float64 sums, a float64 maximum (the start-up agreement), and the 2-byte wire types of
// compression, added in float32 and rounded to nearest even at every step.
enum class ReduceOp { kSumFloat32, kSumFloat64, kMaxFloat64, kSumBFloat16, kSumFloat16 };
std::size_t element_bytes(ReduceOp op);

// How one all-reduce is run.
struct AllReduceCall {
  // Every message checked end to end (docs/reliability.md), where the engine's wire can
  // corrupt. Every rank the same.
  bool checksums = true;
  // Told of a corrupted message before the collective ends (the root cause first, before
  // the peers fail in turn). May be empty.
  std::function<void(int from, const std::string& what)> on_corrupted;
  // Fault injection (tests): every data message received, before its check.
  std::function<void(int from, std::byte* data, std::size_t bytes)> tamper;
};

// One message buffer on the control channel: the agreement's reports and decisions, the
// policy replica's batches. One send or one receive in flight at a time per buffer; a
// message is matched by its slot. A message may be shorter than the buffer (a batch of
// few records): the receive takes it into the buffer's first bytes.
class ControlBuffer {
 public:
  virtual ~ControlBuffer() = default;
  // Starts sending the buffer's first `bytes` bytes (at most its size) to rank `to` under
  // `slot`.
  virtual void send(int to, std::uint64_t slot, std::size_t bytes) = 0;
  // Waits until the send completed: false when aborted (abort_send). Throws when the peer
  // is lost or `timeout` passes.
  virtual bool wait_send(TimeNs timeout) = 0;
  // Starts receiving one message (of at most the buffer's size) under `slot` from any rank
  // of `from` into the buffer.
  virtual void recv(const std::vector<int>& from, std::uint64_t slot) = 0;
  // Waits for it: the sender in `*from` (may be null); false when aborted.
  virtual bool wait_recv(int* from, TimeNs timeout) = 0;
  // Thread-safe: ends a wait in progress, or the next one, with false.
  virtual void abort_send() = 0;
  virtual void abort_recv() = 0;
};

class Communicator {
 public:
  static constexpr int kControl = -1;
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int links() const = 0;
  // Reduces `count` elements at `data` in place across every rank, on `link` (or
  // kControl). A failed collective leaves `data` undefined.
  virtual void all_reduce(int link, void* data, std::size_t count, ReduceOp op,
                          const AllReduceCall& call) = 0;
  // A control-channel message buffer over `bytes` bytes at `data` (which outlive it).
  virtual std::unique_ptr<ControlBuffer> control_buffer(void* data, std::size_t bytes) = 0;
  // Control channel: returns once every rank called it.
  virtual void barrier() = 0;
  // Ends this rank's part after it failed: its connections close at once, so that a peer
  // blocked on this rank (in a collective, the final barrier, a control message) fails
  // now, naming this rank, instead of at its peer timeout. Called once no call of this
  // rank is in progress; no call follows it.
  virtual void close() = 0;
};

}  // namespace qs::runtime
