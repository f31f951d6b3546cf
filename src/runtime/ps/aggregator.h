// The parameter server's aggregator (Mercury IV-C "Aggregator"): the sums of the units
// this server owns, each element added as it arrives (per-packet aggregation), in one
// float32 buffer per iteration parity. It knows units, workers and bytes, not connections:
// the server feeds it the pushes its transport reads and sends the pulls it makes ready.
// One thread (the server's event loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../runtime_internal.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

class Aggregator {
 public:
  // One unit being summed: all N workers push the same (tensor, offset, length).
  struct Unit {
    int slot = 0;
    TensorId tensor = 0;
    std::uint64_t offset = 0;
    std::uint32_t length = 0;
    std::uint16_t priority = 0;
    std::uint32_t iteration = 0;
    std::uint64_t mask = 0;  // workers whose push fully arrived
    std::uint64_t open = 0;  // workers whose push is arriving now
    int count = 0;
    int pulls_left = 0;
    float* sum = nullptr;       // into the slot's float32 sums
    std::byte* wire = nullptr;  // compression: the sum in the wire's dtype
  };
  // One worker's push as it streams in: its unit, and a wire element split between two
  // reads.
  struct Stream {
    Unit* unit = nullptr;
    unsigned char carry[4] = {};
    int carry_n = 0;
  };

  // `owner` names the server in errors ("server 0").
  Aggregator(const JobLayout& jl, int server_id, int workers, transport::WireDType wire,
             std::string owner);

  // Worker `w`'s push of `h` (offsets and lengths in float32 bytes) begins: the unit it
  // adds to, opened if it is the first worker's. Refused (a header error, the connection's
  // end): bytes this server does not own, a unit overlapping another, another cut of the
  // same unit, a second push of it, an iteration whose parity's slot is still busy.
  // `*new_iteration`: this push opened its iteration.
  Result<Unit*> begin_push(int w, const transport::Header& h, bool* new_iteration);
  // `n` payload bytes at wire offset `at` of the push `s` reads, added to its unit's sum.
  void add(Stream& s, std::uint64_t at, const std::byte* data, std::size_t n) const;
  // Worker `w`'s push of `u` arrived whole. True: it was the last one, `u` is ready (its
  // pulls_left set to N): pull_payload(u) is what every worker pulls.
  bool end_push(Unit& u, int w);
  // The ready unit's sum as the wire carries it (compression: rounded once, for every
  // worker).
  const std::byte* pull_payload(Unit& u) const;
  // One of `u`'s pulls is sent; after the last, the unit is gone.
  void pull_sent(Unit& u);

  std::int64_t live() const { return live_[0] + live_[1]; }  // units not yet pulled by all
  std::int64_t latest_iteration() const { return std::max(slot_iteration_[0], slot_iteration_[1]); }
  // The workers some live unit still lacks, a bit each.
  std::uint64_t missing() const;

 private:
  const JobLayout& jl_;
  const int server_id_;
  const int workers_;
  const transport::WireDType wire_dtype_;
  const std::size_t wire_size_;  // wire bytes per element
  const std::string owner_;
  std::unordered_map<const Slice*, std::size_t> slice_base_;     // its slices: first float
  std::vector<float> accum_[2];                                  // by iteration parity
  std::vector<std::byte> wire_accum_[2];                         // compression: the pulls' bytes
  std::map<std::pair<TensorId, std::uint64_t>, Unit> units_[2];  // live units by parity
  std::int64_t slot_iteration_[2] = {-1, -1};
  std::int64_t live_[2] = {0, 0};
};

}  // namespace qs::runtime
