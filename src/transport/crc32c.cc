#include "quicksilver/transport/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace qs::transport {
namespace {

constexpr std::uint32_t kPoly = 0x82f63b78u;  // Castagnoli, bit-reflected

using Table = std::array<std::array<std::uint32_t, 256>, 8>;

// Slicing-by-8: table[0] is the byte-at-a-time table; table[k][b] is the register's change
// when byte b is followed by k zero bytes.
constexpr Table make_table() {
  Table t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr Table kTable = make_table();

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The register after n more bytes (no pre- or post-inversion).
std::uint32_t raw_portable(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  while (n >= 8) {
    const std::uint64_t w = load_le64(p) ^ crc;
    crc = kTable[7][w & 0xff] ^ kTable[6][(w >> 8) & 0xff] ^ kTable[5][(w >> 16) & 0xff] ^
          kTable[4][(w >> 24) & 0xff] ^ kTable[3][(w >> 32) & 0xff] ^ kTable[2][(w >> 40) & 0xff] ^
          kTable[1][(w >> 48) & 0xff] ^ kTable[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ kTable[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// Appending `len` zero bytes is linear in the register: the 32 columns of that operator,
// applied a byte of the register at a time through four 256-entry tables. Lets three
// streams run interleaved (the instruction's latency is 3 cycles, its throughput 1) and be
// joined: crc(A B) = shift_|B|(crc(A)) ^ crc_from_zero(B).
struct Shift {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  explicit Shift(std::size_t len) {
    static const unsigned char kZeros[8192] = {};
    std::uint32_t column[32];
    for (int i = 0; i < 32; ++i) {
      std::uint32_t r = std::uint32_t{1} << i;
      for (std::size_t left = len; left > 0;) {
        const std::size_t k = left < sizeof kZeros ? left : sizeof kZeros;
        r = raw_portable(r, kZeros, k);
        left -= k;
      }
      column[i] = r;
    }
    for (std::uint32_t b = 0; b < 256; ++b) {
      for (int byte = 0; byte < 4; ++byte) {
        std::uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) v ^= column[8 * byte + bit];
        }
        t[static_cast<std::size_t>(byte)][b] = v;
      }
    }
  }
  std::uint32_t operator()(std::uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

constexpr std::size_t kLong = 8192, kShort = 256;

// Three streams of `block` bytes at a time, while n holds three blocks; advances p and n.
__attribute__((target("sse4.2"))) std::uint64_t three_way(std::uint64_t c0, const unsigned char*& p,
                                                          std::size_t& n, std::size_t block,
                                                          const Shift& shift) {
  while (n >= 3 * block) {
    std::uint64_t c1 = 0, c2 = 0;
    for (const unsigned char* end = p + block; p < end; p += 8) {
      std::uint64_t a, b, c;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + block, 8);
      std::memcpy(&c, p + 2 * block, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    c0 = shift(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
    c0 = shift(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c2);
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) std::uint32_t raw_sse42(std::uint32_t crc, const unsigned char* p,
                                                          std::size_t n) {
  static const Shift long_shift(kLong), short_shift(kShort);
  std::uint64_t c0 = crc;
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7) != 0) {
    c0 = _mm_crc32_u8(static_cast<std::uint32_t>(c0), *p++);
    --n;
  }
  c0 = three_way(c0, p, n, kLong, long_shift);
  c0 = three_way(c0, p, n, kShort, short_shift);
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t a;
    std::memcpy(&a, p, 8);
    c0 = _mm_crc32_u64(c0, a);
  }
  while (n-- > 0) c0 = _mm_crc32_u8(static_cast<std::uint32_t>(c0), *p++);
  return static_cast<std::uint32_t>(c0);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t n) {
  return ~raw_portable(~crc, static_cast<const unsigned char*>(data), n);
}

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t n) {
#if defined(__x86_64__)
  if (have_sse42()) return ~raw_sse42(~crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_portable(crc, data, n);
}

const char* crc32c_implementation() {
#if defined(__x86_64__)
  if (have_sse42()) return "sse4.2";
#endif
  return "table";
}

}  // namespace qs::transport
