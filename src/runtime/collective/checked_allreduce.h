// An all-reduce whose every message carries an end-to-end checksum (docs/reliability.md,
// "The all-reduce data path"), run on gloo's transport pairs as gloo's own algorithms are.
//
// gloo's algorithms (gloo/allreduce.cc) send bare bytes: a bit flipped above TCP (a
// middlebox, a NIC offload, memory) is summed, and the flipped partial sum of a
// reduce-scatter step travels on to every rank identically, so no comparison of results
// across ranks can see it. Here each data message is followed by a 4-byte message on its
// own slot carrying the CRC32C of the bytes the sender sent (transport/crc32c.h); the
// receiver checks the bytes it got against it before it reduces or forwards any of them.
// Two messages rather than a trailer appended to the data: the data is sent from and
// received into the caller's buffer, as gloo does, with no copy (a trailer would need one
// per message, more than the CRC itself costs).
//
// Algorithms, the same exchanges as gloo's (element for element the same sums):
//   ring      gloo's ring (reduce-scatter then all-gather around the ring, each rank's
//             chunk cut into segments of at most `segment_bytes`, two in flight each way);
//             also run for "ring-chunked".
//   bcube     gloo's bcube with groups of 2 (recursive halving-doubling when the number of
//             ranks is a power of two; groups of the remaining factor otherwise); also run
//             for "halving-doubling".
//
// Every wait names the rank it waits on: a message that fails its check ends the
// collective with a PeerError naming its sender; a wait that times out (the context's
// timeout) or a closed pair with one naming the rank whose message did not come.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/communicator.h"  // PeerError

namespace qs::runtime {

// gloo's TCP pairs write without MSG_NOSIGNAL: a write to a peer that has closed would kill
// the process with SIGPIPE (exit 141, no message) instead of failing the collective with an
// error naming the peer. Sets SIGPIPE to ignored, process-wide, unless the program has a
// handler of its own (Python ignores it already). Call before the first gloo device.
void ignore_sigpipe();

// gloo's reduce function type: c[i] = a[i] op b[i] for i < n elements (c may be a).
using ReduceFn = void (*)(void* c, const void* a, const void* b, std::size_t n);

struct CheckedAllreduceOptions {
  // The ranks' context (its pairs connected); one collective at a time on it, called by
  // every rank in the same order.
  std::shared_ptr<gloo::Context> context;
  // ring or ring-chunked: the ring; halving-doubling or bcube: bcube (above).
  GlooAlgorithm algorithm = GlooAlgorithm::kRing;
  // Whether messages carry and are checked against a CRC32C. Every rank the same (a rank
  // without would take a peer's checksum for data).
  bool checksums = true;
  // How long a wait for one peer may last (default: the context's timeout).
  std::chrono::milliseconds timeout{0};
  // The ring's largest segment (gloo's default, 1 MiB).
  std::size_t segment_bytes = 1 << 20;
  // How errors call a rank ("worker 3").
  std::function<std::string(int rank)> rank_name = [](int r) {
    return "rank " + std::to_string(r);
  };
  // Called with the error of a corrupted message before the collective ends and closes
  // its pairs, so that the owner can record the root cause before its other threads hear
  // of closed connections (the peers fail in turn and close theirs). May be empty.
  std::function<void(int from, const std::string& what)> on_corrupted;
  // Fault injection (tests): called with every data message received, before its check
  // (its sender's rank, its bytes), to corrupt it as a faulty wire would.
  std::function<void(int from, std::byte* data, std::size_t bytes)> tamper;
};

// Reduces `elements` elements of `element_size` bytes at `data` in place with `reduce`
// across every rank of options.context. Throws PeerError (a peer's fault, named) or
// gloo's exceptions (anything else). A failed collective leaves `data` undefined.
void checked_allreduce(const CheckedAllreduceOptions& options, void* data, std::size_t elements,
                       std::size_t element_size, ReduceFn reduce);

}  // namespace qs::runtime
