// Transport micro-benchmarks (issue 5, point 7): throughput of one connection against
// iperf3 on the same path, and the cost of picking the most urgent packet. Every table
// carries a ratio against a baseline measured in the same run (DESIGN.md "Measuring").
//
//   transport_bench throughput [--seconds=3] [--reps=5] [--tensor-mib=64] [--sizes=4,16,...]
//       One loopback TCP connection through the project's own transport: a Sender
//       (PriorityFifo send buffer, headers only) hands 32-byte-header data frames to a
//       Connection that writes them with sendmsg straight from a tensor buffer; the peer's
//       Connection decodes every header, validates it (validate_data_header) and receives
//       the payload into its own tensor buffer at the header's offset (PayloadTarget::to).
//       Both sockets use the runtime's default SocketOptions (cubic, TCP_NOTSENT_LOWAT
//       128 KiB, SO_SNDBUF 4 MiB). Baseline: `iperf3 -c 127.0.0.1 -t <seconds> -J -C cubic`
//       against `iperf3 -s -1`, run once per repetition, interleaved with the transport runs.
//       Sizes are payload KiB; goodput counts payload bytes only (as iperf3 does).
//   transport_bench selection [--reps=7] [--ops=2000000]
//       push + pop pairs (one push and one pop = one operation) through qs::PriorityFifo at
//       a steady occupancy, random priorities, 1/64/1024 priorities; baseline a
//       std::priority_queue of (priority, seq) pairs, the same strict order.
//   transport_bench checksum [--seconds=2] [--reps=5] [--tensor-mib=64] [--sizes=...]
//       The cost of the frames' end-to-end payload checksum (CRC32C, wire.h): the same
//       transport run with checksums on (the default) and off
//       (Connection::set_payload_checksums(false) on both ends), back to back in each
//       repetition, the order alternating; hot and big tensors as above. No iperf3.
//   transport_bench            throughput and selection
//
// Medians over --reps repetitions; the ratio column is the median of the per-repetition
// ratios (each repetition measures the candidate and its baseline back to back).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "quicksilver/core/priority_fifo.h"
#include "quicksilver/transport/crc32c.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/sender.h"
#include "quicksilver/transport/socket.h"
#include "quicksilver/transport/tcp_connection.h"
#include "quicksilver/transport/wire.h"

extern char** environ;

namespace qs::transport {
namespace {

using Clk = std::chrono::steady_clock;

// The runtime's defaults unless overridden (--lowat-kib, --sndbuf-kib: for diagnosis).
SocketOptions g_socket_options;
bool g_iperf = true;           // --no-iperf: transport only (for profiling)
bool g_iperf_per_size = true;  // --no-iperf-per-size: skip `iperf3 -l <packet>` runs

double median(std::vector<double> v) {
  if (v.empty()) return 0;  // (a series that was not measured)
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double seconds_since(Clk::time_point t0) {
  return std::chrono::duration<double>(Clk::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "transport_bench: %s\n", what.c_str());
  std::exit(1);
}
template <typename T>
T must(Result<T> r, const char* what) {
  if (!r.is_ok()) die(std::string(what) + ": " + r.status().to_string());
  return std::move(*r);
}
void must(const Status& s, const char* what) {
  if (!s.is_ok()) die(std::string(what) + ": " + s.to_string());
}

// ---------------------------------------------------------------- throughput ----------

// The receiving end: validates every data header against the tensor it knows and receives
// the payload straight into its tensor at the header's offset.
class SinkHandler : public FrameHandler {
 public:
  SinkHandler(std::size_t tensor_bytes, std::uint32_t packet) : memory(tensor_bytes) {
    rules.kind = FrameKind::kPush;
    rules.tensor_bytes = {static_cast<Bytes>(tensor_bytes)};
    rules.element_size = {4};
    rules.max_length = packet;
    rules.min_iteration = 0;
    rules.max_iteration = 1u << 30;
    rules.expected_sender = 3;
    rules.num_priorities = 16;
  }
  Result<PayloadTarget> on_header(Connection&, const Header& h) override {
    QS_RETURN_IF_ERROR(validate_data_header(h, rules));
    return PayloadTarget::to(memory.data() + h.offset);
  }
  Status on_frame(Connection&, const Header& h) override {
    payload_bytes.store(payload_bytes.load(std::memory_order_relaxed) + h.length,
                        std::memory_order_relaxed);
    frames.store(frames.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return Status::ok();
  }
  void on_closed(Connection&, const Status& why) override { closed = why; }

  DataRules rules;
  std::vector<std::byte> memory;
  std::atomic<std::uint64_t> payload_bytes{0}, frames{0};
  Status closed;
};

// The sending end: one Sender over one Connection, kept busy by re-enqueueing a unit
// (the next packet of the tensor) every time one is handed to the kernel.
class SourceHandler : public FrameHandler {
 public:
  Result<PayloadTarget> on_header(Connection&, const Header&) override {
    return internal_error("the sink sends nothing");
  }
  Status on_frame(Connection&, const Header&) override { return Status::ok(); }
  void on_writable(Connection& c) override {
    Status s = sender->on_writable(c.index());
    if (!s.is_ok()) loop->fail(s);
  }
  void on_closed(Connection&, const Status& why) override { closed = why; }
  Sender* sender = nullptr;
  EventLoop* loop = nullptr;
  Status closed;
};

struct ThroughputResult {
  double gbps = 0;  // payload goodput
  double frames_per_s = 0;
  double sender_cpu = 0;  // sender thread CPU seconds / wall seconds
  double receiver_cpu = 0;
  double cpu_ns_per_kib = 0;  // sender + receiver thread CPU per payload KiB, whole run
  std::string congestion;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

ThroughputResult run_transport(std::uint32_t packet, std::size_t tensor_bytes, double seconds,
                               double warmup, bool checksums = true) {
  const SocketOptions opts = g_socket_options;  // default: the runtime's (SocketOptions{})
  Fd listener = must(listen_tcp("127.0.0.1", 0), "listen");
  const int port = must(local_port(listener.get()), "local_port");
  Fd client = must(connect_tcp("127.0.0.1", port, SteadyClock::instance().now() + 10 * kNsPerSec),
                   "connect");
  Fd server;
  for (int i = 0; i < 1000 && !server.valid(); ++i) {
    server = must(accept_tcp(listener.get()), "accept");
    if (!server.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.valid()) die("accept: no connection");
  must(configure_socket(client.get(), opts), "configure sender socket");
  must(configure_socket(server.get(), opts), "configure receiver socket");
  ThroughputResult res;
  res.congestion = must(congestion_of(client.get()), "congestion_of");

  auto rloop = must(EventLoop::create(), "event loop");
  auto sloop = must(EventLoop::create(), "event loop");
  SinkHandler sink(tensor_bytes, packet);
  std::atomic<double> rcpu{0}, scpu{0};
  std::atomic<bool> started{false};

  std::thread receiver([&] {
    const double c0 = thread_cpu_seconds();
    TcpConnection conn(*rloop, std::move(server), sink, "sender", 0);
    conn.set_payload_checksums(checksums);
    must(conn.start(), "receiver start");
    Status s = rloop->run([&] { return conn.closed(); });
    rcpu.store(thread_cpu_seconds() - c0);
    if (!s.is_ok() && s.code() != StatusCode::kUnavailable) die("receiver: " + s.to_string());
    // The sender's end closing (FIN) is how a run ends; anything else is a failure.
    if (conn.closed() && sink.closed.code() != StatusCode::kUnavailable) {
      die("receiver closed: " + sink.closed.to_string());
    }
  });

  std::thread sender_thread([&] {
    const double c0 = thread_cpu_seconds();
    SourceHandler src;
    TcpConnection conn(*sloop, std::move(client), src, "receiver", 0);
    conn.set_payload_checksums(checksums);
    Sender sender(SendOrder::kPriority, 16, *sloop);
    src.sender = &sender;
    src.loop = sloop.get();
    sender.set_connections({&conn});
    std::vector<std::byte> tensor(tensor_bytes, std::byte{1});
    const std::uint64_t units = tensor_bytes / packet;
    std::uint64_t next = 0;
    auto enqueue_next = [&] {
      Header h;
      h.kind = FrameKind::kPush;
      h.sender = 3;
      h.tensor = 0;
      h.iteration = static_cast<std::uint32_t>(next / units);
      h.length = packet;
      h.offset = (next % units) * packet;
      h.priority = static_cast<std::uint16_t>((next % units) * 16 / units);
      sender.enqueue(0, h, tensor.data() + h.offset, next);
      ++next;
    };
    sender.set_sent_callback([&](int, std::uint64_t) { enqueue_next(); });
    must(conn.start(), "sender start");
    // Enough queued units to keep the connection busy (the Sender hands over one at a time).
    for (int i = 0; i < 8; ++i) enqueue_next();
    started.store(true);
    Status s = sender.pump();
    if (!s.is_ok()) die("pump: " + s.to_string());
    s = sloop->run([] { return false; });
    scpu.store(thread_cpu_seconds() - c0);
    if (s.code() != StatusCode::kUnavailable) die("sender: " + s.to_string());
    if (conn.closed() && !src.closed.is_ok()) die("sender closed: " + src.closed.to_string());
  });

  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t_start = Clk::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  const std::uint64_t b0 = sink.payload_bytes.load(), f0 = sink.frames.load();
  const auto t0 = Clk::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const std::uint64_t b1 = sink.payload_bytes.load(), f1 = sink.frames.load();
  const double dt = seconds_since(t0);
  sloop->request_stop("benchmark over");
  sender_thread.join();  // closes the sending socket (FIN): the receiver's loop ends
  receiver.join();
  const double total = seconds_since(t_start);
  res.gbps = static_cast<double>(b1 - b0) * 8 / dt / 1e9;
  res.frames_per_s = static_cast<double>(f1 - f0) / dt;
  res.cpu_ns_per_kib =
      (scpu.load() + rcpu.load()) * 1e9 / (static_cast<double>(sink.payload_bytes.load()) / 1024);
  res.sender_cpu = scpu.load() / total;
  res.receiver_cpu = rcpu.load() / total;
  return res;
}

// Runs a command, returns its stdout (exit status in *status).
std::string run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) die("popen " + cmd);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *status = ::pclose(f);
  return out;
}

struct IperfResult {
  double gbps = 0;
  std::string congestion;
  double sender_cpu = 0, receiver_cpu = 0;  // percent of one core, as iperf3 reports it
  double cpu_ns_per_kib = 0;                // both processes' CPU per payload KiB
};

// One iperf3 run over loopback: `iperf3 -s -1 -p PORT` in the background, then the client.
// `len` > 0 sets the write size (-l); 0 keeps iperf3's default (128 KiB for TCP).
IperfResult run_iperf3(int port, double seconds, std::uint32_t len = 0) {
  const std::string p = std::to_string(port);
  const char* sargv[] = {"iperf3", "-s", "-1", "-p", p.c_str(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t server = 0;
  if (posix_spawnp(&server, "iperf3", &fa, nullptr, const_cast<char**>(sargv), environ) != 0) {
    die("cannot start iperf3 (is it installed?)");
  }
  posix_spawn_file_actions_destroy(&fa);
  const std::string cmd = "iperf3 -c 127.0.0.1 -p " + p + " -t " + std::to_string(seconds) +
                          " -J -C cubic" + (len ? " -l " + std::to_string(len) : std::string()) +
                          " 2>&1";
  IperfResult r;
  std::string out;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int st = 0;
    out = run_capture(cmd, &st);
    if (st == 0) break;
    out.clear();
  }
  int wst = 0;
  if (out.empty()) ::kill(server, SIGTERM);  // it is waiting for a client that never came
  ::waitpid(server, &wst, 0);
  if (out.empty()) die("iperf3 client failed on port " + p + ": " + cmd);
  const auto j = nlohmann::json::parse(out);
  if (j.contains("error")) die("iperf3: " + j["error"].get<std::string>());
  const auto& end = j.at("end");
  r.gbps = end.at("sum_received").at("bits_per_second").get<double>() / 1e9;
  r.congestion = end.value("sender_tcp_congestion", std::string("?")) + "/" +
                 end.value("receiver_tcp_congestion", std::string("?"));
  if (end.contains("cpu_utilization_percent")) {
    r.sender_cpu = end["cpu_utilization_percent"].value("host_total", 0.0);
    r.receiver_cpu = end["cpu_utilization_percent"].value("remote_total", 0.0);
    const double secs = end.at("sum_received").at("seconds").get<double>();
    const double bytes = end.at("sum_received").at("bytes").get<double>();
    r.cpu_ns_per_kib = (r.sender_cpu + r.receiver_cpu) / 100 * secs * 1e9 / (bytes / 1024);
  }
  return r;
}

int free_port() {
  Fd l = must(listen_tcp("127.0.0.1", 0), "listen");
  return must(local_port(l.get()), "local_port");
}

std::string size_label(int kib) {
  return kib >= 1024 ? std::to_string(kib / 1024) + " MiB" : std::to_string(kib) + " KiB";
}

// Two tensor placements per packet size: "hot", a tensor of max(128 KiB, packet) that the
// sender sends again and again and the receiver overwrites (as iperf3 reuses its 128 KiB
// buffer: both ends stay in cache), and "big", a --tensor-mib tensor on each side (not
// cache-resident: every byte is read from and written to memory, as in training).
void throughput(double seconds, int reps, std::size_t big_tensor, std::vector<int> sizes_kib) {
  const double warmup = 0.3;
  std::printf("== Transport throughput: one loopback connection, project transport vs iperf3 ==\n");
  std::printf(
      "hot = tensor of max(128 KiB, packet) per side (cache-resident, like iperf3's buffer); "
      "big = %zu MiB tensor per side\n%.1f s per run after %.1f s warm-up; %d repetitions; "
      "iperf3 -t %.1f once per repetition, before that repetition's transport runs\n",
      big_tensor >> 20, seconds, warmup, reps, seconds);
  std::printf("socket options: congestion %s, TCP_NOTSENT_LOWAT %lld KiB, SO_SNDBUF %lld KiB\n",
              g_socket_options.congestion.c_str(),
              static_cast<long long>(g_socket_options.notsent_lowat / 1024),
              static_cast<long long>(g_socket_options.send_buffer / 1024));
  const std::size_t n = sizes_kib.size();
  struct Series {
    std::vector<double> gbps, ratio, fps, cpu, cpu_ratio, ratio_l;
  };
  std::vector<std::vector<double>> ipl(n);  // iperf3 -l <packet>
  std::vector<Series> hot(n), big(n);
  std::vector<double> ip, ipcpu;
  std::string cc, ipcc;
  for (int rep = 0; rep < reps; ++rep) {
    IperfResult ir;
    ir.gbps = 1;
    ir.cpu_ns_per_kib = 1;
    if (g_iperf) ir = run_iperf3(free_port(), seconds);
    ip.push_back(ir.gbps);
    ipcpu.push_back(ir.cpu_ns_per_kib);
    ipcc = ir.congestion;
    std::printf("  rep %d: iperf3 %.2f Gbit/s (%s) | hot/big:", rep + 1, ir.gbps,
                ir.congestion.c_str());
    for (std::size_t i = 0; i < n; ++i) {
      const auto packet = static_cast<std::uint32_t>(sizes_kib[i]) * 1024u;
      double l_gbps = 0;
      if (g_iperf && g_iperf_per_size) {
        // iperf3 refuses writes above 1 MiB (its MAX_BLOCKSIZE): 4 MiB packets compare with -l 1M.
        l_gbps = run_iperf3(free_port(), seconds, std::min<std::uint32_t>(packet, 1u << 20)).gbps;
        ipl[i].push_back(l_gbps);
      }
      for (int which = 0; which < 2; ++which) {
        const std::size_t tb = which == 0 ? std::max<std::size_t>(128 * 1024, packet) : big_tensor;
        const ThroughputResult t = run_transport(packet, tb, seconds, warmup);
        cc = t.congestion;
        Series& sr = which == 0 ? hot[i] : big[i];
        sr.gbps.push_back(t.gbps);
        sr.ratio.push_back(t.gbps / ir.gbps);
        sr.fps.push_back(t.frames_per_s);
        sr.cpu.push_back(t.cpu_ns_per_kib);
        sr.cpu_ratio.push_back(t.cpu_ns_per_kib / ir.cpu_ns_per_kib);
        if (l_gbps > 0) sr.ratio_l.push_back(t.gbps / l_gbps);
      }
      std::printf(" %s %.1f/%.1f (-l %.1f)", size_label(sizes_kib[i]).c_str(), hot[i].gbps.back(),
                  big[i].gbps.back(), l_gbps);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  std::printf("\ncongestion control: transport %s, iperf3 %s (sender/receiver)\n", cc.c_str(),
              ipcc.c_str());
  std::printf(
      "iperf3 baseline: median %.2f Gbit/s (min %.2f, max %.2f), CPU %.0f ns per KiB "
      "(both processes)\n\n",
      median(ip), *std::min_element(ip.begin(), ip.end()), *std::max_element(ip.begin(), ip.end()),
      median(ipcpu));
  auto mm = [](const std::vector<double>& v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.1f-%.1f", *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(b);
  };
  std::printf(
      "| packet | hot Gbit/s | hot min-max | hot / iperf3 | hot us/frame | hot CPU ns/KiB | "
      "hot CPU / iperf3 CPU | big Gbit/s | big min-max | big / iperf3 | big CPU ns/KiB | "
      "iperf3 -l packet Gbit/s | hot / iperf3 -l | big / iperf3 -l |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (std::size_t i = 0; i < n; ++i) {
    std::printf(
        "| %s | %.2f | %s | %.3f | %.2f | %.0f | %.2f | %.2f | %s | %.3f | %.0f | %.2f | %.3f | "
        "%.3f |\n",
        size_label(sizes_kib[i]).c_str(), median(hot[i].gbps), mm(hot[i].gbps).c_str(),
        median(hot[i].ratio), 1e6 / median(hot[i].fps), median(hot[i].cpu),
        median(hot[i].cpu_ratio), median(big[i].gbps), mm(big[i].gbps).c_str(),
        median(big[i].ratio), median(big[i].cpu), median(ipl[i]), median(hot[i].ratio_l),
        median(big[i].ratio_l));
  }
  std::printf("\n");
}

// ---------------------------------------------------------------- checksum ------------

void checksum_cost(double seconds, int reps, std::size_t big_tensor, std::vector<int> sizes_kib) {
  const double warmup = 0.3;
  std::printf("== Payload checksums (CRC32C, %s): one loopback connection, on vs off ==\n",
              crc32c_implementation());
  std::printf(
      "hot = tensor of max(128 KiB, packet) per side; big = %zu MiB tensor per side; %.1f s per "
      "run "
      "after %.1f s warm-up; %d repetitions, on and off back to back (order alternating)\n\n",
      big_tensor >> 20, seconds, warmup, reps);
  std::printf(
      "| packet | tensor | on Gbit/s | off Gbit/s | on / off | on CPU ns/KiB | off CPU ns/KiB |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|\n");
  for (int kib : sizes_kib) {
    const auto packet = static_cast<std::uint32_t>(kib) * 1024u;
    for (int which = 0; which < 2; ++which) {
      const std::size_t tb = which == 0 ? std::max<std::size_t>(128 * 1024, packet) : big_tensor;
      std::vector<double> on, off, ratio, cpu_on, cpu_off;
      for (int rep = 0; rep < reps; ++rep) {
        ThroughputResult a, b;
        if (rep % 2 == 0) {
          a = run_transport(packet, tb, seconds, warmup, true);
          b = run_transport(packet, tb, seconds, warmup, false);
        } else {
          b = run_transport(packet, tb, seconds, warmup, false);
          a = run_transport(packet, tb, seconds, warmup, true);
        }
        on.push_back(a.gbps);
        off.push_back(b.gbps);
        ratio.push_back(a.gbps / b.gbps);
        cpu_on.push_back(a.cpu_ns_per_kib);
        cpu_off.push_back(b.cpu_ns_per_kib);
      }
      std::printf("| %s | %s | %.2f | %.2f | %.3f | %.0f | %.0f |\n", size_label(kib).c_str(),
                  which == 0 ? "hot" : "big", median(on), median(off), median(ratio),
                  median(cpu_on), median(cpu_off));
      std::fflush(stdout);
    }
  }
  // The checksum alone, on one core: what it costs per byte beside the stack's cost.
  std::vector<std::byte> buf(big_tensor);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::byte>(i * 131);
  for (std::size_t len : {std::size_t{32} << 10, big_tensor}) {
    std::vector<double> gbs;
    for (int rep = 0; rep < reps; ++rep) {
      const auto t0 = Clk::now();
      std::uint32_t c = 0;
      std::size_t done = 0;
      while (done < (std::size_t{2} << 30)) {
        c = crc32c(c, buf.data(), len);
        done += len;
      }
      gbs.push_back(static_cast<double>(done) / seconds_since(t0) / 1e9);
      if (c == 42) std::printf(" ");
    }
    std::printf("\ncrc32c alone over %s (%s): %.1f GB/s",
                size_label(static_cast<int>(len >> 10)).c_str(),
                len == big_tensor ? "from memory" : "in cache", median(gbs));
  }
  std::printf("\n\n");
}

// ---------------------------------------------------------------- selection -----------

// A unit as the Sender's send buffer holds it (sender.h Sender::Item): connection, header,
// payload pointer, tag, enqueue time.
struct SenderItem {
  int conn;
  Header header;
  const std::byte* payload;
  std::uint64_t tag;
  TimeNs enqueued;
};

template <typename Push, typename Pop>
double time_ops(std::size_t ops, Push push, Pop pop) {
  const auto t0 = Clk::now();
  for (std::size_t i = 0; i < ops; ++i) {
    push(i);
    pop();
  }
  return std::chrono::duration<double, std::nano>(Clk::now() - t0).count() /
         static_cast<double>(ops);
}

void selection(int reps, std::size_t ops) {
  std::printf("== Selection: push + pop pairs at steady occupancy, ns per pair ==\n");
  std::printf(
      "%zu pairs per repetition, %d repetitions, random priorities (uniform), "
      "the queue prefilled to the occupancy\n\n",
      ops, reps);
  constexpr std::size_t kRand = 1 << 16;
  std::printf(
      "| priorities | occupancy | PriorityFifo<u64> ns | PriorityFifo<Sender item> ns | "
      "std::priority_queue<(prio,seq)> ns | ratio fifo/pq | ratio sender-item/pq |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int prios : {1, 64, 1024}) {
    for (std::size_t occupancy : {std::size_t{64}, std::size_t{4096}}) {
      std::mt19937_64 rng(42 + static_cast<unsigned>(prios));
      std::vector<int> pr(kRand);
      for (int& p : pr) p = static_cast<int>(rng() % static_cast<std::uint64_t>(prios));
      std::vector<double> a, b, c, ra, rb;
      std::uint64_t check_fifo = 0, check_pq = 0;
      for (int rep = 0; rep < reps; ++rep) {
        // PriorityFifo<u64>
        PriorityFifo<std::uint64_t> f(prios);
        std::uint64_t seq = 0, sink = 0;
        for (std::size_t i = 0; i < occupancy; ++i) f.push(pr[i % kRand], seq++);
        const double tf = time_ops(
            ops, [&](std::size_t i) { f.push(pr[(i + occupancy) % kRand], seq++); },
            [&] { sink = sink * 31 + f.pop(); });
        // PriorityFifo<SenderItem>
        PriorityFifo<SenderItem> g(prios);
        std::uint64_t seq2 = 0, sink2 = 0;
        for (std::size_t i = 0; i < occupancy; ++i) {
          SenderItem it{0, {}, nullptr, seq2++, 0};
          it.header.priority = static_cast<std::uint16_t>(pr[i % kRand]);
          g.push(pr[i % kRand], it);
        }
        const double tg = time_ops(
            ops,
            [&](std::size_t i) {
              const int p = pr[(i + occupancy) % kRand];
              SenderItem it{0, {}, nullptr, seq2++, static_cast<TimeNs>(i)};
              it.header.priority = static_cast<std::uint16_t>(p);
              g.push(p, it);
            },
            [&] { sink2 = sink2 * 31 + g.pop().tag; });
        // std::priority_queue of (priority, seq): min-heap, the same strict order.
        using E = std::pair<int, std::uint64_t>;
        std::priority_queue<E, std::vector<E>, std::greater<E>> q;
        std::uint64_t seq3 = 0, sink3 = 0;
        for (std::size_t i = 0; i < occupancy; ++i) q.push({pr[i % kRand], seq3++});
        const double tq = time_ops(
            ops,
            [&](std::size_t i) {
              q.push({pr[(i + occupancy) % kRand], seq3++});
            },
            [&] {
              sink3 = sink3 * 31 + q.top().second;
              q.pop();
            });
        if (sink != sink2 || sink != sink3)
          die("selection: the three queues popped different orders");
        check_fifo = sink;
        check_pq = sink3;
        a.push_back(tf);
        b.push_back(tg);
        c.push_back(tq);
        ra.push_back(tf / tq);
        rb.push_back(tg / tq);
      }
      (void)check_fifo, (void)check_pq;
      std::printf("| %d | %zu | %.1f | %.1f | %.1f | %.2f | %.2f |\n", prios, occupancy, median(a),
                  median(b), median(c), median(ra), median(rb));
    }
  }
  // The Sender reads the clock once per enqueue and once per hand-over.
  std::vector<double> clk;
  for (int rep = 0; rep < reps; ++rep) {
    TimeNs s = 0;
    const auto t0 = Clk::now();
    for (std::size_t i = 0; i < ops; ++i) s += SteadyClock::instance().now();
    clk.push_back(std::chrono::duration<double, std::nano>(Clk::now() - t0).count() /
                  static_cast<double>(ops));
    if (s == 42) std::printf(" ");
  }
  std::printf("\nSteadyClock::now(), read by Sender::enqueue and at each hand-over: %.1f ns\n\n",
              median(clk));
}

std::vector<int> parse_sizes(const std::string& s) {
  std::vector<int> v;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    v.push_back(std::stoi(s.substr(pos, end - pos)));
    pos = end + 1;
  }
  return v;
}

}  // namespace
}  // namespace qs::transport

int main(int argc, char** argv) {
  using namespace qs::transport;
  std::string mode = "all";
  double seconds = 3;
  int reps = 5, sel_reps = 7;
  std::size_t ops = 2'000'000;
  std::size_t tensor_mib = 64;
  std::vector<int> sizes = {4, 16, 32, 64, 256, 1024, 4096};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const std::size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--seconds="))
      seconds = std::atof(v);
    else if (const char* v = val("--reps="))
      reps = sel_reps = std::atoi(v);
    else if (const char* v = val("--ops="))
      ops = static_cast<std::size_t>(std::atoll(v));
    else if (const char* v = val("--tensor-mib="))
      tensor_mib = static_cast<std::size_t>(std::atoll(v));
    else if (const char* v = val("--sizes="))
      sizes = parse_sizes(v);
    else if (const char* v = val("--lowat-kib="))
      g_socket_options.notsent_lowat = std::atoll(v) * 1024;
    else if (const char* v = val("--sndbuf-kib="))
      g_socket_options.send_buffer = std::atoll(v) * 1024;
    else if (a == "--no-iperf")
      g_iperf = false;
    else if (a == "--no-iperf-per-size")
      g_iperf_per_size = false;
    else if (a == "throughput" || a == "selection" || a == "checksum" || a == "all")
      mode = a;
    else {
      std::fprintf(
          stderr,
          "usage: transport_bench [throughput|selection|checksum|all] [--seconds=3] [--reps=N] "
          "[--ops=N] [--tensor-mib=64] [--sizes=4,16,32,64,256,1024,4096]\n");
      return 2;
    }
  }
  std::size_t tensor = tensor_mib << 20;
  for (int s : sizes) tensor = std::max<std::size_t>(tensor, static_cast<std::size_t>(s) * 1024);
  if (mode == "throughput" || mode == "all") throughput(seconds, reps, tensor, sizes);
  if (mode == "selection" || mode == "all") selection(sel_reps, ops);
  if (mode == "checksum") checksum_cost(seconds, reps, tensor, sizes);
  return 0;
}
