// The 32-byte frame header: exact byte layout, round trip, and rejection of every bad field;
// its checksums (CRC32C: test vectors, the hardware path against the table).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "quicksilver/transport/crc32c.h"
#include "quicksilver/transport/wire.h"

namespace qs::transport {
namespace {

using ::testing::HasSubstr;

Header sample() {
  Header h;
  h.kind = FrameKind::kPush;
  h.sender = 0x0102;
  h.tensor = 0x03040506;
  h.iteration = 0x0708090a;
  h.length = 0x00001000;
  h.offset = 0x0000a1a2a3a4a5a6ull;
  h.priority = 0x0b0c;
  return h;
}

DataRules rules() {
  DataRules r;
  r.kind = FrameKind::kPush;
  r.tensor_bytes = {4096, 100, 64};
  r.element_size = {4, 4, 4};
  r.max_length = 2048;
  r.min_iteration = 3;
  r.max_iteration = 4;
  r.expected_sender = 2;
  r.num_priorities = 4;
  return r;
}

// Rewrites the header checksum of hand-edited bytes (with the portable CRC: an
// implementation independent of the one encode_header uses on this CPU).
void reseal(HeaderBytes& b) {
  const std::uint32_t c = crc32c_portable(0, b.data(), 28);
  for (int i = 0; i < 4; ++i) b[28 + i] = static_cast<std::byte>((c >> (8 * i)) & 0xff);
}

Header good() {
  Header h;
  h.kind = FrameKind::kPush;
  h.sender = 2;
  h.tensor = 0;
  h.iteration = 3;
  h.offset = 1024;
  h.length = 2048;
  h.priority = 0;
  return h;
}

TEST(Wire, LayoutIsLittleEndianAndExactly32Bytes) {
  static_assert(kHeaderSize == 32);
  Header h = sample();
  h.checksummed = true;
  h.payload_crc = 0xd1d2d3d4;
  const HeaderBytes b = encode_header(h);
  unsigned char want[32] = {0xC2, 0x81, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03, 0x0a, 0x09,
                            0x08, 0x07, 0x00, 0x10, 0x00, 0x00, 0xa6, 0xa5, 0xa4, 0xa3,
                            0xa2, 0xa1, 0x0c, 0x0b, 0xd4, 0xd3, 0xd2, 0xd1};
  const std::uint32_t crc = crc32c_portable(0, want, 28);
  for (int i = 0; i < 4; ++i) want[28 + i] = static_cast<unsigned char>(crc >> (8 * i));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(static_cast<unsigned char>(b[i]), want[i]) << "byte " << i;
  // Without a payload checksum: the flag clear and the field zero.
  const HeaderBytes plain = encode_header(sample());
  EXPECT_EQ(static_cast<unsigned char>(plain[1]), 0x01);
  for (int i = 24; i < 28; ++i) EXPECT_EQ(static_cast<unsigned char>(plain[i]), 0) << "byte " << i;
}

// RFC 3720 (iSCSI) B.4 test vectors and the usual check value; the CPU's instruction and
// the portable table agree on every length and alignment, and a CRC extends in pieces.
TEST(Crc32c, MatchesTheStandardVectorsOnBothImplementations) {
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    dec[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  for (auto* f : {&crc32c, &crc32c_portable}) {
    EXPECT_EQ(f(0, "123456789", 9), 0xe3069283u);
    EXPECT_EQ(f(0, zeros.data(), 32), 0x8a9136aau);
    EXPECT_EQ(f(0, ones.data(), 32), 0x62a8ab43u);
    EXPECT_EQ(f(0, inc.data(), 32), 0x46dd794eu);
    EXPECT_EQ(f(0, dec.data(), 32), 0x113fdb5cu);
    EXPECT_EQ(f(0, nullptr, 0), 0u);
  }
  std::printf("[ detail ] crc32c implementation on this CPU: %s\n", crc32c_implementation());
  std::mt19937 rng(5);
  std::vector<unsigned char> buf(200'000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (int t = 0; t < 400; ++t) {
    const std::size_t off = rng() % 16, n = rng() % (t % 2 ? 100'000 : 2'000),
                      cut = n ? rng() % n : 0;
    const std::uint32_t whole = crc32c(0, buf.data() + off, n);
    ASSERT_EQ(whole, crc32c_portable(0, buf.data() + off, n))
        << "offset " << off << " length " << n;
    ASSERT_EQ(whole, crc32c(crc32c(0, buf.data() + off, cut), buf.data() + off + cut, n - cut));
  }
}

// Every single-bit flip of a header is caught by its checksum before any field is read, so
// a corrupted offset or length never directs a payload byte (TCP's checksum had passed it).
TEST(Wire, EveryBitFlipOfAHeaderIsCaught) {
  const HeaderBytes clean = encode_header(good());
  for (int bit = 0; bit < 8 * static_cast<int>(kHeaderSize); ++bit) {
    HeaderBytes b = clean;
    b[static_cast<std::size_t>(bit / 8)] ^= static_cast<std::byte>(1 << (bit % 8));
    auto d = decode_header(b.data());
    ASSERT_FALSE(d.is_ok()) << "bit " << bit;
    EXPECT_THAT(d.status().message(), HasSubstr("field 'checksum'")) << "bit " << bit;
  }
}

TEST(Wire, RoundTripsEveryKind) {
  for (FrameKind k : {FrameKind::kPush, FrameKind::kPull, FrameKind::kAck, FrameKind::kHello,
                      FrameKind::kBye, FrameKind::kError, FrameKind::kHeartbeat}) {
    Header h = sample();
    h.kind = k;
    h.checksummed = k != FrameKind::kPull;
    h.payload_crc = h.checksummed ? 0x01020304 : 0;
    if (k == FrameKind::kHello) h.length = kHelloBodySize;
    if (k == FrameKind::kBye || k == FrameKind::kHeartbeat) h.length = 0;
    if (k == FrameKind::kError) h.length = 10;
    h.offset = kMaxOffset;
    const HeaderBytes b = encode_header(h);
    auto d = decode_header(b.data());
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ(*d, h) << frame_kind_name(k);
  }
  HelloBody hb{4, 2, 0x1122334455667788ull, 0x99aabbccddeeff00ull};
  EXPECT_EQ(decode_hello(encode_hello(hb).data()), hb);
}

TEST(Wire, DecodeRejectsBadMagicVersionKindAndControlLengths) {
  HeaderBytes b = encode_header(sample());
  b[0] = std::byte{0x51};
  reseal(b);
  EXPECT_THAT(decode_header(b.data()).status().message(), HasSubstr("field 'magic'"));
  b[0] = std::byte{0xC1};  // version 1: the 24-byte header without checksums
  reseal(b);
  EXPECT_THAT(decode_header(b.data()).status().message(), HasSubstr("field 'version'"));
  b = encode_header(sample());
  for (int k : {0, 8, 127, 128, 255}) {
    b[1] = static_cast<std::byte>(k);
    reseal(b);
    auto d = decode_header(b.data());
    EXPECT_EQ(d.status().code(), StatusCode::kProtocolError);
    EXPECT_THAT(d.status().message(), HasSubstr("field 'kind'"));
  }
  Header h = sample();
  h.kind = FrameKind::kHello;
  h.length = 23;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(),
              HasSubstr("field 'length'"));
  h.kind = FrameKind::kBye;
  h.length = 1;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(),
              HasSubstr("field 'length'"));
  h.kind = FrameKind::kHeartbeat;
  h.length = 1;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(),
              HasSubstr("field 'length'"));
  h.kind = FrameKind::kError;
  h.length = kMaxErrorText + 1;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(),
              HasSubstr("field 'length'"));
  // A payload checksum without its flag is not a header this build writes.
  b = encode_header(sample());
  b[24] = std::byte{1};
  reseal(b);
  EXPECT_THAT(decode_header(b.data()).status().message(), HasSubstr("field 'checksum'"));
}

TEST(Wire, ValidateAcceptsAGoodDataHeader) {
  EXPECT_TRUE(validate_data_header(good(), rules()).is_ok());
  Header h = good();
  h.tensor = 2;
  h.offset = 60;
  h.length = 4;  // last element
  h.iteration = 4;
  h.priority = 3;
  EXPECT_TRUE(validate_data_header(h, rules()).is_ok());
}

TEST(Wire, ValidateRejectsEveryBadField) {
  struct Case {
    const char* field;
    void (*mutate)(Header&);
  };
  const Case cases[] = {
      {"kind", [](Header& h) { h.kind = FrameKind::kPull; }},
      {"sender", [](Header& h) { h.sender = 1; }},
      {"tensor", [](Header& h) { h.tensor = 3; }},
      {"tensor", [](Header& h) { h.tensor = 0xffffffffu; }},
      {"offset", [](Header& h) { h.offset = 4096; }},
      {"offset", [](Header& h) { h.offset = kMaxOffset; }},
      {"offset", [](Header& h) { h.offset = 2; }},  // misaligned
      {"length", [](Header& h) { h.length = 0; }},
      {"length", [](Header& h) { h.length = 2052; }},  // above max_length
      {"length",
       [](Header& h) {
         h.offset = 3072;
         h.length = 2048;
       }},                                          // leaves the tensor
      {"length", [](Header& h) { h.length = 6; }},  // misaligned
      {"length",
       [](Header& h) {
         h.tensor = 1;
         h.offset = 96;
         h.length = 8;
       }},
      {"iteration", [](Header& h) { h.iteration = 2; }},
      {"iteration", [](Header& h) { h.iteration = 5; }},
      {"priority", [](Header& h) { h.priority = 4; }},
  };
  for (const Case& c : cases) {
    Header h = good();
    c.mutate(h);
    Status s = validate_data_header(h, rules());
    EXPECT_EQ(s.code(), StatusCode::kProtocolError) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(std::string("field '") + c.field + "'")) << s.message();
  }
}

TEST(Wire, LengthPlusOffsetCannotOverflow) {
  DataRules r = rules();
  r.max_length = 0;
  Header h = good();
  h.offset = 4092;
  h.length = 0xfffffffcu;
  EXPECT_THAT(validate_data_header(h, r).message(), HasSubstr("field 'length'"));
}

}  // namespace
}  // namespace qs::transport
