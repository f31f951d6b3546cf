// CRC32C (Castagnoli, the iSCSI / SCTP / ext4 checksum): the end-to-end check of every
// frame (wire.h, docs/reliability.md). TCP's 16-bit ones'-complement checksum only covers
// a segment between two TCP stacks; bytes corrupted above it (a proxy, a middlebox that
// re-segments, a NIC's offload, memory) arrive with a valid TCP checksum. CRC32C detects
// every burst of up to 32 bits and all 1-3 bit errors in frames far larger than ours.
//
// The x86-64 SSE4.2 instruction (chosen at run time, __builtin_cpu_supports) computes it,
// three streams interleaved on long buffers; elsewhere a portable slicing-by-8 table.
// Both give the same values (tests/transport_wire_test.cc checks them against each other
// and against RFC 3720's test vectors). Thread-safe: pure functions over constant tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qs::transport {

// Extends `crc` (the CRC32C of the bytes before; 0 for none) by n bytes at data.
// crc32c(crc32c(0, a), b) == crc32c(0, a followed by b).
std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t n);

// The portable implementation, whatever the CPU (for tests and benchmarks).
std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t n);

// Whether crc32c() uses the CPU's instruction ("sse4.2") or the table ("table").
const char* crc32c_implementation();

}  // namespace qs::transport
