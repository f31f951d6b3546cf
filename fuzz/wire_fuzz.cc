// libFuzzer target: the frame header codec (include/transport/quicksilver/transport/wire.h)
// over a stream of frames, as a receiver walks it: decode each 32-byte header, validate
// data headers against fixed rules, decode hello bodies, skip payloads. The input's
// headers are sealed first (seal.h: their checksums written, unless a header ends in 0xEE).
// Properties checked: a header that decodes re-encodes to the same bytes; a header that
// passes validate_data_header lies inside its tensor; nothing reads past the input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/wire.h"
#include "seal.h"

using namespace qs::transport;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* input, std::size_t size) {
  const std::vector<std::uint8_t> sealed = seal_frames(input, size);
  const std::uint8_t* data = sealed.data();
  DataRules rules;
  rules.kind = FrameKind::kPush;
  rules.tensor_bytes = {4096, 1 << 20, 6, 0};
  rules.element_size = {4, 2, 1, 4};
  rules.max_length = 64 * 1024;
  rules.min_iteration = 1;
  rules.max_iteration = 3;
  rules.expected_sender = 2;
  rules.num_priorities = 8;
  DataRules pulls = rules;
  pulls.kind = FrameKind::kPull;
  pulls.max_length = 0;

  std::size_t at = 0;
  while (size - at >= kHeaderSize) {
    const auto* bytes = reinterpret_cast<const std::byte*>(data + at);
    at += kHeaderSize;
    auto h = decode_header(bytes);
    if (!h) break;  // a receiver closes the connection on the first bad header
    const HeaderBytes again = encode_header(*h);
    QS_CHECK_MSG(std::memcmp(again.data(), bytes, kHeaderSize) == 0, "decode/encode round trip");
    for (const DataRules* r : {&rules, &pulls}) {
      if (validate_data_header(*h, *r).is_ok()) {
        QS_CHECK(h->tensor < r->tensor_bytes.size());
        QS_CHECK(h->length > 0 &&
                 h->offset + h->length <= static_cast<std::uint64_t>(r->tensor_bytes[h->tensor]));
        QS_CHECK(h->priority < r->num_priorities);
      }
    }
    const std::uint32_t payload = wire_payload_length(*h);
    if (size - at < payload) break;  // truncated: the stream ends inside the frame
    if (h->kind == FrameKind::kHello) {
      QS_CHECK(payload == kHelloBodySize);
      const HelloBody body = decode_hello(reinterpret_cast<const std::byte*>(data + at));
      QS_CHECK(decode_hello(encode_hello(body).data()) == body);
    }
    at += payload;
  }
  return 0;
}
