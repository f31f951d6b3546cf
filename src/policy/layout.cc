#include "quicksilver/policy/layout.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "knob_table.h"
#include "quicksilver/core/check.h"

namespace qs {

TensorLayout::TensorLayout(const Profile& profile) {
  for (int l = 0; l < profile.num_layers(); ++l) {
    const auto first = static_cast<TensorId>(tensors_.size());
    Bytes lb = 0;
    for (const TensorSpec& t : profile.layers[static_cast<std::size_t>(l)].tensors) {
      tensors_.push_back(
          TensorInfo{static_cast<TensorId>(tensors_.size()), l, t.bytes(), t.bytes_per_element});
      lb += t.bytes();
    }
    layer_tensors_.emplace_back(first, static_cast<TensorId>(tensors_.size()));
    layer_bytes_.push_back(lb);
    total_bytes_ += lb;
  }
}

Placement::Placement(const TensorLayout& layout, int servers, Bytes split_threshold,
                     const std::vector<double>& shares)
    : servers_(servers),
      slices_(static_cast<std::size_t>(layout.num_tensors())),
      load_(static_cast<std::size_t>(servers), 0) {
  QS_CHECK(servers >= 1 && split_threshold >= 1);
  QS_CHECK(shares.empty() || static_cast<int>(shares.size()) == servers);
  for (double s : shares) QS_CHECK(s > 0 && s < 1e300);
  // Equal shares are the balanced placement, exactly (the same integer rules below).
  const bool weighted =
      std::adjacent_find(shares.begin(), shares.end(), std::not_equal_to<>()) != shares.end();
  double total_share = 0;
  for (double s : shares) total_share += s;
  for (const TensorInfo& t : layout.tensors()) {
    auto& out = slices_[static_cast<std::size_t>(t.id)];
    const Bytes elems = t.bytes / t.element_size;
    const bool split = servers > 1 && t.bytes >= split_threshold && elems >= servers;
    if (split && weighted) {
      // Slice s ends at round(elems x (shares up to s) / total), at least one element each.
      Bytes offset = 0;
      double upto = 0;
      for (int s = 0; s < servers; ++s) {
        upto += shares[static_cast<std::size_t>(s)];
        Bytes end = s + 1 == servers
                        ? elems
                        : std::llround(static_cast<double>(elems) * upto / total_share);
        end = std::clamp<Bytes>(end, offset / t.element_size + 1, elems - (servers - 1 - s));
        const Bytes n = end * t.element_size - offset;
        out.push_back(Slice{s, Chunk{t.id, offset, n}});
        load_[static_cast<std::size_t>(s)] += n;
        offset += n;
      }
      QS_CHECK(offset == t.bytes);
    } else if (split) {
      // Equal element counts; the first (elems % M) servers take one extra element.
      Bytes offset = 0;
      for (int s = 0; s < servers; ++s) {
        Bytes n = (elems / servers + (s < elems % servers ? 1 : 0)) * t.element_size;
        out.push_back(Slice{s, Chunk{t.id, offset, n}});
        load_[static_cast<std::size_t>(s)] += n;
        offset += n;
      }
      QS_CHECK(offset == t.bytes);
    } else if (weighted) {
      // The server whose load over its share is least (ties: lowest id).
      std::size_t best = 0;
      for (std::size_t s = 1; s < load_.size(); ++s) {
        if (static_cast<double>(load_[s]) * shares[best] <
            static_cast<double>(load_[best]) * shares[s])
          best = s;
      }
      out.push_back(Slice{static_cast<int>(best), Chunk{t.id, 0, t.bytes}});
      load_[best] += t.bytes;
    } else {
      auto it = std::min_element(load_.begin(), load_.end());
      int s = static_cast<int>(it - load_.begin());
      out.push_back(Slice{s, Chunk{t.id, 0, t.bytes}});
      *it += t.bytes;
    }
  }
}

const Slice* Placement::owning_slice(const Chunk& c, int server) const {
  if (c.tensor < 0 || c.tensor >= static_cast<TensorId>(slices_.size()) || c.offset < 0 ||
      c.length < 0)
    return nullptr;
  // The slices are in offset order and tile the tensor: the one holding c.offset is the
  // last that starts at or before it (a binary search: a tensor has up to M slices).
  const auto& slices = slices_[static_cast<std::size_t>(c.tensor)];
  auto it = std::upper_bound(slices.begin(), slices.end(), c.offset,
                             [](Bytes off, const Slice& s) { return off < s.chunk.offset; });
  if (it == slices.begin()) return nullptr;
  const Slice& s = *(it - 1);
  if (s.server == server && c.end() <= s.chunk.end()) return &s;
  return nullptr;
}

int Placement::server_of(TensorId id, Bytes offset) const {
  for (const Slice& s : slices(id)) {
    if (offset >= s.chunk.offset && offset < s.chunk.end()) return s.server;
  }
  QS_CHECK_MSG(false, "offset outside tensor");
  return -1;
}

Status check_exact_cover(std::vector<Chunk> chunks, const TensorLayout& layout) {
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.offset < b.offset;
  });
  std::size_t i = 0;
  for (const TensorInfo& t : layout.tensors()) {
    Bytes next = 0;
    for (; i < chunks.size() && chunks[i].tensor == t.id; ++i) {
      if (chunks[i].offset != next) {
        std::string msg = "tensor ";  // appended, not `"x" + std::string` (GCC 105329)
        msg.append(std::to_string(t.id)).append(" byte ").append(std::to_string(next));
        msg.append(chunks[i].offset > next ? " missing" : " covered twice");
        return internal_error(std::move(msg));
      }
      next = chunks[i].end();
    }
    if (next != t.bytes) {
      std::string msg = "tensor ";
      msg.append(std::to_string(t.id)).append(": ").append(std::to_string(next)).append(" of ");
      msg.append(std::to_string(t.bytes)).append(" bytes covered");
      return internal_error(std::move(msg));
    }
  }
  if (i != chunks.size()) return internal_error("a chunk names an unknown tensor");
  return Status::ok();
}

std::vector<Chunk> split_chunk(const Chunk& c, Bytes max_bytes, Bytes align) {
  QS_CHECK(max_bytes >= 1 && align >= 1);
  Bytes step = std::max(align, max_bytes / align * align);
  std::vector<Chunk> out;
  out.reserve(static_cast<std::size_t>((c.length + step - 1) / step));
  for (Bytes off = 0; off < c.length; off += step) {
    out.push_back(Chunk{c.tensor, c.offset + off, std::min(step, c.length - off)});
  }
  return out;
}

// The knob every PS policy shares: where a tensor is split over all servers.
Status register_placement_knobs(PolicyRegistry& r) {
  return r.add({{.name = "split_threshold",
                 .flag = "--split-threshold",
                 .type = KnobType::kBytes,
                 .help = "tensors of at least this size are split over all servers",
                 .scales = true,
                 .field = knob_field(&PlacementOptions::split_threshold)}},
               {});
}

}  // namespace qs
