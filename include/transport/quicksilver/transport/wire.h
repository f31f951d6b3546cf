// The Quicksilver wire format: a fixed 24-byte frame header followed by `length` payload
// bytes (Mercury IV-C, Fig. 9: "3 long integers (24 B)" of header per packet).
//
// Layout (version 1), every integer little-endian, encoded and decoded byte by byte so the
// format does not depend on the host's endianness or on struct padding:
//
//   byte  size  field         meaning
//   0     1     magic_version high nibble: magic 0xC; low nibble: version (1)
//   1     1     kind          FrameKind below
//   2     2     sender        worker id (push, hello from a worker) or server id
//   4     4     tensor        tensor id (TensorLayout order); 0 for control frames
//   8     4     iteration     training iteration the bytes belong to
//   12    4     length        payload bytes that follow the header
//   16    6     offset        byte offset inside the tensor (48 bits: up to 256 TiB)
//   22    2     priority      scheduling priority, 0 = most urgent
//
// Kinds and their payloads:
//   push   worker -> server  `length` bytes of gradient, tensor[offset, offset+length)
//   pull   server -> worker  `length` bytes of the aggregated sum of the same range
//   ack    server -> worker  no payload; (tensor, offset, length, iteration) name the push
//                            whose bytes the server now holds (credit-based policies)
//   hello  both directions   HelloBody (24 bytes) below; the first frame on a connection
//   bye    both directions   no payload; orderly end of the session
//   error  both directions   UTF-8 text (at most kMaxErrorText bytes), then the sender
//                            closes the connection
//
// decode_header() checks what the header alone can tell (magic, version, kind, and the
// payload length that a control kind allows); validate_data_header() checks a push or pull
// against what the receiver knows (tensor, bounds, alignment, iteration window, sender).
// Every failure is a kProtocolError whose message starts "bad header field '<name>'".
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

inline constexpr std::size_t kHeaderSize = 24;
inline constexpr std::uint8_t kMagic = 0xC;
inline constexpr std::uint8_t kVersion = 1;
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
};
const char* frame_kind_name(FrameKind k);

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

  friend bool operator==(const Header&, const Header&) = default;
};

using HeaderBytes = std::array<std::byte, kHeaderSize>;

// Precondition: h.offset <= kMaxOffset (a programming error otherwise: QS_CHECK).
HeaderBytes encode_header(const Header& h);
// Checks magic, version, kind and the length a control kind allows (ack and bye: 0; hello:
// kHelloBodySize; error: at most kMaxErrorText).
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
  FrameKind kind = FrameKind::kPush;   // the only data kind accepted here
  std::vector<Bytes> tensor_bytes;     // size of each known tensor, by id
  std::vector<int> element_size;       // bytes per element, by id (alignment of offset/length)
  std::uint32_t max_length = 0;        // largest payload accepted (0: no limit beyond tensor)
  std::uint32_t min_iteration = 0;     // accepted iterations: [min_iteration, max_iteration]
  std::uint32_t max_iteration = 0;
  std::uint16_t expected_sender = 0;   // the peer this connection belongs to
  std::uint16_t num_priorities = 0;    // priorities 0..num_priorities-1
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
