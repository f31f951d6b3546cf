#include "quicksilver/transport/wire.h"

#include "quicksilver/core/check.h"
#include "quicksilver/transport/crc32c.h"

namespace qs::transport {
namespace {

void put_le(std::byte* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

constexpr std::uint8_t kChecksummedBit = 0x80;  // in the kind byte
constexpr std::size_t kCrcOffset = 28;          // the header's checksum covers bytes [0, 28)

std::string hex32(std::uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xf];
  return s;
}

}  // namespace

const char* frame_kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::kPush:
      return "push";
    case FrameKind::kPull:
      return "pull";
    case FrameKind::kAck:
      return "ack";
    case FrameKind::kHello:
      return "hello";
    case FrameKind::kBye:
      return "bye";
    case FrameKind::kError:
      return "error";
    case FrameKind::kHeartbeat:
      return "heartbeat";
  }
  return "?";
}

const char* header_field_name(HeaderField f) {
  switch (f) {
    case HeaderField::kMagic:
      return "magic";
    case HeaderField::kVersion:
      return "version";
    case HeaderField::kKind:
      return "kind";
    case HeaderField::kSender:
      return "sender";
    case HeaderField::kTensor:
      return "tensor";
    case HeaderField::kIteration:
      return "iteration";
    case HeaderField::kLength:
      return "length";
    case HeaderField::kOffset:
      return "offset";
    case HeaderField::kPriority:
      return "priority";
    case HeaderField::kChecksum:
      return "checksum";
  }
  return "?";
}

Status header_error(HeaderField f, const std::string& detail) {
  return protocol_error(std::string("bad header field '") + header_field_name(f) + "': " + detail);
}

HeaderBytes encode_header(const Header& h) {
  QS_CHECK(h.offset <= kMaxOffset);
  HeaderBytes b{};
  b[0] = static_cast<std::byte>((kMagic << 4) | kVersion);
  b[1] = static_cast<std::byte>(static_cast<std::uint8_t>(h.kind) |
                                (h.checksummed ? kChecksummedBit : 0));
  put_le(&b[2], h.sender, 2);
  put_le(&b[4], h.tensor, 4);
  put_le(&b[8], h.iteration, 4);
  put_le(&b[12], h.length, 4);
  put_le(&b[16], h.offset, 6);
  put_le(&b[22], h.priority, 2);
  put_le(&b[24], h.checksummed ? h.payload_crc : 0, 4);
  put_le(&b[28], crc32c(0, b.data(), kCrcOffset), 4);
  return b;
}

Result<Header> decode_header(const std::byte* b) {
  // First: a header whose bytes changed in transit says nothing reliable (magic included).
  const auto want = static_cast<std::uint32_t>(get_le(&b[kCrcOffset], 4));
  if (const std::uint32_t got = crc32c(0, b, kCrcOffset); got != want) {
    return header_error(HeaderField::kChecksum,
                        "the header's CRC32C is " + hex32(got) + ", its checksum field says " +
                            hex32(want) +
                            ": corrupted in transit (or not a Quicksilver peer, or one "
                            "that speaks another version)");
  }
  const auto mv = static_cast<std::uint8_t>(b[0]);
  if ((mv >> 4) != kMagic) {
    return header_error(HeaderField::kMagic, "0x" + std::to_string(mv >> 4) +
                                                 " is not the Quicksilver magic 0xC (not a "
                                                 "Quicksilver peer, or the stream lost sync)");
  }
  if ((mv & 0xf) != kVersion) {
    return header_error(HeaderField::kVersion, "version " + std::to_string(mv & 0xf) +
                                                   " unsupported (this build speaks " +
                                                   std::to_string(kVersion) + ")");
  }
  const auto kind = static_cast<std::uint8_t>(static_cast<std::uint8_t>(b[1]) & ~kChecksummedBit);
  if (kind < static_cast<std::uint8_t>(FrameKind::kPush) ||
      kind > static_cast<std::uint8_t>(FrameKind::kHeartbeat)) {
    return header_error(HeaderField::kKind, "unknown frame kind " + std::to_string(kind));
  }
  Header h;
  h.kind = static_cast<FrameKind>(kind);
  h.sender = static_cast<std::uint16_t>(get_le(&b[2], 2));
  h.tensor = static_cast<std::uint32_t>(get_le(&b[4], 4));
  h.iteration = static_cast<std::uint32_t>(get_le(&b[8], 4));
  h.length = static_cast<std::uint32_t>(get_le(&b[12], 4));
  h.offset = get_le(&b[16], 6);
  h.priority = static_cast<std::uint16_t>(get_le(&b[22], 2));
  h.checksummed = (static_cast<std::uint8_t>(b[1]) & kChecksummedBit) != 0;
  h.payload_crc = static_cast<std::uint32_t>(get_le(&b[24], 4));
  if (!h.checksummed && h.payload_crc != 0) {
    return header_error(HeaderField::kChecksum,
                        "a payload checksum without the flag that says it is one");
  }
  const char* kn = frame_kind_name(h.kind);
  switch (h.kind) {
    case FrameKind::kAck:
    case FrameKind::kBye:
    case FrameKind::kHeartbeat:
      // An ack's length names the acknowledged bytes; it carries no payload, so the
      // receiver reads none. A bye or a heartbeat carries nothing at all.
      if (h.kind != FrameKind::kAck && h.length != 0) {
        return header_error(HeaderField::kLength, std::string(kn) + " must have length 0, got " +
                                                      std::to_string(h.length));
      }
      break;
    case FrameKind::kHello:
      if (h.length != kHelloBodySize) {
        return header_error(HeaderField::kLength, "hello must carry " +
                                                      std::to_string(kHelloBodySize) +
                                                      " bytes, got " + std::to_string(h.length));
      }
      break;
    case FrameKind::kError:
      if (h.length > kMaxErrorText) {
        return header_error(HeaderField::kLength, "error text of " + std::to_string(h.length) +
                                                      " bytes exceeds " +
                                                      std::to_string(kMaxErrorText));
      }
      break;
    case FrameKind::kPush:
    case FrameKind::kPull:
      break;
  }
  return h;
}

std::array<std::byte, kHelloBodySize> encode_hello(const HelloBody& v) {
  std::array<std::byte, kHelloBodySize> b{};
  put_le(&b[0], v.workers, 4);
  put_le(&b[4], v.servers, 4);
  put_le(&b[8], v.profile_hash, 8);
  put_le(&b[16], v.config_hash, 8);
  return b;
}

HelloBody decode_hello(const std::byte* b) {
  HelloBody v;
  v.workers = static_cast<std::uint32_t>(get_le(&b[0], 4));
  v.servers = static_cast<std::uint32_t>(get_le(&b[4], 4));
  v.profile_hash = get_le(&b[8], 8);
  v.config_hash = get_le(&b[16], 8);
  return v;
}

Status validate_data_header(const Header& h, const DataRules& r) {
  if (h.kind != r.kind) {
    return header_error(HeaderField::kKind, std::string("expected a ") + frame_kind_name(r.kind) +
                                                " frame here, got " + frame_kind_name(h.kind));
  }
  if (h.sender != r.expected_sender) {
    return header_error(HeaderField::kSender, "sender " + std::to_string(h.sender) +
                                                  " on the connection of peer " +
                                                  std::to_string(r.expected_sender));
  }
  if (h.tensor >= r.tensor_bytes.size()) {
    return header_error(HeaderField::kTensor, "unknown tensor " + std::to_string(h.tensor) +
                                                  " (the job has " +
                                                  std::to_string(r.tensor_bytes.size()) + ")");
  }
  const auto tbytes = static_cast<std::uint64_t>(r.tensor_bytes[h.tensor]);
  const auto align =
      static_cast<std::uint64_t>(r.element_size.empty() ? 1 : r.element_size[h.tensor]);
  if (h.length == 0) return header_error(HeaderField::kLength, "empty data frame");
  if (r.max_length != 0 && h.length > r.max_length) {
    return header_error(HeaderField::kLength, "length " + std::to_string(h.length) +
                                                  " exceeds the largest expected unit " +
                                                  std::to_string(r.max_length));
  }
  if (h.offset >= tbytes || h.offset % align != 0) {
    return header_error(HeaderField::kOffset,
                        "offset " + std::to_string(h.offset) + " outside tensor " +
                            std::to_string(h.tensor) + " of " + std::to_string(tbytes) +
                            " bytes or not aligned to " + std::to_string(align));
  }
  if (h.length > tbytes - h.offset || h.length % align != 0) {
    return header_error(HeaderField::kLength,
                        "range [" + std::to_string(h.offset) + ", " +
                            std::to_string(h.offset + h.length) + ") leaves tensor " +
                            std::to_string(h.tensor) + " of " + std::to_string(tbytes) +
                            " bytes or is not aligned to " + std::to_string(align));
  }
  if (h.iteration < r.min_iteration || h.iteration > r.max_iteration) {
    return header_error(HeaderField::kIteration, "iteration " + std::to_string(h.iteration) +
                                                     " outside the expected window [" +
                                                     std::to_string(r.min_iteration) + ", " +
                                                     std::to_string(r.max_iteration) + "]");
  }
  if (h.priority >= r.num_priorities) {
    return header_error(HeaderField::kPriority, "priority " + std::to_string(h.priority) +
                                                    " out of range [0, " +
                                                    std::to_string(r.num_priorities) + ")");
  }
  return Status::ok();
}

std::uint32_t wire_payload_length(const Header& h) {
  return h.kind == FrameKind::kAck ? 0 : h.length;
}

std::uint64_t fnv1a64(std::string_view data, std::uint64_t h) {
  for (char c : data) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

const char* wire_dtype_name(WireDType d) {
  switch (d) {
    case WireDType::kFloat32:
      return "float32";
    case WireDType::kBFloat16:
      return "bf16";
    case WireDType::kFloat16:
      return "fp16";
  }
  return "?";
}

int wire_dtype_size(WireDType d) { return d == WireDType::kFloat32 ? 4 : 2; }

Result<WireDType> parse_wire_dtype(const std::string& text) {
  if (text == "none" || text == "float32" || text.empty()) return WireDType::kFloat32;
  if (text == "bf16" || text == "bfloat16") return WireDType::kBFloat16;
  if (text == "fp16" || text == "float16") return WireDType::kFloat16;
  return invalid_argument("compression '" + text + "': give none, bf16 or fp16");
}

}  // namespace qs::transport
