// Aggregation micro-benchmark (issue 5, point 7): how fast the parameter server's in-place
// sum (qs::runtime::add_floats, the function Server::on_payload calls) adds packets into
// its accumulation buffer, against this machine's memcpy bandwidth measured in the same run
// on the same packets, the same destination and the same order (DESIGN.md "Measuring").
//
//   aggregation_bench [--reps=7] [--region-mib=64] [--packet-kib=32] [--workers=8] [--passes=2]
//
// Setup. An accumulation region of --region-mib (64 MiB: not cache-resident) is cut into
// --packet-kib packets (32 KiB). Each of --workers (8) workers has a 256 KiB read buffer
// (Connection's kReadBuffer) holding its frames back to back, header then payload, so a
// payload starts 24 bytes past a frame boundary (8-byte but not 32-byte aligned), as in
// the server, where on_payload gets its bytes from the connection's read buffer. Every
// worker contributes every packet once per pass. Two arrival orders:
//   lockstep      workers in step: the server reads 256 KiB (8 packets) from one
//                 connection, then the same 8 packets from the next, ...; the 256 KiB of
//                 the region being summed stays in L2 across the 8 contributions.
//   worker-major  each worker's whole region arrives before the next worker's: every
//                 contribution streams the region from memory (the worst case).
// Bytes counted: input bytes summed (workers x region per pass). The baseline does
// memcpy(dst, src, packet) for the same packets in the same order (a copy instead of a sum).
// Also printed for context: a plain memcpy of the whole region (region -> region copy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/runtime_internal.h"

namespace {

using Clk = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

constexpr std::size_t kReadBuffer = 256 * 1024;  // Connection's read buffer
constexpr std::size_t kHeader = 24;

struct Setup {
  std::size_t region_bytes, packet, workers;
  std::vector<float> region;
  std::vector<std::vector<std::byte>> rbuf;  // one read buffer per worker
  std::size_t frames_per_buffer;
  Setup(std::size_t region_mib, std::size_t packet_kib, std::size_t w)
      : region_bytes(region_mib << 20),
        packet(packet_kib << 10),
        workers(w),
        region(region_bytes / 4, 0.0f),
        rbuf(w) {
    frames_per_buffer = std::max<std::size_t>(1, kReadBuffer / (kHeader + packet));
    for (std::size_t i = 0; i < w; ++i) {
      rbuf[i].assign(frames_per_buffer * (kHeader + packet) + 64, std::byte{0});
      // Small integers as float bits (1.0f), so sums stay exact and finite.
      for (std::size_t k = 0; k + 4 <= rbuf[i].size(); k += 4) {
        const float one = 1.0f;
        std::memcpy(rbuf[i].data() + k, &one, 4);
      }
    }
  }
  const std::byte* src(std::size_t worker, std::size_t unit) const {
    return rbuf[worker].data() + (unit % frames_per_buffer) * (kHeader + packet) + kHeader;
  }
  std::size_t units() const { return region_bytes / packet; }
};

enum class Order { kLockstep, kWorkerMajor };

// Applies `op(dst, src, bytes)` to every (worker, unit) once per pass in `order`; returns
// input bytes per second.
template <typename Op>
double run(Setup& s, Order order, int passes, Op op) {
  const std::size_t units = s.units();
  const std::size_t batch = std::max<std::size_t>(1, kReadBuffer / s.packet);
  const auto t0 = Clk::now();
  for (int p = 0; p < passes; ++p) {
    if (order == Order::kWorkerMajor) {
      for (std::size_t w = 0; w < s.workers; ++w) {
        for (std::size_t u = 0; u < units; ++u)
          op(s.region.data() + u * s.packet / 4, s.src(w, u), s.packet);
      }
    } else {
      for (std::size_t b = 0; b < units; b += batch) {
        const std::size_t e = std::min(units, b + batch);
        for (std::size_t w = 0; w < s.workers; ++w) {
          for (std::size_t u = b; u < e; ++u)
            op(s.region.data() + u * s.packet / 4, s.src(w, u), s.packet);
        }
      }
    }
  }
  const double dt = std::chrono::duration<double>(Clk::now() - t0).count();
  return static_cast<double>(s.workers * units * s.packet) * passes / dt;
}

void add_op(float* dst, const std::byte* src, std::size_t bytes) {
  qs::runtime::add_floats(dst, src, bytes / 4);
}
void copy_op(float* dst, const std::byte* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, passes = 2;
  std::size_t region_mib = 64, packet_kib = 32, workers = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const std::size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--reps="))
      reps = std::atoi(v);
    else if (const char* v = val("--passes="))
      passes = std::atoi(v);
    else if (const char* v = val("--region-mib="))
      region_mib = static_cast<std::size_t>(std::atoll(v));
    else if (const char* v = val("--packet-kib="))
      packet_kib = static_cast<std::size_t>(std::atoll(v));
    else if (const char* v = val("--workers="))
      workers = static_cast<std::size_t>(std::atoll(v));
    else {
      std::fprintf(stderr,
                   "usage: aggregation_bench [--reps=7] [--passes=2] [--region-mib=64] "
                   "[--packet-kib=32] [--workers=8]\n");
      return 2;
    }
  }
  Setup s(region_mib, packet_kib, workers);
  std::printf(
      "== Aggregation: add_floats into a %zu MiB region, %zu KiB packets from %zu workers ==\n",
      region_mib, packet_kib, workers);
  std::printf(
      "%d repetitions x %d passes (%zu MiB of input per pass); GB/s = 1e9 input bytes/s\n\n", reps,
      passes, workers * region_mib);
  // Warm-up: fault the region in, settle the clocks.
  run(s, Order::kWorkerMajor, 1, copy_op);

  std::printf(
      "| arrival order | add_floats GB/s (median) | min-max | memcpy same packets GB/s | min-max | "
      "ratio add/memcpy (median of paired) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (Order o : {Order::kLockstep, Order::kWorkerMajor}) {
    std::vector<double> add, cpy, ratio;
    for (int r = 0; r < reps; ++r) {
      std::fill(s.region.begin(), s.region.end(), 0.0f);
      const double a = run(s, o, passes, add_op);
      const double c = run(s, o, passes, copy_op);
      add.push_back(a / 1e9);
      cpy.push_back(c / 1e9);
      ratio.push_back(a / c);
    }
    std::printf(
        "| %s | %.2f | %.2f-%.2f | %.2f | %.2f-%.2f | %.3f |\n",
        o == Order::kLockstep ? "lockstep (256 KiB batches)" : "worker-major (streams region)",
        median(add), *std::min_element(add.begin(), add.end()),
        *std::max_element(add.begin(), add.end()), median(cpy),
        *std::min_element(cpy.begin(), cpy.end()), *std::max_element(cpy.begin(), cpy.end()),
        median(ratio));
  }
  // Sanity: one lockstep pass sums `workers` ones into every element.
  {
    std::fill(s.region.begin(), s.region.end(), 0.0f);
    run(s, Order::kLockstep, 1, add_op);
    for (std::size_t k = 0; k < s.region.size(); k += 4099) {
      if (s.region[k] != static_cast<float>(workers)) {
        std::fprintf(stderr, "wrong sum at element %zu: %f\n", k, static_cast<double>(s.region[k]));
        return 1;
      }
    }
  }
  // Context: a plain region -> region memcpy (one core), bytes copied per second.
  std::vector<float> other(s.region.size(), 2.0f);
  std::vector<double> big;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clk::now();
    std::memcpy(other.data(), s.region.data(), s.region_bytes);
    big.push_back(static_cast<double>(s.region_bytes) /
                  std::chrono::duration<double>(Clk::now() - t0).count() / 1e9);
  }
  std::printf(
      "\ncontext: memcpy of the whole %zu MiB region to another buffer: %.2f GB/s (median)\n",
      region_mib, median(big));

  // Compression (--compression bf16|fp16): what rounding and widening cost per float32
  // element, over the same region, medians of --reps (the simulator's conversion cost,
  // ClusterConfig::convert_ns_per_element, comes from here).
  std::printf(
      "\n== Compression: float32 elements to and from the wire's dtype, %zu MiB region ==\n",
      region_mib);
  std::printf("| operation | ns per element (median) | float32 GB/s |\n|---|---:|---:|\n");
  const std::size_t n = s.region.size();
  std::vector<std::byte> wire(n * 2);
  for (auto d : {qs::transport::WireDType::kBFloat16, qs::transport::WireDType::kFloat16}) {
    const char* dn = qs::transport::wire_dtype_name(d);
    for (int op = 0; op < 2; ++op) {
      std::vector<double> ns;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clk::now();
        if (op == 0) {
          qs::runtime::encode_floats(s.region.data(), n, d, wire.data());
        } else {
          qs::runtime::add_wire(other.data(), wire.data(), n, d);
        }
        ns.push_back(std::chrono::duration<double, std::nano>(Clk::now() - t0).count() /
                     static_cast<double>(n));
      }
      const double m = median(ns);
      std::printf("| %s %s | %.3f | %.2f |\n",
                  op == 0 ? "encode (worker push, server pull) to" : "add_wire (server sum) from",
                  dn, m, 4.0 / m);
    }
  }
  return 0;
}
