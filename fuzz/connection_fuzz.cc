// libFuzzer target: the framing parser of a Connection (include/transport/quicksilver/
// transport/connection.h) on a real EventLoop: the input is what a peer wrote on the
// socket before closing it. Pushes are validated and received in place (kDirect), pulls
// streamed (kStream), control frames buffered (kBuffer), as the server and worker do.
// Properties: the connection always ends with on_closed exactly once; no payload byte is
// written outside an approved range (guard bytes around the tensor stay untouched); every
// streamed piece lies inside its frame; a buffered payload has the header's length. The
// input's headers are sealed first (seal.h: checksums written, unless a header ends in
// 0xEE), so that the parser behind the header's checksum is reached.
#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/tcp_connection.h"
#include "seal.h"

using namespace qs;
using namespace qs::transport;

namespace {

constexpr std::size_t kGuard = 4096;
constexpr std::size_t kTensor = 8192;

class Receiver : public FrameHandler {
 public:
  Receiver() : memory(kGuard + kTensor + kGuard, std::byte{0x5a}) {
    push.kind = FrameKind::kPush;
    push.tensor_bytes = {kTensor, 16};
    push.element_size = {4, 2};
    push.max_length = 4096;
    push.min_iteration = 0;
    push.max_iteration = 2;
    push.expected_sender = 1;
    push.num_priorities = 4;
    pull = push;
    pull.kind = FrameKind::kPull;
  }
  Result<PayloadTarget> on_header(Connection&, const Header& h) override {
    if (h.kind == FrameKind::kPush) {
      QS_RETURN_IF_ERROR(validate_data_header(h, push));
      if (h.tensor != 0) return PayloadTarget::stream();
      return PayloadTarget::to(memory.data() + kGuard + h.offset);
    }
    if (h.kind == FrameKind::kPull) {
      QS_RETURN_IF_ERROR(validate_data_header(h, pull));
      return PayloadTarget::stream();
    }
    return PayloadTarget::buffer();
  }
  Status on_payload(Connection&, const Header& h, std::uint64_t at, const std::byte*,
                    std::size_t n) override {
    QS_CHECK(at + n <= h.length);
    return Status::ok();
  }
  Status on_frame(Connection& c, const Header& h) override {
    if (h.kind != FrameKind::kPush && h.kind != FrameKind::kPull) {
      QS_CHECK(c.small_payload().size() == wire_payload_length(h));
    }
    ++frames;
    return Status::ok();
  }
  void on_closed(Connection&, const Status&) override {
    ++closed;
    done = true;
  }

  DataRules push, pull;
  std::vector<std::byte> memory;
  int frames = 0;
  int closed = 0;
  bool done = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* input, std::size_t size) {
  size = std::min<std::size_t>(size, 64 * 1024);  // within the socket pair's buffer
  const std::vector<std::uint8_t> sealed = seal_frames(input, size);
  const std::uint8_t* data = sealed.data();
  int sv[2];
  QS_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  Fd mine(sv[0]), peer(sv[1]);
  int buf = 256 * 1024;
  ::setsockopt(peer.get(), SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(mine.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(peer.get(), data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;  // the buffer is full: the rest is not on the wire
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(peer.get(), SHUT_WR);
  QS_CHECK(::fcntl(mine.get(), F_SETFL, O_NONBLOCK) == 0);

  auto loop = EventLoop::create();
  QS_CHECK(loop.is_ok());
  Receiver r;
  {
    TcpConnection c(**loop, std::move(mine), r, "fuzz peer", 0);
    QS_CHECK(c.start().is_ok());
    (*loop)->schedule_after(10 * kNsPerSec, [&] { (*loop)->fail(unavailable("fuzz deadline")); });
    const Status s = (*loop)->run([&] { return r.done; });
    QS_CHECK_MSG(s.is_ok(), s.to_string());
  }
  QS_CHECK(r.closed == 1);
  for (std::size_t i = 0; i < kGuard; ++i) {
    QS_CHECK(r.memory[i] == std::byte{0x5a} && r.memory[kGuard + kTensor + i] == std::byte{0x5a});
  }
  return 0;
}
