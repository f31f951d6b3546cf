// Connections over loopback: garbage, bad and truncated streams close with a clear error
// and write nothing; frames round-trip; the one Sender keeps priority order on the wire.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "quicksilver/core/rng.h"
#include "quicksilver/transport/crc32c.h"
#include "quicksilver/transport/sender.h"
#include "quicksilver/transport/socket.h"
#include "quicksilver/transport/tcp_connection.h"

namespace qs::transport {
namespace {

// The sending side of a test connection: ignores what it receives and lets the Sender
// refill the socket whenever it becomes writable (q.s must be set before it does).
struct Quiet : FrameHandler {
  Sender* s = nullptr;
  Result<PayloadTarget> on_header(Connection&, const Header&) override {
    return PayloadTarget::buffer();
  }
  Status on_frame(Connection&, const Header&) override { return Status::ok(); }
  void on_writable(Connection& c) override { (void)s->on_writable(c.index()); }
  void on_closed(Connection&, const Status&) override {}
};

using ::testing::HasSubstr;

constexpr TimeNs kTestDeadline = 10 * kNsPerSec;

// A connected loopback pair: `a` configured non-blocking, `b` blocking (a raw peer).
struct Pair {
  Fd a, b;
};
Pair make_pair(const SocketOptions& opts = {}) {
  auto l = listen_tcp("127.0.0.1", 0);
  QS_CHECK(l.is_ok());
  auto port = local_port(l->get());
  QS_CHECK(port.is_ok());
  auto c = connect_tcp("127.0.0.1", *port, SteadyClock::instance().now() + kTestDeadline);
  QS_CHECK(c.is_ok());
  Fd acc;
  for (int i = 0; i < 1000 && !acc.valid(); ++i) {
    auto a = accept_tcp(l->get());
    QS_CHECK(a.is_ok());
    acc = std::move(*a);
    if (!acc.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  QS_CHECK(acc.valid());
  Status s = configure_socket(acc.get(), opts);
  QS_CHECK_MSG(s.is_ok(), s.to_string());
  return Pair{std::move(acc), std::move(*c)};
}

// Receives push frames for one 4 KiB tensor straight into `memory` (after validation).
class Receiver : public FrameHandler {
 public:
  Receiver() : memory(8192, std::byte{0x5a}) {
    rules.kind = FrameKind::kPush;
    rules.tensor_bytes = {4096};
    rules.element_size = {4};
    rules.max_length = 4096;
    rules.min_iteration = 0;
    rules.max_iteration = 0;
    rules.expected_sender = 0;
    rules.num_priorities = 1;
  }
  Result<PayloadTarget> on_header(Connection&, const Header& h) override {
    QS_RETURN_IF_ERROR(validate_data_header(h, rules));
    return PayloadTarget::to(memory.data() + h.offset);
  }
  Status on_frame(Connection&, const Header& h) override {
    frames.push_back(h);
    return Status::ok();
  }
  void on_closed(Connection&, const Status& why) override {
    closed = why;
    done = true;
  }

  DataRules rules;
  std::vector<std::byte> memory;  // 4 KiB tensor + 4 KiB guard, all 0x5a
  std::vector<Header> frames;
  Status closed;
  bool done = false;
};

bool untouched(const std::vector<std::byte>& m) {
  for (std::byte b : m) {
    if (b != std::byte{0x5a}) return false;
  }
  return true;
}

// Runs the loop until the receiver's connection closed, failing on a deadline.
Status run_until_closed(EventLoop& loop, Receiver& r) {
  loop.schedule_after(kTestDeadline, [&] { loop.fail(unavailable("test deadline")); });
  return loop.run([&] { return r.done; });
}

void write_all(int fd, const void* p, std::size_t n) {
  ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
}

// A whole frame as a peer writes it: the header (payload checksum stamped unless told
// otherwise) and `payload` bytes.
std::vector<unsigned char> frame_bytes(Header h, const std::vector<unsigned char>& payload,
                                       bool stamp = true) {
  h.checksummed = stamp;
  h.payload_crc = stamp ? crc32c(0, payload.data(), payload.size()) : 0;
  const HeaderBytes hb = encode_header(h);
  std::vector<unsigned char> f(kHeaderSize + payload.size());
  std::memcpy(f.data(), hb.data(), kHeaderSize);
  std::memcpy(f.data() + kHeaderSize, payload.data(), payload.size());
  return f;
}

std::vector<std::byte> read_error_frame(int fd) {
  std::vector<std::byte> buf(kHeaderSize + kMaxErrorText);
  std::size_t have = 0;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (;;) {
    ssize_t r = ::recv(fd, buf.data() + have, buf.size() - have, 0);
    if (r <= 0) break;
    have += static_cast<std::size_t>(r);
  }
  buf.resize(have);
  return buf;
}

// Garbage fails the header's checksum first (before its magic is even read).
TEST(Connection, GarbageStreamClosesWithChecksumErrorAndWritesNothing) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Pair p = make_pair();
  Receiver r;
  TcpConnection c(**loop, std::move(p.a), r, "peer 0", 0);
  ASSERT_TRUE(c.start().is_ok());
  Rng rng(7);
  std::vector<unsigned char> junk(100000);
  for (auto& x : junk) x = static_cast<unsigned char>(rng.uniform_int(0, 255));
  junk[0] = 0x51;  // not 0xC?
  write_all(p.b.get(), junk.data(), junk.size());
  ASSERT_TRUE(run_until_closed(**loop, r).is_ok());
  EXPECT_EQ(r.closed.code(), StatusCode::kProtocolError);
  EXPECT_THAT(r.closed.message(), HasSubstr("field 'checksum'"));
  EXPECT_THAT(r.closed.message(), HasSubstr("a frame from peer 0"));
  EXPECT_TRUE(r.frames.empty());
  EXPECT_TRUE(untouched(r.memory));
  // The peer is told why before the connection closes.
  std::vector<std::byte> back = read_error_frame(p.b.get());
  ASSERT_GE(back.size(), kHeaderSize);
  auto h = decode_header(back.data());
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->kind, FrameKind::kError);
  std::string text(reinterpret_cast<const char*>(back.data() + kHeaderSize),
                   back.size() - kHeaderSize);
  EXPECT_THAT(text, HasSubstr("field 'checksum'"));
}

// A closed connection holds no buffer until its owner gets round to destroying it, and
// allocates none before its first read (issue 15: each accepted connection held 256 KiB,
// closed ones until exit).
TEST(Connection, AllocatesItsReadBufferOnFirstReadAndFreesItOnClose) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Pair p = make_pair();
  Receiver r;
  TcpConnection c(**loop, std::move(p.a), r, "peer 0", 0);
  c.set_read_buffer_size(64);
  ASSERT_TRUE(c.start().is_ok());
  EXPECT_EQ(c.buffer_bytes(), 0u);
  const char junk[kHeaderSize] = {0x51};  // a whole header with a bad magic
  write_all(p.b.get(), junk, sizeof junk);
  ASSERT_TRUE(run_until_closed(**loop, r).is_ok());
  EXPECT_TRUE(c.closed());
  EXPECT_EQ(c.buffer_bytes(), 0u);
  // With the default size (a known peer's) too.
  Pair q = make_pair();
  Receiver r2;
  TcpConnection d(**loop, std::move(q.a), r2, "peer 1", 0);
  ASSERT_TRUE(d.start().is_ok());
  write_all(q.b.get(), junk, sizeof junk);
  ASSERT_TRUE(run_until_closed(**loop, r2).is_ok());
  EXPECT_EQ(d.buffer_bytes(), 0u);
}

TEST(Connection, EveryBadFieldClosesBeforeAnyPayloadByteIsWritten) {
  struct Case {
    const char* field;
    Header h;
  };
  auto base = [] {
    Header h;
    h.kind = FrameKind::kPush;
    h.length = 1024;
    return h;
  };
  std::vector<Case> cases;
  {
    Header h = base();
    h.tensor = 1;
    cases.push_back({"tensor", h});
    h = base();
    h.offset = 3584;
    cases.push_back({"length", h});  // 3584 + 1024 > 4096
    h = base();
    h.offset = 8192;
    cases.push_back({"offset", h});
    h = base();
    h.offset = 2;
    cases.push_back({"offset", h});
    h = base();
    h.iteration = 1;
    cases.push_back({"iteration", h});
    h = base();
    h.sender = 3;
    cases.push_back({"sender", h});
    h = base();
    h.kind = FrameKind::kPull;
    cases.push_back({"kind", h});
    h = base();
    h.priority = 1;
    cases.push_back({"priority", h});
    h = base();
    h.length = 8192;
    cases.push_back({"length", h});
  }
  for (const Case& k : cases) {
    auto loop = EventLoop::create();
    ASSERT_TRUE(loop.is_ok());
    Pair p = make_pair();
    Receiver r;
    TcpConnection c(**loop, std::move(p.a), r, "peer 0", 0);
    ASSERT_TRUE(c.start().is_ok());
    const auto frame = frame_bytes(k.h, std::vector<unsigned char>(k.h.length, 0xEE));
    write_all(p.b.get(), frame.data(), frame.size());
    ASSERT_TRUE(run_until_closed(**loop, r).is_ok());
    EXPECT_EQ(r.closed.code(), StatusCode::kProtocolError) << k.field;
    EXPECT_THAT(r.closed.message(), HasSubstr(std::string("field '") + k.field + "'"));
    EXPECT_TRUE(untouched(r.memory)) << k.field;
    EXPECT_TRUE(r.frames.empty());
  }
}

TEST(Connection, TruncatedHeaderOrPayloadClosesWithClearError) {
  for (int cut : {10, static_cast<int>(kHeaderSize) + 100}) {
    auto loop = EventLoop::create();
    ASSERT_TRUE(loop.is_ok());
    Pair p = make_pair();
    Receiver r;
    TcpConnection c(**loop, std::move(p.a), r, "peer 0", 0);
    ASSERT_TRUE(c.start().is_ok());
    Header h;
    h.kind = FrameKind::kPush;
    h.offset = 2048;
    h.length = 1024;
    const auto frame = frame_bytes(h, std::vector<unsigned char>(h.length, 0xEE));
    write_all(p.b.get(), frame.data(), static_cast<std::size_t>(cut));
    p.b.reset();  // the peer dies mid-frame
    ASSERT_TRUE(run_until_closed(**loop, r).is_ok());
    EXPECT_EQ(r.closed.code(), StatusCode::kUnavailable);
    EXPECT_THAT(r.closed.message(), HasSubstr("mid-frame"));
    EXPECT_TRUE(r.frames.empty());
    // Nothing outside the validated range [2048, 3072) changed.
    for (std::size_t i = 0; i < r.memory.size(); ++i) {
      if (i < 2048 || i >= 3072) {
        ASSERT_EQ(r.memory[i], std::byte{0x5a}) << i;
      }
    }
  }
}

// A payload byte changed in transit (after TCP's checksum: a proxy, a middlebox, memory)
// fails the frame's CRC32C: the connection closes naming the peer, the frame and both
// checksums, and the frame is never delivered. Every byte position of a small frame, and
// one split over many reads.
TEST(Connection, CorruptedPayloadIsDetectedAndNeverDelivered) {
  Header h;
  h.kind = FrameKind::kPush;
  h.offset = 1024;
  h.length = 2048;
  std::vector<unsigned char> payload(h.length);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<unsigned char>(i * 7);
  for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{2047}}) {
    for (bool dribble : {false, true}) {
      auto loop = EventLoop::create();
      ASSERT_TRUE(loop.is_ok());
      Pair p = make_pair();
      Receiver r;
      TcpConnection c(**loop, std::move(p.a), r, "worker 3", 0);
      ASSERT_TRUE(c.start().is_ok());
      auto frame = frame_bytes(h, payload);
      frame[kHeaderSize + at] ^= 0x10;  // one bit
      if (dribble) {
        for (std::size_t i = 0; i < frame.size(); i += 100) {
          write_all(p.b.get(), frame.data() + i, std::min<std::size_t>(100, frame.size() - i));
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      } else {
        write_all(p.b.get(), frame.data(), frame.size());
      }
      ASSERT_TRUE(run_until_closed(**loop, r).is_ok());
      EXPECT_EQ(r.closed.code(), StatusCode::kProtocolError);
      EXPECT_THAT(r.closed.message(),
                  HasSubstr("corrupted payload: the push frame from worker 3 (tensor 0 bytes "
                            "[1024, 3072), iteration 0) has payload CRC32C"));
      EXPECT_TRUE(r.frames.empty()) << "byte " << at;
    }
  }
  // The same frame unharmed is delivered.
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Pair p = make_pair();
  Receiver r;
  TcpConnection c(**loop, std::move(p.a), r, "worker 3", 0);
  ASSERT_TRUE(c.start().is_ok());
  const auto frame = frame_bytes(h, payload);
  write_all(p.b.get(), frame.data(), frame.size());
  (*loop)->schedule_after(kTestDeadline, [&] { (*loop)->fail(unavailable("test deadline")); });
  ASSERT_TRUE((*loop)->run([&] { return !r.frames.empty(); }).is_ok());
  EXPECT_EQ(std::memcmp(r.memory.data() + 1024, payload.data(), payload.size()), 0);
}

// A node that requires payload checksums refuses a frame without one, naming the setting;
// one that runs without (set_payload_checksums(false)) takes it.
TEST(Connection, AFrameWithoutPayloadChecksumIsRefusedUnlessChecksumsAreOff) {
  Header h;
  h.kind = FrameKind::kPush;
  h.length = 64;
  const auto frame = frame_bytes(h, std::vector<unsigned char>(64, 1), /*stamp=*/false);
  for (bool required : {true, false}) {
    auto loop = EventLoop::create();
    ASSERT_TRUE(loop.is_ok());
    Pair p = make_pair();
    Receiver r;
    TcpConnection c(**loop, std::move(p.a), r, "worker 3", 0);
    c.set_payload_checksums(required);
    ASSERT_TRUE(c.start().is_ok());
    write_all(p.b.get(), frame.data(), frame.size());
    (*loop)->schedule_after(kTestDeadline, [&] { (*loop)->fail(unavailable("test deadline")); });
    ASSERT_TRUE((*loop)->run([&] { return r.done || !r.frames.empty(); }).is_ok());
    if (required) {
      EXPECT_THAT(r.closed.message(),
                  HasSubstr("a push frame from worker 3 carries no payload checksum"));
      EXPECT_THAT(r.closed.message(), HasSubstr("--no-checksum"));
      EXPECT_TRUE(untouched(r.memory));
    } else {
      EXPECT_EQ(r.frames.size(), 1u);
    }
  }
}

TEST(Connection, PeerThatSaysNothingDoesNotHang) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Pair p = make_pair();
  Receiver r;
  TcpConnection c(**loop, std::move(p.a), r, "peer 0", 0);
  ASSERT_TRUE(c.start().is_ok());
  (*loop)->schedule_after(200 * kNsPerMs,
                          [&] { (*loop)->fail(unavailable("no frame from peer 0 within 200ms")); });
  const TimeNs t0 = SteadyClock::instance().now();
  Status s = (*loop)->run([&] { return r.done; });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_LT(SteadyClock::instance().now() - t0, 2 * kNsPerSec);
}

// Sender and receiver on one loop, joined over loopback with 4 KiB socket buffers so that
// writes are partial; send() pushes 1000 frames of 512 B taken from `src`.
class SmallBufferLink : public ::testing::Test {
 protected:
  static constexpr int kFrames = 1000;
  void SetUp() override {
    auto l = EventLoop::create();
    ASSERT_TRUE(l.is_ok());
    loop = std::move(*l);
    SocketOptions small;
    small.send_buffer = 4096;
    small.notsent_lowat = 4096;
    Pair p = make_pair(small);
    ASSERT_TRUE(configure_socket(p.b.get(), small).is_ok());
    rx = std::make_unique<TcpConnection>(*loop, std::move(p.a), r, "rx", 0);
    tx = std::make_unique<TcpConnection>(*loop, std::move(p.b), q, "tx", 0);
    sender = std::make_unique<Sender>(SendOrder::kFifo, 1, *loop);
    q.s = sender.get();
    sender->set_connections({tx.get()});
  }
  // Starts both ends, queues the frames and runs the loop until every frame arrived and
  // `also` holds.
  void send(const std::vector<std::byte>& src, const std::function<bool()>& also) {
    ASSERT_TRUE(rx->start().is_ok());
    ASSERT_TRUE(tx->start().is_ok());
    for (int i = 0; i < kFrames; ++i) {
      Header h;
      h.kind = FrameKind::kPush;
      h.offset = static_cast<std::uint64_t>((i % 8) * 512);
      h.length = 512;
      sender->enqueue(0, h, src.data() + h.offset, static_cast<std::uint64_t>(i));
    }
    ASSERT_TRUE(sender->pump().is_ok());
    loop->schedule_after(kTestDeadline, [&] { loop->fail(unavailable("test deadline")); });
    ASSERT_TRUE(loop->run([&] { return r.frames.size() == kFrames && also(); }).is_ok());
  }

  std::unique_ptr<EventLoop> loop;  // declared first: outlives the connections
  Receiver r;
  Quiet q;
  std::unique_ptr<TcpConnection> rx, tx;
  std::unique_ptr<Sender> sender;
};

TEST_F(SmallBufferLink, FramesRoundTripWithPartialWrites) {
  std::vector<std::byte> src(4096);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7);
  send(src, [] { return true; });
  EXPECT_TRUE(sender->idle());
  EXPECT_EQ(std::memcmp(r.memory.data(), src.data(), 4096), 0);
  EXPECT_EQ(sender->units_sent(), static_cast<std::uint64_t>(kFrames));
}

// Transmit timestamps date every written byte's departure: after 1000 frames through a
// small buffer, the connection has learnt (through the event loop's EPOLLERR, without a
// poll of its own) that all bytes_written() left the host, at a time between the first
// write and now. Without the option there is nothing to learn and no busy loop.
TEST_F(SmallBufferLink, TransmitTimestampsReportEveryByteOnTheWire) {
  ASSERT_TRUE(tx->enable_wire_timestamps().is_ok());
  EXPECT_TRUE(tx->wire_timestamps());
  EXPECT_FALSE(rx->wire_timestamps());
  const TimeNs before = loop->now();
  send(std::vector<std::byte>(4096, std::byte{1}),
       [&] { return tx->wire().bytes >= tx->bytes_written(); });
  EXPECT_EQ(tx->wire().bytes, tx->bytes_written());
  EXPECT_EQ(tx->bytes_written(), static_cast<std::uint64_t>(kFrames) * (kHeaderSize + 512));
  EXPECT_GE(tx->wire().at, before - kNsPerMs);  // the clocks' offset is read, not exact
  EXPECT_LE(tx->wire().at, loop->now() + kNsPerMs);
  EXPECT_EQ(rx->wire().bytes, 0u);
  EXPECT_EQ(rx->wire().at, -1);
}

// Mercury IV-C on the wire: 64 MiB of low-priority packets are queued; once the receiver is
// busy draining them, one high-priority packet is queued. It must overtake almost all of
// the bulk (it waits only for bytes already committed to the kernel).
TEST(Sender, UrgentPacketOvertakesQueuedBulkOnTheWire) {
  constexpr std::size_t kPacket = 32 * 1024;
  constexpr int kBulk = 2048;  // 64 MiB
  SocketOptions opts;          // the defaults: cubic, NOTSENT_LOWAT 128 KiB, SNDBUF 4 MiB
  Pair p = make_pair(opts);
  std::atomic<int> received{0};
  std::atomic<int> urgent_at{-1};
  std::atomic<bool> rx_failed{false};
  std::thread rx_thread([&, fd = std::move(p.b)]() mutable {
    // The raw receiver: reads frames, records where the urgent one arrived.
    std::vector<std::byte> buf(kHeaderSize + kPacket);
    auto read_n = [&](std::size_t n) {
      std::size_t have = 0;
      while (have < n) {
        ssize_t r = ::recv(fd.get(), buf.data() + have, n - have, 0);
        if (r <= 0) return false;
        have += static_cast<std::size_t>(r);
      }
      return true;
    };
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < kBulk + 1; ++i) {
      if (!read_n(kHeaderSize)) {
        rx_failed = true;
        return;
      }
      auto h = decode_header(buf.data());
      if (!h.is_ok() || !read_n(h->length)) {
        rx_failed = true;
        return;
      }
      if (h->priority == 0) urgent_at = i;
      received.fetch_add(1, std::memory_order_release);
    }
  });
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Quiet q;
  TcpConnection tx(**loop, std::move(p.a), q, "tx", 0);
  ASSERT_TRUE(tx.start().is_ok());
  Sender sender(SendOrder::kPriority, 8, **loop);
  q.s = &sender;
  sender.set_connections({&tx});
  TimeNs urgent_delay = -1;
  std::vector<TimeNs> bulk_delays;
  sender.set_sample_callback([&](const QueueSample& q2) {
    if (q2.priority == 0)
      urgent_delay = q2.delay;
    else
      bulk_delays.push_back(q2.delay);
  });
  std::vector<std::byte> bulk(kPacket * kBulk, std::byte{1});
  const TimeNs t0 = (*loop)->now();
  for (int i = 0; i < kBulk; ++i) {
    Header h;
    h.kind = FrameKind::kPush;
    h.tensor = 1;
    h.offset = static_cast<std::uint64_t>(i) * kPacket;
    h.length = kPacket;
    h.priority = 5;
    sender.enqueue(0, h, bulk.data() + h.offset, static_cast<std::uint64_t>(i));
  }
  ASSERT_TRUE(sender.pump().is_ok());
  int received_at_enqueue = -1;
  std::function<void()> poll = [&] {
    if (received.load(std::memory_order_acquire) >= 64) {
      received_at_enqueue = received.load();
      Header h;
      h.kind = FrameKind::kPush;
      h.tensor = 0;
      h.length = kPacket;
      h.priority = 0;
      sender.enqueue(0, h, bulk.data(), 999999);
      (void)sender.pump();
      return;
    }
    (*loop)->schedule_after(20 * kNsPerUs, poll);
  };
  (*loop)->schedule_after(0, poll);
  (*loop)->schedule_after(kTestDeadline, [&] { (*loop)->fail(unavailable("test deadline")); });
  Status s = (*loop)->run([&] { return received_at_enqueue >= 0 && sender.idle(); });
  const TimeNs t_sent = (*loop)->now() - t0;
  rx_thread.join();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_FALSE(rx_failed.load());
  const int at = urgent_at.load();
  const double gbps = 8.0 * static_cast<double>(kPacket) * kBulk / static_cast<double>(t_sent);
  std::printf(
      "[ metric ] urgent packet queued after %d of %d bulk packets had arrived; arrived as "
      "packet %d (%d bulk packets = %.1f MiB ahead of it); its queueing delay %.1f us; "
      "bulk median queueing delay %.1f ms; loopback %.1f Gbit/s (cubic, NOTSENT_LOWAT "
      "128KiB, SNDBUF 4MiB)\n",
      received_at_enqueue, kBulk, at, at, at * 32.0 / 1024.0, to_us(urgent_delay),
      to_ms(percentile(bulk_delays, 50)), gbps);
  ASSERT_GE(at, 0);
  EXPECT_LT(at, kBulk / 4) << "the urgent packet did not overtake the bulk";
  // It waits only for what the kernel already held: at most ~16 MiB of socket buffers.
  EXPECT_LT(at - received_at_enqueue, 512);
  EXPECT_GE(urgent_delay, 0);
}

TEST(Sender, FifoOrderIgnoresPriority) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  Pair p = make_pair();
  ASSERT_TRUE(configure_socket(p.b.get(), SocketOptions{}).is_ok());
  struct Rec : FrameHandler {
    std::vector<std::uint32_t> order;
    Result<PayloadTarget> on_header(Connection&, const Header&) override {
      return PayloadTarget::stream();
    }
    Status on_payload(Connection&, const Header&, std::uint64_t, const std::byte*,
                      std::size_t) override {
      return Status::ok();
    }
    Status on_frame(Connection&, const Header& h) override {
      order.push_back(h.tensor);
      return Status::ok();
    }
    void on_closed(Connection&, const Status&) override {}
  } rec;
  Quiet q;
  TcpConnection rx(**loop, std::move(p.a), rec, "rx", 0);
  TcpConnection tx(**loop, std::move(p.b), q, "tx", 0);
  ASSERT_TRUE(rx.start().is_ok());
  ASSERT_TRUE(tx.start().is_ok());
  for (SendOrder order : {SendOrder::kFifo, SendOrder::kPriority}) {
    rec.order.clear();
    Sender sender(order, 4, **loop);
    q.s = &sender;
    sender.set_connections({&tx});
    std::vector<std::byte> data(64);
    // Not pumped until all are queued, so the order is decided by the discipline alone.
    for (std::uint32_t t : {3u, 1u, 2u, 0u}) {
      Header h;
      h.kind = FrameKind::kPush;
      h.tensor = t;
      h.length = 64;
      h.priority = static_cast<std::uint16_t>(t);
      sender.enqueue(0, h, data.data(), t);
    }
    ASSERT_TRUE(sender.pump().is_ok());
    (*loop)->schedule_after(kTestDeadline, [&] { (*loop)->fail(unavailable("test deadline")); });
    ASSERT_TRUE((*loop)->run([&] { return rec.order.size() == 4; }).is_ok());
    if (order == SendOrder::kFifo) {
      EXPECT_EQ(rec.order, (std::vector<std::uint32_t>{3, 1, 2, 0}));
    } else {
      EXPECT_EQ(rec.order, (std::vector<std::uint32_t>{0, 1, 2, 3}));
    }
  }
}

}  // namespace
}  // namespace qs::transport
