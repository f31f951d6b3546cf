// What every engine shares (quicksilver/runtime/communicator.h), and the wire codec of
// the all-reduce's gradients (communicator_util.h).
#include "quicksilver/runtime/communicator.h"

#include "../runtime_internal.h"
#include "communicator_util.h"

namespace qs::runtime {

std::size_t element_bytes(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSumFloat32:
      return 4;
    case ReduceOp::kSumFloat64:
    case ReduceOp::kMaxFloat64:
      return 8;
    case ReduceOp::kSumBFloat16:
    case ReduceOp::kSumFloat16:
      return 2;
  }
  return 0;
}

void all_reduce_floats(Communicator& comm, int link, float* data, std::size_t count,
                       transport::WireDType wire, std::vector<std::byte>& scratch,
                       const AllReduceCall& call) {
  if (wire == transport::WireDType::kFloat32) {
    comm.all_reduce(link, data, count, ReduceOp::kSumFloat32, call);
    return;
  }
  scratch.resize(count * 2);
  encode_floats(data, count, wire, scratch.data());
  comm.all_reduce(
      link, scratch.data(), count,
      wire == transport::WireDType::kBFloat16 ? ReduceOp::kSumBFloat16 : ReduceOp::kSumFloat16,
      call);
  decode_floats(scratch.data(), count, wire, data);
}

}  // namespace qs::runtime
