#include <cmath>
#include <cstring>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "quicksilver/policy/registry.h"
#include "quicksilver/transport/sender.h"
#include "runtime_internal.h"

namespace qs::runtime {

Status check_job_size(int workers, int servers) {
  if (workers < 1 || workers > kMaxWorkers) {
    return invalid_argument("--workers must be in 1.." + std::to_string(kMaxWorkers) +
                            " for the runtime");
  }
  if (servers < 1 || servers > kMaxServers) {
    return invalid_argument("--servers must be in 1.." + std::to_string(kMaxServers) +
                            " for the runtime");
  }
  return Status::ok();
}

Status validate_job(const JobOptions& job) {
  QS_RETURN_IF_ERROR(check_job_size(job.workers, job.servers));
  if (job.iterations < 1) return invalid_argument("iterations must be >= 1");
  QS_RETURN_IF_ERROR(validate_profile(job.profile));
  if (job.profile.num_tensors() >= 65535) {
    return invalid_argument("the runtime supports at most 65534 tensors (16-bit priority)");
  }
  for (const LayerSpec& l : job.profile.layers) {
    for (const TensorSpec& t : l.tensors) {
      if (t.bytes_per_element != 4) {
        return invalid_argument("layer '" + l.name + "' tensor '" + t.name +
                                "': the runtime sums float32, bytes_per_element must be 4");
      }
    }
  }
  if (!is_known_policy(job.policy)) return invalid_argument("unknown policy '" + job.policy + "'");
  QS_RETURN_IF_ERROR(check_unit_budget(job.profile, job.policy, Architecture::kPs,
                                       job.policy_options, job.workers, job.servers));
  return Status::ok();
}

transport::SendOrder send_order(QueueDiscipline d) {
  return d == QueueDiscipline::kPriority ? transport::SendOrder::kPriority
                                         : transport::SendOrder::kFifo;
}

namespace {
Bytes commit_bytes(const JobOptions& job) {
  const double b = job.bandwidth.bytes_per_second() * to_sec(job.commit_window);
  return std::max<Bytes>(8 * kKiB, static_cast<Bytes>(b));
}
}  // namespace

transport::SocketOptions socket_options(const JobOptions& job) {
  transport::SocketOptions o = job.socket;
  o.congestion = job.congestion;
  if (job.commit_window > 0) o.notsent_lowat = commit_bytes(job);
  return o;
}

std::uint64_t sender_batch_bytes(const JobOptions& job) {
  return job.commit_window > 0 ? static_cast<std::uint64_t>(2 * commit_bytes(job)) : 256 * kKiB;
}

std::uint64_t profile_hash(const Profile& p) {
  std::uint64_t h = transport::fnv1a64(p.name);
  for (const LayerSpec& l : p.layers) {
    h = transport::fnv1a64(l.name, h);
    for (const TensorSpec& t : l.tensors) {
      h = transport::fnv1a64(
          t.name + ":" + std::to_string(t.elements) + "x" + std::to_string(t.bytes_per_element), h);
    }
  }
  return h;
}

std::uint64_t config_hash(const JobOptions& job) {
  // Every hashed knob of the registry's table (quicksilver/policy/registry.h), so that a
  // knob added there cannot be left out here.
  // The wire dtype joins the text only when it is not float32: float32 jobs keep their hash.
  const std::string wire = job.wire_dtype == transport::WireDType::kFloat32
                               ? ""
                               : std::string("|wire=") + transport::wire_dtype_name(job.wire_dtype);
  return transport::fnv1a64(job.policy + "|iterations=" + std::to_string(job.iterations) + "|" +
                            hashed_knob_text(job.policy_options) + wire);
}

transport::HelloBody hello_body(const JobOptions& job) {
  return transport::HelloBody{static_cast<std::uint32_t>(job.workers),
                              static_cast<std::uint32_t>(job.servers), profile_hash(job.profile),
                              config_hash(job)};
}

TimeNs Liveness::tick(transport::Connection& c, TimeNs now, std::uint16_t sender) {
  if (c.closed()) return 0;
  if (!started_ || c.bytes_read() != read_) heard_ = now;
  if (started_ && c.bytes_written() == written_ && c.output_idle()) {
    transport::Header h;
    h.kind = transport::FrameKind::kHeartbeat;
    h.sender = sender;
    c.send_control(h);
    (void)c.flush();  // an error closes c, and its owner hears of it
  }
  started_ = true;
  read_ = c.bytes_read();
  written_ = c.bytes_written();
  return now - heard_;
}

std::string hello_mismatch(const transport::HelloBody& a, const transport::HelloBody& b) {
  if (a.workers != b.workers) {
    return "workers differ: " + std::to_string(a.workers) + " here, " + std::to_string(b.workers) +
           " there";
  }
  if (a.servers != b.servers) {
    return "servers differ: " + std::to_string(a.servers) + " here, " + std::to_string(b.servers) +
           " there";
  }
  if (a.profile_hash != b.profile_hash) return "profile differs (hash mismatch)";
  if (a.config_hash != b.config_hash) {
    // The hello carries one hash: it tells that the configurations differ, not where.
    return "policy configuration differs (one of: policy, iterations, " + hashed_knob_names() +
           ", compression; hash mismatch)";
  }
  return {};
}

namespace {
inline float value_base(int worker, std::int64_t iteration, TensorId t) {
  return static_cast<float>((7 * worker + 3 * iteration + 5 * static_cast<std::int64_t>(t)) & 255);
}
}  // namespace

void fill_gradient(float* dst, std::int64_t count, std::int64_t first, int worker,
                   std::int64_t iteration, TensorId tensor) {
  const float base = value_base(worker, iteration, tensor);
  for (std::int64_t k = 0; k < count; ++k) dst[k] = base + static_cast<float>((first + k) & 255);
}

Status check_sum(const float* sum, std::int64_t count, std::int64_t first, int workers,
                 std::int64_t iteration, TensorId tensor) {
  return check_sum(sum, count, first, workers, iteration, iteration, tensor);
}

float round_to_wire(float x, transport::WireDType wire) {
  std::byte b[4];
  encode_floats(&x, 1, wire, b);
  float y;
  decode_floats(b, 1, wire, &y);
  return y;
}

Status check_sum(const float* sum, std::int64_t count, std::int64_t first, int workers,
                 std::int64_t iteration, TensorId tensor, transport::WireDType wire) {
  if (wire == transport::WireDType::kFloat32)
    return check_sum(sum, count, first, workers, iteration, tensor);
  // Compressed: each worker's element rounded to the wire's dtype, summed in float32 (small
  // integers: exact in any order), the sum rounded once more on its way back.
  const auto round = [wire](float x) { return round_to_wire(x, wire); };
  // An element's value depends on its index through (index & 255) only: 256 expected sums.
  float expected[256];
  for (int r = 0; r < 256; ++r) {
    float want = 0;
    for (int w = 0; w < workers; ++w)
      want += round(value_base(w, iteration, tensor) + static_cast<float>(r));
    expected[r] = round(want);
  }
  for (std::int64_t k = 0; k < count; ++k) {
    const float want = expected[(first + k) & 255];
    if (sum[k] != want) {
      return internal_error("wrong sum: iteration " + std::to_string(iteration) + " tensor " +
                            std::to_string(tensor) + " element " + std::to_string(first + k) +
                            " is " + std::to_string(sum[k]) + ", expected " + std::to_string(want) +
                            " (" + transport::wire_dtype_name(wire) + " on the wire)");
    }
  }
  return Status::ok();
}

Status check_sum(const float* sum, std::int64_t count, std::int64_t first, int workers,
                 std::int64_t first_iteration, std::int64_t last_iteration, TensorId tensor) {
  float base = 0;
  for (std::int64_t it = first_iteration; it <= last_iteration; ++it) {
    for (int w = 0; w < workers; ++w) base += value_base(w, it, tensor);
  }
  const auto n =
      static_cast<float>(workers) * static_cast<float>(last_iteration - first_iteration + 1);
  for (std::int64_t k = 0; k < count; ++k) {
    const float want = base + n * static_cast<float>((first + k) & 255);
    if (sum[k] != want) {
      return internal_error(
          "wrong sum: iteration " + std::to_string(first_iteration) +
          (last_iteration != first_iteration ? ".." + std::to_string(last_iteration) : "") +
          " tensor " + std::to_string(tensor) + " element " + std::to_string(first + k) + " is " +
          std::to_string(sum[k]) + ", expected " + std::to_string(want));
    }
  }
  return Status::ok();
}

void add_floats(float* dst, const std::byte* src, std::size_t n) {
  // GCC vector extension, two 16-byte vectors a step: native SSE2 on every x86-64 without
  // -mavx (32-byte vectors would be split and spilled through the stack; bench/
  // aggregation_bench measured 0.73 of memcpy for them, 1.08 for this). memcpy loads keep
  // unaligned sources legal.
  typedef float V4 __attribute__((vector_size(16)));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V4 a0, a1, b0, b1;
    std::memcpy(&a0, dst + i, sizeof a0);
    std::memcpy(&a1, dst + i + 4, sizeof a1);
    std::memcpy(&b0, src + i * sizeof(float), sizeof b0);
    std::memcpy(&b1, src + (i + 4) * sizeof(float), sizeof b1);
    a0 += b0;
    a1 += b1;
    std::memcpy(dst + i, &a0, sizeof a0);
    std::memcpy(dst + i + 4, &a1, sizeof a1);
  }
  for (; i < n; ++i) {
    float b;
    std::memcpy(&b, src + i * sizeof(float), sizeof b);
    dst[i] += b;
  }
}

std::string WorkerReport::to_string() const {
  std::ostringstream s;
  s << "worker " << worker_id << " policy " << policy << " cc " << congestion_control
    << ": median iteration " << to_ms(median_iteration) << " ms over " << iteration_times.size()
    << " iterations; pushed " << bytes_pushed_per_iteration << " B in " << units_per_iteration
    << " units/iteration; uplink while pushing " << uplink_gbps << " Gbit/s";
  if (uplink_utilisation > 0) s << " (" << 100 * uplink_utilisation << "% of NIC)";
  s << "; queueing delay p50/p99/max " << to_us(queue_delay_p50) << "/" << to_us(queue_delay_p99)
    << "/" << to_us(queue_delay_max) << " us, layer-1 units " << to_us(urgent_delay_p50) << "/"
    << to_us(urgent_delay_p99) << "/" << to_us(urgent_delay_max) << " us; verified "
    << iterations_verified << " iterations";
  return s.str();
}

namespace {
// float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN): what PyTorch's
// tensor.to(torch.bfloat16) does, so a reference can round the same way.
inline std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// float16 in software, IEEE round to nearest even (every compiler: clang before 15 has
// no _Float16 on x86-64); F16C below where the CPU has it, bit for bit the same.
inline std::uint16_t to_fp16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero) of 2^-24 units
    float af;
    std::memcpy(&af, &a, 4);
    return static_cast<std::uint16_t>(sign |
                                      static_cast<std::uint16_t>(std::nearbyint(af * 16777216.0f)));
  }
  std::uint32_t h = (a - 0x38000000u) >> 13;  // exponent rebiased (127 -> 15), top 10 mantissa bits
  const std::uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return static_cast<std::uint16_t>(sign | h);
}
inline float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    const float f = static_cast<float>(man) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -f : f;
  }
  const std::uint32_t x =
      sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline std::uint16_t load16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) |
                                    (std::to_integer<unsigned>(p[1]) << 8));
}
inline void store16(std::byte* p, std::uint16_t v) {
  p[0] = static_cast<std::byte>(v & 0xff);
  p[1] = static_cast<std::byte>(v >> 8);
}

// float16 through the CPU's F16C conversions, 8 elements a step, where the CPU has them
// (chosen at run time: the build targets every x86-64); the compiler's software _Float16
// conversions cost about 4.5 ns an element here, slower than a 10 Gbit/s link. Both round
// to nearest even.
#if defined(__x86_64__)
#define QS_F16C 1
__attribute__((target("avx,f16c"))) void encode_fp16_f16c(const float* src, std::size_t n,
                                                          std::byte* dst) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) store16(dst + 2 * i, to_fp16(src[i]));
}
__attribute__((target("avx,f16c"))) void decode_fp16_f16c(const std::byte* src, std::size_t n,
                                                          float* dst) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  }
  for (; i < n; ++i) dst[i] = from_fp16(load16(src + 2 * i));
}
__attribute__((target("avx,f16c"))) void add_fp16_f16c(float* dst, const std::byte* src,
                                                       std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), v));
  }
  for (; i < n; ++i) dst[i] += from_fp16(load16(src + 2 * i));
}
bool has_f16c() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID leaf 1: ECX bit 29 F16C, bit 28 AVX
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0 && (c & (1u << 28)) != 0;
  }();
  return yes;
}
#endif
}  // namespace

void encode_floats(const float* src, std::size_t n, transport::WireDType d, std::byte* dst) {
#ifdef QS_F16C
  if (d == transport::WireDType::kFloat16 && has_f16c()) return encode_fp16_f16c(src, n, dst);
#endif
  switch (d) {
    case transport::WireDType::kFloat32:
      std::memcpy(dst, src, n * 4);
      return;
    case transport::WireDType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) store16(dst + 2 * i, to_bf16(src[i]));
      return;
    case transport::WireDType::kFloat16:
      for (std::size_t i = 0; i < n; ++i) store16(dst + 2 * i, to_fp16(src[i]));
      return;
  }
}

void decode_floats(const std::byte* src, std::size_t n, transport::WireDType d, float* dst) {
#ifdef QS_F16C
  if (d == transport::WireDType::kFloat16 && has_f16c()) return decode_fp16_f16c(src, n, dst);
#endif
  switch (d) {
    case transport::WireDType::kFloat32:
      std::memcpy(dst, src, n * 4);
      return;
    case transport::WireDType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = from_bf16(load16(src + 2 * i));
      return;
    case transport::WireDType::kFloat16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = from_fp16(load16(src + 2 * i));
      return;
  }
}

void add_wire(float* dst, const std::byte* src, std::size_t n, transport::WireDType d) {
#ifdef QS_F16C
  if (d == transport::WireDType::kFloat16 && has_f16c()) return add_fp16_f16c(dst, src, n);
#endif
  switch (d) {
    case transport::WireDType::kFloat32:
      add_floats(dst, src, n);
      return;
    case transport::WireDType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) dst[i] += from_bf16(load16(src + 2 * i));
      return;
    case transport::WireDType::kFloat16:
      for (std::size_t i = 0; i < n; ++i) dst[i] += from_fp16(load16(src + 2 * i));
      return;
  }
}

void reduce_bf16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::byte*>(c);
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    store16(out + 2 * i, to_bf16(from_bf16(load16(x + 2 * i)) + from_bf16(load16(y + 2 * i))));
  }
}

void reduce_fp16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::byte*>(c);
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  float fa[256], fb[256];
  for (std::size_t i = 0; i < n; i += 256) {  // in blocks, through the vectorised conversions
    const std::size_t k = std::min<std::size_t>(256, n - i);
    decode_floats(x + 2 * i, k, transport::WireDType::kFloat16, fa);
    decode_floats(y + 2 * i, k, transport::WireDType::kFloat16, fb);
    for (std::size_t j = 0; j < k; ++j) fa[j] += fb[j];
    encode_floats(fa, k, transport::WireDType::kFloat16, out + 2 * i);
  }
}

Status check_compressed_allreduce(const float* sum, std::int64_t count, std::int64_t first,
                                  int workers, std::int64_t first_iteration,
                                  std::int64_t last_iteration, TensorId tensor,
                                  transport::WireDType wire) {
  const auto round = [wire](float x) { return round_to_wire(x, wire); };
  // Per residue (an element's value depends on index & 255 only): each worker's sum over
  // the iterations (exact: small integers), and their exact total.
  float want[256], exact[256];
  for (int r = 0; r < 256; ++r) {
    float rounded = 0, total = 0;
    for (int w = 0; w < workers; ++w) {
      float mine = 0;
      for (std::int64_t it = first_iteration; it <= last_iteration; ++it) {
        mine += value_base(w, it, tensor) + static_cast<float>(r);
      }
      rounded += round(mine);
      total += mine;
    }
    want[r] = round(rounded);
    exact[r] = total;
  }
  // Two workers: the one partial sum is the two rounded gradients added, rounded once (as
  // the parameter servers do). More: each hop rounds a partial sum, in an order the
  // algorithm sets, so the check is the bound: the unit roundoff (2^-8 bf16, 2^-11 fp16)
  // per rounding, workers + 1 roundings.
  const double u = wire == transport::WireDType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  for (std::int64_t k = 0; k < count; ++k) {
    const int r = static_cast<int>((first + k) & 255);
    const bool ok = workers == 2 ? sum[k] == want[r]
                                 : std::abs(static_cast<double>(sum[k]) - exact[r]) <=
                                       exact[r] * u * (workers + 1);
    if (!ok) {
      return internal_error(
          "wrong sum: iterations " + std::to_string(first_iteration) + ".." +
          std::to_string(last_iteration) + " tensor " + std::to_string(tensor) + " element " +
          std::to_string(first + k) + " is " + std::to_string(sum[k]) + ", expected " +
          (workers == 2 ? std::to_string(want[r]) : "about " + std::to_string(exact[r])) + " (" +
          transport::wire_dtype_name(wire) + " on the wire)");
    }
  }
  return Status::ok();
}

void encode_fp16_portable(const float* src, std::size_t n, std::byte* dst) {
  for (std::size_t i = 0; i < n; ++i) store16(dst + 2 * i, to_fp16(src[i]));
}

void decode_fp16_portable(const std::byte* src, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = from_fp16(load16(src + 2 * i));
}

}  // namespace qs::runtime
