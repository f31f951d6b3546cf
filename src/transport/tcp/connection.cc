// TCP as the PS runtime's transport (quicksilver/transport/tcp_connection.h).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/crc32c.h"
#include "quicksilver/transport/tcp_connection.h"

namespace qs::transport {
namespace {

// A payload at least this large is received straight into its destination when the read
// buffer is empty (no copy); smaller pieces go through the read buffer.
constexpr std::uint64_t kDirectMin = 16 * 1024;
// Bytes read per readiness event before returning to the loop (fairness between peers
// and the sender).
constexpr std::uint64_t kReadBudget = 4 * 1024 * 1024;
constexpr int kMaxIov = 64;

}  // namespace

TcpConnection::TcpConnection(EventLoop& loop, Fd fd, FrameHandler& handler, std::string peer,
                             int index)
    : Connection(std::move(peer), index), loop_(loop), fd_(std::move(fd)), handler_(handler) {}

TcpConnection::~TcpConnection() {
  if (started_ && !closed_) loop_.unwatch(fd_.get());
}

Status TcpConnection::start() {
  QS_CHECK(!started_);
  started_ = true;
  return loop_.watch(fd_.get(), EPOLLIN, [this](std::uint32_t ev) { on_events(ev); });
}

Status TcpConnection::enable_wire_timestamps() {
  QS_CHECK(bytes_written_ == 0);
  QS_RETURN_IF_ERROR(enable_tx_timestamps(fd_.get()).with_context(peer()));
  wire_enabled_ = true;
  return Status::ok();
}

void TcpConnection::poll_wire() {
  if (!wire_enabled_ || closed_) return;
  Status s = drain_tx_timestamps(fd_.get(), &wire_);
  if (!s.is_ok()) close(s.with_context(peer()));
}

void TcpConnection::on_events(std::uint32_t events) {
  if (closed_) return;
  // Queued timestamps raise EPOLLERR until read (they are not a socket error: those the
  // read below reports).
  if (events & EPOLLERR) poll_wire();
  if (closed_) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    Status s = read_some();
    if (!s.is_ok()) {
      // The peer is told why, unless it is gone (connection loss: nobody listens).
      close(s,
            /*tell_peer=*/s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kIoError);
      return;
    }
    if (closed_) return;
  }
  if (events & EPOLLOUT) {
    Status s = flush();
    if (!s.is_ok() || closed_) return;
    handler_.on_writable(*this);
  }
}

Status TcpConnection::read_some() {
  std::uint64_t budget = kReadBudget;
  while (budget > 0 && !closed_) {
    // Pull bytes from the socket when the read buffer is drained.
    if (rpos_ == rend_) {
      ssize_t r;
      const bool direct =
          in_payload_ && target_.mode == PayloadTarget::Mode::kDirect && want_ - got_ >= kDirectMin;
      if (direct) {
        r = ::recv(fd_.get(), target_.direct + got_, want_ - got_, MSG_DONTWAIT);
      } else {
        if (rbuf_.size() != read_buffer_size_) {  // drained: safe to replace
          std::vector<std::byte>(std::max<std::size_t>(read_buffer_size_, 1)).swap(rbuf_);
        }
        r = ::recv(fd_.get(), rbuf_.data(), rbuf_.size(), MSG_DONTWAIT);
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
        if (errno == EINTR) continue;
        return errno_status("recv from " + peer(), errno);
      }
      if (r == 0) {
        if (in_payload_) {
          return unavailable(peer() + " closed the connection mid-frame: got " +
                             std::to_string(got_) + " of " + std::to_string(want_) +
                             " payload bytes of a " + frame_kind_name(cur_.kind) + " frame");
        }
        if (hhave_ > 0) {
          return unavailable(peer() + " closed the connection mid-frame: got " +
                             std::to_string(hhave_) + " of " + std::to_string(kHeaderSize) +
                             " header bytes");
        }
        return unavailable(peer() + " closed the connection");
      }
      bytes_read_ += static_cast<std::uint64_t>(r);
      budget -= std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(r));
      if (direct) {
        payload_crc_ = crc32c(payload_crc_, target_.direct + got_, static_cast<std::size_t>(r));
        got_ += static_cast<std::uint64_t>(r);
        if (got_ == want_) QS_RETURN_IF_ERROR(end_of_frame());
        continue;
      }
      rpos_ = 0;
      rend_ = static_cast<std::size_t>(r);
    }
    // Parse what the read buffer holds.
    while (rpos_ < rend_ && !closed_) {
      if (!in_payload_) {
        const std::size_t take = std::min(kHeaderSize - hhave_, rend_ - rpos_);
        std::memcpy(hbuf_.data() + hhave_, rbuf_.data() + rpos_, take);
        hhave_ += take;
        rpos_ += take;
        if (hhave_ < kHeaderSize) break;
        hhave_ = 0;
        auto decoded = decode_header(hbuf_.data());
        if (!decoded.is_ok()) return decoded.status().with_context("a frame from " + peer());
        cur_ = *decoded;
        want_ = wire_payload_length(cur_);
        if (want_ > 0 && !cur_.checksummed && payload_checksums()) {
          return protocol_error(
              "a " + std::string(frame_kind_name(cur_.kind)) + " frame from " + peer() +
              " carries no payload checksum, which this node requires (is --no-checksum "
              "given to some nodes of the job only?)");
        }
        QS_ASSIGN_OR_RETURN(target_, handler_.on_header(*this, cur_));
        if (closed_) return Status::ok();
        got_ = 0;
        payload_crc_ = 0;
        small_.clear();
        if (target_.mode == PayloadTarget::Mode::kDirect)
          QS_CHECK(target_.direct != nullptr || want_ == 0);
        in_payload_ = true;
        if (want_ == 0) QS_RETURN_IF_ERROR(end_of_frame());
      } else {
        const std::size_t take =
            static_cast<std::size_t>(std::min<std::uint64_t>(want_ - got_, rend_ - rpos_));
        QS_RETURN_IF_ERROR(deliver(rbuf_.data() + rpos_, take));
        rpos_ += take;
        got_ += take;
        if (got_ == want_) QS_RETURN_IF_ERROR(end_of_frame());
      }
    }
  }
  return Status::ok();
}

Status TcpConnection::deliver(const std::byte* p, std::size_t n) {
  if (cur_.checksummed) payload_crc_ = crc32c(payload_crc_, p, n);
  switch (target_.mode) {
    case PayloadTarget::Mode::kDirect:
      std::memcpy(target_.direct + got_, p, n);
      return Status::ok();
    case PayloadTarget::Mode::kStream:
      return handler_.on_payload(*this, cur_, got_, p, n);
    case PayloadTarget::Mode::kBuffer:
      QS_CHECK(small_.size() + n <= kMaxErrorText + kHelloBodySize);
      small_.insert(small_.end(), p, p + n);
      return Status::ok();
  }
  return Status::ok();
}

Status TcpConnection::end_of_frame() {
  in_payload_ = false;
  const Header h = cur_;
  if (h.checksummed && want_ > 0 && payload_crc_ != h.payload_crc) {
    char crcs[64];
    std::snprintf(crcs, sizeof crcs, "0x%08x, its header says 0x%08x", payload_crc_, h.payload_crc);
    const bool data = h.kind == FrameKind::kPush || h.kind == FrameKind::kPull;
    return protocol_error(
        std::string("corrupted payload: the ") + frame_kind_name(h.kind) + " frame from " + peer() +
        (data ? " (tensor " + std::to_string(h.tensor) + " bytes [" + std::to_string(h.offset) +
                    ", " + std::to_string(h.offset + h.length) + "), iteration " +
                    std::to_string(h.iteration) + ")"
              : std::string()) +
        " has payload CRC32C " + crcs + "; nothing of it was used");
  }
  return handler_.on_frame(*this, h);
}

void TcpConnection::stamp(Header& h, const void* payload, std::size_t n) const {
  h.checksummed = payload_checksums();
  h.payload_crc = payload_checksums() ? crc32c(0, payload, n) : 0;
}

void TcpConnection::send_control(const Header& header, std::span<const std::byte> body) {
  QS_CHECK(body.size() == wire_payload_length(header));
  if (closed_) return;
  Header h = header;
  stamp(h, body.data(), body.size());
  OutFrame f;
  f.header = encode_header(h);
  f.body.assign(body.begin(), body.end());
  // Before the first data frame that has not started (control frames such as acks must
  // not wait behind bulk data); otherwise at the end.
  auto pos = out_.begin();
  while (pos != out_.end() && !(pos->data && pos->written == 0)) ++pos;
  out_.insert(pos, std::move(f));
}

void TcpConnection::send_data(const Header& header, const std::byte* payload, std::uint64_t tag) {
  QS_CHECK(header.kind == FrameKind::kPush || header.kind == FrameKind::kPull);
  if (closed_) return;
  Header h = header;
  stamp(h, payload, h.length);  // one pass over the payload, which sendmsg reads next
  OutFrame f;
  f.header = encode_header(h);
  f.data = true;
  f.payload = payload;
  f.payload_len = h.length;
  f.tag = tag;
  out_.push_back(std::move(f));
  ++data_frames_;
  data_bytes_pending_ += kHeaderSize + h.length;
}

Status TcpConnection::flush() {
  if (closed_) return unavailable(peer() + ": connection closed");
  while (!out_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && n + 2 <= kMaxIov; ++it) {
      const OutFrame& f = *it;
      if (f.written < kHeaderSize) {
        iov[n++] = {const_cast<std::byte*>(f.header.data()) + f.written, kHeaderSize - f.written};
      }
      const std::size_t pdone = f.written > kHeaderSize ? f.written - kHeaderSize : 0;
      const std::byte* base = f.data ? f.payload : f.body.data();
      const std::size_t plen = f.data ? f.payload_len : f.body.size();
      if (plen > pdone) iov[n++] = {const_cast<std::byte*>(base) + pdone, plen - pdone};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        set_want_write(true);
        return Status::ok();
      }
      if (errno == EINTR) continue;
      Status s = errno_status("send to " + peer(), errno);
      close(s);
      return s;
    }
    bytes_written_ += static_cast<std::uint64_t>(w);
    std::size_t left = static_cast<std::size_t>(w);
    while (left > 0) {
      OutFrame& f = out_.front();
      const std::size_t take = std::min(left, f.total() - f.written);
      f.written += take;
      left -= take;
      if (f.data) data_bytes_pending_ -= take;
      if (f.written == f.total()) {
        if (f.data) {
          --data_frames_;
          completed_.push_back(f.tag);
        }
        out_.pop_front();
      }
    }
  }
  set_want_write(false);
  maybe_shutdown();
  return Status::ok();
}

std::vector<std::uint64_t> TcpConnection::take_completed() {
  std::vector<std::uint64_t> v;
  v.swap(completed_);
  return v;
}

void TcpConnection::set_want_write(bool on) {
  if (on == want_write_ || closed_) return;
  want_write_ = on;
  Status s = loop_.modify(fd_.get(), EPOLLIN | (on ? EPOLLOUT : 0u));
  if (!s.is_ok()) loop_.fail(s);
}

void TcpConnection::maybe_shutdown() {
  if (shutdown_pending_ && !shut_down_ && out_.empty() && !closed_) {
    ::shutdown(fd_.get(), SHUT_WR);
    shut_down_ = true;
  }
}

void TcpConnection::close(const Status& why, bool tell_peer, bool abort) {
  if (closed_) return;
  closed_ = true;
  if (tell_peer) {
    std::string text = why.to_string().substr(0, kMaxErrorText);
    Header h;
    h.kind = FrameKind::kError;
    h.length = static_cast<std::uint32_t>(text.size());
    stamp(h, text.data(), text.size());
    const HeaderBytes hb = encode_header(h);
    iovec iov[2] = {{const_cast<std::byte*>(hb.data()), kHeaderSize}, {text.data(), text.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    // Best effort: only when no frame is half-written (else the peer could not parse it).
    const bool at_boundary = out_.empty() || out_.front().written == 0;
    if (at_boundary) [[maybe_unused]]
      auto r = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  if (abort) {
    linger lg{1, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  if (started_) loop_.unwatch(fd_.get());
  fd_.reset();
  // Nothing more is read or written: the buffers go now, not when the owner destroys the
  // connection.
  std::vector<std::byte>().swap(rbuf_);
  std::vector<std::byte>().swap(small_);
  rpos_ = rend_ = 0;
  std::deque<OutFrame>().swap(out_);
  data_frames_ = 0;
  data_bytes_pending_ = 0;
  handler_.on_closed(*this, why);
}

Result<std::uint64_t> TcpConnection::unconfirmed_bytes() const {
  QS_ASSIGN_OR_RETURN(std::int64_t n, unacknowledged_bytes(fd_.get()));
  return static_cast<std::uint64_t>(std::max<std::int64_t>(n, 0));
}

std::optional<TcpRepairs> TcpConnection::repairs() const {
  if (closed_) return std::nullopt;
  auto r = tcp_repairs(fd_.get());
  if (!r.is_ok()) return std::nullopt;
  return *r;
}

std::string TcpConnection::congestion_control() const {
  auto cc = congestion_of(fd_.get());
  return cc.is_ok() ? *cc : std::string();
}

Result<std::unique_ptr<TcpConnection>> connect_tcp_connection(
    EventLoop& loop, const std::string& host, int port, TimeNs deadline, const Secret* secret,
    std::string_view auth_context, const SocketOptions& options, FrameHandler& handler,
    std::string peer, int index) {
  QS_ASSIGN_OR_RETURN(Fd fd, connect_tcp(host, port, deadline));
  if (secret != nullptr) {
    // Before the first frame: the acceptor proves it is the job's, and we that we are.
    QS_RETURN_IF_ERROR(authenticate(fd.get(), *secret, AuthRole::kConnector, auth_context,
                                    std::max<TimeNs>(deadline - loop.now(), kNsPerMs)));
  }
  QS_RETURN_IF_ERROR(configure_socket(fd.get(), options));
  return std::make_unique<TcpConnection>(loop, std::move(fd), handler, std::move(peer), index);
}

TcpRepairs RepairTally::take(const std::vector<const Connection*>& conns) {
  TcpRepairs now{0, 0};
  bool timeouts = true;
  for (const Connection* c : conns) {
    std::optional<TcpRepairs> r = c->repairs();
    if (!r) continue;
    now.retransmitted_segments += r->retransmitted_segments;
    if (r->timeouts < 0) timeouts = false;
    now.timeouts += std::max<std::int64_t>(r->timeouts, 0);
  }
  const TcpRepairs delta{
      std::max<std::int64_t>(0, now.retransmitted_segments - seen_.retransmitted_segments),
      timeouts ? std::max<std::int64_t>(0, now.timeouts - seen_.timeouts) : -1};
  seen_ = now;
  return delta;
}

}  // namespace qs::transport
