#include "aggregator.h"

#include <algorithm>
#include <cstring>

namespace qs::runtime {

using transport::HeaderField;

Aggregator::Aggregator(const JobLayout& jl, int server_id, int workers, transport::WireDType wire,
                       std::string owner)
    : jl_(jl),
      server_id_(server_id),
      workers_(workers),
      wire_dtype_(wire),
      wire_size_(static_cast<std::size_t>(transport::wire_dtype_size(wire))),
      owner_(std::move(owner)) {
  // Owned byte ranges (Placement), packed into one float buffer per iteration parity: the
  // float index of each of this server's slices, keyed by the slice.
  std::size_t floats = 0;
  for (const TensorInfo& t : jl_.layout.tensors()) {
    for (const Slice& s : jl_.placement.slices(t.id)) {
      if (s.server != server_id_) continue;
      slice_base_.emplace(&s, floats);
      floats += static_cast<std::size_t>(s.chunk.length / 4);
    }
  }
  for (auto& a : accum_) a.assign(floats, 0.0f);
  if (wire_size_ < 4) {
    for (auto& a : wire_accum_) a.assign(floats * wire_size_, std::byte{0});
  }
}

Result<Aggregator::Unit*> Aggregator::begin_push(int w, const transport::Header& h,
                                                 bool* new_iteration) {
  *new_iteration = false;
  // The bytes must be this server's (Placement).
  const Slice* own =
      jl_.placement.owning_slice(Chunk{static_cast<TensorId>(h.tensor),
                                       static_cast<Bytes>(h.offset), static_cast<Bytes>(h.length)},
                                 server_id_);
  if (own == nullptr) {
    return transport::header_error(HeaderField::kOffset,
                                   "bytes [" + std::to_string(h.offset) + ", " +
                                       std::to_string(h.offset + h.length) + ") of tensor " +
                                       std::to_string(h.tensor) + " are not owned by " + owner_);
  }
  const int slot = static_cast<int>(h.iteration & 1);
  if (slot_iteration_[slot] != static_cast<std::int64_t>(h.iteration)) {
    if (live_[slot] != 0) {
      return transport::header_error(HeaderField::kIteration,
                                     "iteration " + std::to_string(h.iteration) + " from worker " +
                                         std::to_string(w) + " while iteration " +
                                         std::to_string(slot_iteration_[slot]) + " is unfinished");
    }
    slot_iteration_[slot] = h.iteration;
    *new_iteration = true;
  }
  auto& map = units_[slot];
  const auto key = std::make_pair(static_cast<TensorId>(h.tensor), h.offset);
  auto it = map.find(key);
  if (it == map.end()) {
    // A new unit must not overlap its neighbours (else bytes would be summed twice).
    auto next = map.lower_bound(key);
    if (next != map.end() && next->first.first == key.first &&
        next->first.second < h.offset + h.length) {
      return transport::header_error(HeaderField::kLength, "unit overlaps the unit at offset " +
                                                               std::to_string(next->first.second));
    }
    if (next != map.begin()) {
      auto prev = std::prev(next);
      if (prev->first.first == key.first && prev->first.second + prev->second.length > h.offset) {
        return transport::header_error(
            HeaderField::kOffset,
            "unit overlaps the unit at offset " + std::to_string(prev->first.second));
      }
    }
    Unit u;
    u.slot = slot;
    u.tensor = key.first;
    u.offset = h.offset;
    u.length = h.length;
    u.priority = h.priority;
    u.iteration = h.iteration;
    const std::size_t at =
        slice_base_.at(own) + (static_cast<Bytes>(h.offset) - own->chunk.offset) / 4;
    u.sum = accum_[slot].data() + at;
    if (wire_size_ < 4) u.wire = wire_accum_[slot].data() + at * wire_size_;
    std::fill(u.sum, u.sum + h.length / 4, 0.0f);
    it = map.emplace(key, u).first;
    ++live_[slot];
  }
  Unit& u = it->second;
  const std::uint64_t bit = std::uint64_t{1} << w;
  if (u.length != h.length) {
    return transport::header_error(
        HeaderField::kLength, "worker " + std::to_string(w) + " cut tensor " +
                                  std::to_string(h.tensor) + " offset " + std::to_string(h.offset) +
                                  " as " + std::to_string(h.length) + " bytes, others as " +
                                  std::to_string(u.length) + " (workers must cut the same units)");
  }
  if ((u.mask | u.open) & bit) {
    return transport::header_error(
        HeaderField::kOffset, "worker " + std::to_string(w) + " pushed tensor " +
                                  std::to_string(h.tensor) + " offset " + std::to_string(h.offset) +
                                  " twice in iteration " + std::to_string(h.iteration));
  }
  u.open |= bit;
  return &u;
}

void Aggregator::add(Stream& s, std::uint64_t at, const std::byte* data, std::size_t n) const {
  Unit& u = *s.unit;
  // `at` counts wire bytes into the unit; each whole element is added as it arrives,
  // converted to float32 first when compressed.
  const std::size_t ws = wire_size_;
  std::uint64_t pos = at;
  if (s.carry_n > 0) {
    const std::size_t take = std::min<std::size_t>(ws - static_cast<std::size_t>(s.carry_n), n);
    std::memcpy(s.carry + s.carry_n, data, take);
    s.carry_n += static_cast<int>(take);
    data += take;
    n -= take;
    pos += take;
    if (static_cast<std::size_t>(s.carry_n) < ws) return;
    add_wire(u.sum + (pos - ws) / ws, reinterpret_cast<const std::byte*>(s.carry), 1, wire_dtype_);
    s.carry_n = 0;
  }
  const std::size_t whole = n / ws;
  add_wire(u.sum + pos / ws, data, whole, wire_dtype_);
  if (n % ws != 0) {
    s.carry_n = static_cast<int>(n % ws);
    std::memcpy(s.carry, data + whole * ws, n % ws);
  }
}

bool Aggregator::end_push(Unit& u, int w) {
  const std::uint64_t bit = std::uint64_t{1} << w;
  u.open &= ~bit;
  u.mask |= bit;
  if (++u.count < workers_) return false;
  u.pulls_left = workers_;
  return true;
}

const std::byte* Aggregator::pull_payload(Unit& u) const {
  if (u.wire == nullptr) return reinterpret_cast<const std::byte*>(u.sum);
  encode_floats(u.sum, u.length / 4, wire_dtype_, u.wire);
  return u.wire;
}

void Aggregator::pull_sent(Unit& u) {
  if (--u.pulls_left > 0) return;
  --live_[u.slot];
  units_[u.slot].erase(std::make_pair(u.tensor, u.offset));
}

std::uint64_t Aggregator::missing() const {
  std::uint64_t missing = 0;
  for (const auto& map : units_) {
    for (const auto& [key, u] : map) missing |= ~u.mask;
  }
  return missing;
}

}  // namespace qs::runtime
