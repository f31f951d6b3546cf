// Helpers of the all-reduce runtime's units over any Communicator.
#pragma once

#include <cstddef>
#include <vector>

#include "quicksilver/runtime/communicator.h"
#include "quicksilver/transport/wire.h"

namespace qs::runtime {

// `count` floats at `data` summed across the ranks on `link`, in place, on the wire as
// `wire` says. Compression: the engine reduces 2-byte elements (ReduceOp::kSumBFloat16,
// kSumFloat16); this rank's values are rounded once, every partial sum is added in
// float32 and rounded as it is passed on, and every rank ends with the same rounded sums,
// widened back here. `scratch`: the caller's (one per thread).
void all_reduce_floats(Communicator& comm, int link, float* data, std::size_t count,
                       transport::WireDType wire, std::vector<std::byte>& scratch,
                       const AllReduceCall& call);

}  // namespace qs::runtime
