// The Quicksilver wire format: a fixed 32-byte frame header followed by `length` payload
// bytes. Mercury IV-C, Fig. 9 has "3 long integers (24 B)" of header per packet; version 2
// adds 8 bytes of end-to-end checksums (docs/reliability.md "Corruption"): 0.05 % of a
// 16 KiB packet.
//
// Layout (version 2), every integer little-endian, encoded and decoded byte by byte so the
// format does not depend on the host's endianness or on struct padding:
//
//   byte  size  field         meaning
//   0     1     magic_version high nibble: magic 0xC; low nibble: version (2)
//   1     1     kind          FrameKind below (bits 0-6); bit 7: the payload is checksummed
//   2     2     sender        worker id (push, hello from a worker) or server id
//   4     4     tensor        tensor id (TensorLayout order); 0 for control frames
//   8     4     iteration     training iteration the bytes belong to
//   12    4     length        payload bytes that follow the header
//   16    6     offset        byte offset inside the tensor (48 bits: up to 256 TiB)
//   22    2     priority      scheduling priority, 0 = most urgent
//   24    4     payload_crc   CRC32C of the payload bytes (crc32c.h); 0 when bit 7 of kind
//                             is clear (the sender runs without payload checksums)
//   28    4     header_crc    CRC32C of bytes 0..27, always
//
// The header's CRC is checked before anything else, so a corrupted offset, length or
// tensor never directs a payload byte anywhere; the payload's is computed as the bytes
// arrive and checked before the frame is delivered (Connection), so a corrupted gradient
// or sum is never summed into a result, acknowledged or handed to the training loop.
//
// Kinds and their payloads:
//   push      worker -> server  `length` bytes of gradient, tensor[offset, offset+length)
//   pull      server -> worker  `length` bytes of the aggregated sum of the same range
//   ack       server -> worker  no payload; (tensor, offset, length, iteration) name the
//                               push whose bytes the server now holds (credit-based policies)
//   hello     both directions   HelloBody (24 bytes) below; the first frame on a connection
//   bye       both directions   no payload; orderly end of the session
//   error     both directions   UTF-8 text (at most kMaxErrorText bytes), then the sender
//                               closes the connection
//   heartbeat both directions   no payload; sent on a connection that carried nothing for a
//                               while, so that silence means a stalled peer or link
//
// decode_header() checks what the header alone can tell (its checksum, magic, version,
// kind, and the payload length that a control kind allows); validate_data_header() checks
// a push or pull against what the receiver knows (tensor, bounds, alignment, iteration
// window, sender). Every failure is a kProtocolError whose message starts "bad header
// field '<name>'".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::transport {

inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::uint8_t kMagic = 0xC;
inline constexpr std::uint8_t kVersion = 2;
inline constexpr std::uint64_t kMaxOffset = (std::uint64_t{1} << 48) - 1;
inline constexpr std::uint32_t kMaxErrorText = 4096;
inline constexpr std::uint32_t kHelloBodySize = 24;

enum class FrameKind : std::uint8_t {
  kPush = 1,
  kPull = 2,
  kAck = 3,
  kHello = 4,
  kBye = 5,
  kError = 6,
  kHeartbeat = 7,
};
const char* frame_kind_name(FrameKind k);

// What a gradient element is on the wire (a job setting, the same on every node: it is
// hashed into the hello). float32 moves the model's float32 bytes as they are; bfloat16
// and float16 ("compression") halve the bytes: the worker rounds each gradient element
// to nearest even as it pushes, the server converts as it adds and sums in float32, and
// sends the sum rounded the same way; the worker widens it as it lands. Push, ack and pull
// headers then count offsets and lengths in wire bytes (2 per element).
enum class WireDType : std::uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };
const char* wire_dtype_name(WireDType d);  // "float32", "bf16", "fp16"
int wire_dtype_size(WireDType d);          // bytes per element on the wire
// "none"/"float32", "bf16"/"bfloat16", "fp16"/"float16".
Result<WireDType> parse_wire_dtype(const std::string& text);

// The header fields a receiver checks, for messages and tests.
enum class HeaderField {
  kMagic,
  kVersion,
  kKind,
  kSender,
  kTensor,
  kIteration,
  kLength,
  kOffset,
  kPriority,
  kChecksum,
};
const char* header_field_name(HeaderField f);
// kProtocolError "bad header field '<name>': <detail>".
Status header_error(HeaderField f, const std::string& detail);

struct Header {
  FrameKind kind = FrameKind::kPush;
  std::uint16_t sender = 0;
  std::uint32_t tensor = 0;
  std::uint32_t iteration = 0;
  std::uint32_t length = 0;
  std::uint64_t offset = 0;  // < 2^48
  std::uint16_t priority = 0;
  // The payload's CRC32C, when `checksummed` (set by Connection as it sends; checked by it
  // as it receives). Control frames without payload carry crc32c of nothing: 0.
  bool checksummed = false;
  std::uint32_t payload_crc = 0;

  friend bool operator==(const Header&, const Header&) = default;
};

using HeaderBytes = std::array<std::byte, kHeaderSize>;

// Precondition: h.offset <= kMaxOffset (a programming error otherwise: QS_CHECK). Computes
// the header's own checksum.
HeaderBytes encode_header(const Header& h);
// Checks the header's checksum, then magic, version, kind and the length a control kind
// allows (ack, bye and heartbeat: 0 bytes of payload; hello: kHelloBodySize; error: at
// most kMaxErrorText).
Result<Header> decode_header(const std::byte* bytes);

// The hello payload: both sides must agree on all of it or the session is refused.
struct HelloBody {
  std::uint32_t workers = 0;
  std::uint32_t servers = 0;
  std::uint64_t profile_hash = 0;  // hash of the job profile (tensors and sizes)
  std::uint64_t config_hash = 0;   // hash of the policy name and options that shape units
  friend bool operator==(const HelloBody&, const HelloBody&) = default;
};
std::array<std::byte, kHelloBodySize> encode_hello(const HelloBody& b);
HelloBody decode_hello(const std::byte* bytes);

// What a receiver knows about data frames (push or pull) it may accept.
struct DataRules {
  FrameKind kind = FrameKind::kPush;  // the only data kind accepted here
  std::vector<Bytes> tensor_bytes;    // size of each known tensor, by id
  std::vector<int> element_size;      // bytes per element, by id (alignment of offset/length)
  std::uint32_t max_length = 0;       // largest payload accepted (0: no limit beyond tensor)
  std::uint32_t min_iteration = 0;    // accepted iterations: [min_iteration, max_iteration]
  std::uint32_t max_iteration = 0;
  std::uint16_t expected_sender = 0;  // the peer this connection belongs to
  std::uint16_t num_priorities = 0;   // priorities 0..num_priorities-1
};

// Checks a decoded data header against `rules`: kind, sender, known tensor, offset and
// length inside the tensor and aligned to its element size, non-empty, not above
// max_length, iteration inside the window, priority in range. The first failure is
// returned as header_error(field, ...).
Status validate_data_header(const Header& h, const DataRules& rules);

// Payload bytes that follow this header on the wire (an ack's length names the
// acknowledged bytes; it carries none).
std::uint32_t wire_payload_length(const Header& h);

// FNV-1a 64-bit: the hash hello bodies carry.
std::uint64_t fnv1a64(std::string_view data, std::uint64_t seed = 14695981039346656037ull);

}  // namespace qs::transport
