// Tensor layout and byte placement: the static facts every scheduler and both engines share.
//
// TensorLayout flattens a Profile's tensors into ids 0..T-1 in forward order (so a smaller
// id is more urgent, like a smaller layer index). Placement decides which parameter server
// owns which bytes, so that load balances (DESIGN.md "Network model"): as MXNet's kvstore
// does, a tensor of at least `split_threshold` bytes is cut into M contiguous slices, one
// per server; a smaller tensor goes whole to the currently least-loaded server (ties:
// lowest server id), in forward order. Both engines and every policy use the same
// placement, so a unit never straddles two servers.
// With shares (the simulator's --server-shares; Mercury Fig. 21(b), servers not in a
// perfect load balance), server s holds about shares[s] / sum of the bytes instead: a split
// tensor's slices are in proportion to the shares, and a small tensor goes to the server
// whose load over its share is least. Equal shares give the balanced placement exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "quicksilver/core/units.h"
#include "quicksilver/model/profile.h"

namespace qs {

using TensorId = std::int32_t;

// A contiguous byte range of one tensor.
struct Chunk {
  TensorId tensor = 0;
  Bytes offset = 0;
  Bytes length = 0;

  Bytes end() const { return offset + length; }
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

struct TensorInfo {
  TensorId id = 0;
  int layer = 0;  // index into Profile::layers
  Bytes bytes = 0;
  int element_size = 4;
};

class TensorLayout {
 public:
  explicit TensorLayout(const Profile& profile);

  int num_layers() const { return static_cast<int>(layer_tensors_.size()); }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  const TensorInfo& tensor(TensorId id) const { return tensors_[static_cast<std::size_t>(id)]; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Tensor ids of a layer, in declaration order (contiguous ids).
  TensorId first_tensor(int layer) const {
    return layer_tensors_[static_cast<std::size_t>(layer)].first;
  }
  TensorId end_tensor(int layer) const {
    return layer_tensors_[static_cast<std::size_t>(layer)].second;
  }
  Bytes layer_bytes(int layer) const { return layer_bytes_[static_cast<std::size_t>(layer)]; }
  Bytes total_bytes() const { return total_bytes_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<std::pair<TensorId, TensorId>> layer_tensors_;
  std::vector<Bytes> layer_bytes_;
  Bytes total_bytes_ = 0;
};

// One server's share of a tensor.
struct Slice {
  int server = 0;
  Chunk chunk;
};

class Placement {
 public:
  static constexpr Bytes kDefaultSplitThreshold = 1 * kMiB;

  // Precondition: servers >= 1, split_threshold >= 1; shares empty or one positive finite
  // value per server.
  Placement(const TensorLayout& layout, int servers, Bytes split_threshold = kDefaultSplitThreshold,
            const std::vector<double>& shares = {});

  int num_servers() const { return servers_; }
  // The slices of a tensor, in offset order (one entry when the tensor is not split).
  const std::vector<Slice>& slices(TensorId id) const {
    return slices_[static_cast<std::size_t>(id)];
  }
  // Server owning byte `offset` of tensor `id`.
  int server_of(TensorId id, Bytes offset) const;
  // The slice of tensor `id` that `server` owns and that holds all of `c` (c.tensor ==
  // id); null when no single slice of that server does (the range straddles servers,
  // belongs to another one, or leaves the tensor). The policies' check and the server's
  // validation of every push ask this one question.
  const Slice* owning_slice(const Chunk& c, int server) const;
  Bytes server_bytes(int server) const { return load_[static_cast<std::size_t>(server)]; }

 private:
  int servers_;
  std::vector<std::vector<Slice>> slices_;
  std::vector<Bytes> load_;
};

// Checks that `chunks` cover every byte of every tensor of `layout` exactly once (the
// engines' byte accounting); the error names the tensor and the first byte missing or
// covered twice.
Status check_exact_cover(std::vector<Chunk> chunks, const TensorLayout& layout);

// Cuts `slice` into pieces of at most `max_bytes`, aligned to `align` bytes except the
// last (max_bytes is rounded down to a multiple of align, at least align).
std::vector<Chunk> split_chunk(const Chunk& c, Bytes max_bytes, Bytes align = 4);

}  // namespace qs
