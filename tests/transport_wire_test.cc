// The 24-byte frame header: exact byte layout, round trip, and rejection of every bad field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(Wire, LayoutIsLittleEndianAndExactly24Bytes) {
  static_assert(kHeaderSize == 24);
  const HeaderBytes b = encode_header(sample());
  const unsigned char want[24] = {0xC1, 0x01, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03,
                                  0x0a, 0x09, 0x08, 0x07, 0x00, 0x10, 0x00, 0x00,
                                  0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1, 0x0c, 0x0b};
  for (int i = 0; i < 24; ++i) EXPECT_EQ(static_cast<unsigned char>(b[i]), want[i]) << "byte " << i;
}

TEST(Wire, RoundTripsEveryKind) {
  for (FrameKind k : {FrameKind::kPush, FrameKind::kPull, FrameKind::kAck, FrameKind::kHello,
                      FrameKind::kBye, FrameKind::kError}) {
    Header h = sample();
    h.kind = k;
    if (k == FrameKind::kHello) h.length = kHelloBodySize;
    if (k == FrameKind::kBye) h.length = 0;
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
  EXPECT_THAT(decode_header(b.data()).status().message(), HasSubstr("field 'magic'"));
  b[0] = std::byte{0xC2};
  EXPECT_THAT(decode_header(b.data()).status().message(), HasSubstr("field 'version'"));
  b = encode_header(sample());
  for (int k : {0, 7, 255}) {
    b[1] = static_cast<std::byte>(k);
    auto d = decode_header(b.data());
    EXPECT_EQ(d.status().code(), StatusCode::kProtocolError);
    EXPECT_THAT(d.status().message(), HasSubstr("field 'kind'"));
  }
  Header h = sample();
  h.kind = FrameKind::kHello;
  h.length = 23;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(), HasSubstr("field 'length'"));
  h.kind = FrameKind::kBye;
  h.length = 1;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(), HasSubstr("field 'length'"));
  h.kind = FrameKind::kError;
  h.length = kMaxErrorText + 1;
  EXPECT_THAT(decode_header(encode_header(h).data()).status().message(), HasSubstr("field 'length'"));
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
      {"offset", [](Header& h) { h.offset = 2; }},            // misaligned
      {"length", [](Header& h) { h.length = 0; }},
      {"length", [](Header& h) { h.length = 2052; }},          // above max_length
      {"length", [](Header& h) { h.offset = 3072; h.length = 2048; }},  // leaves the tensor
      {"length", [](Header& h) { h.length = 6; }},             // misaligned
      {"length", [](Header& h) { h.tensor = 1; h.offset = 96; h.length = 8; }},
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
