// Fuzz inputs as a sender would seal them (wire.h, version 2): most random bytes fail a
// header's CRC32C at once, which would keep a fuzzer from ever reaching the fields behind
// it. seal_frames() walks `data` as a stream of frames and writes each header's checksums
// (the payload's when the header's flag asks for one and the payload is all there). The
// input's last header byte can opt out, so that corruption is fuzzed too: 0xEF leaves the
// whole header as it is; 0xEE leaves the payload's checksum as it is (and seals the header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quicksilver/transport/crc32c.h"
#include "quicksilver/transport/wire.h"

namespace qs::transport {

inline void put_le32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

inline std::vector<std::uint8_t> seal_frames(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> out(data, data + size);
  std::size_t at = 0;
  while (size - at >= kHeaderSize) {
    std::uint8_t* h = out.data() + at;
    const std::uint32_t length =
        h[12] | (h[13] << 8) | (h[14] << 16) | (static_cast<std::uint32_t>(h[15]) << 24);
    const bool ack = (h[1] & 0x7f) == static_cast<std::uint8_t>(FrameKind::kAck);
    const std::uint64_t payload = ack ? 0 : length;
    const std::uint8_t mark = h[kHeaderSize - 1];
    if (mark != 0xEF) {
      if (mark == 0xEE) {
        // the payload's checksum as the input has it
      } else if ((h[1] & 0x80) == 0) {
        put_le32(h + 24, 0);
      } else if (size - at - kHeaderSize >= payload) {
        put_le32(h + 24, crc32c(0, h + kHeaderSize, static_cast<std::size_t>(payload)));
      }
      put_le32(h + 28, crc32c(0, h, 28));
    }
    at += kHeaderSize;
    if (size - at < payload) break;
    at += static_cast<std::size_t>(payload);
  }
  return out;
}

}  // namespace qs::transport
