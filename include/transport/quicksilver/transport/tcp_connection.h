// TCP as the PS runtime's transport (connection.h has the contract): one framed stream
// over a non-blocking socket. Frames go out with sendmsg (header + payload iovecs, no
// copy) and partial writes resume where they stopped; large kDirect payloads are recv()'d
// in place, small ones copied from the read buffer. Delivery is TCP's acknowledgement
// (SIOCOUTQ), wire timestamps are SO_TIMESTAMPING's, repairs TCP_INFO's.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/transport/acceptor.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/socket.h"

namespace qs::transport {

class TcpConnection final : public Connection {
 public:
  // `peer` names the other side in messages; `index` is the owner's number for it. The
  // socket must already be configured (non-blocking).
  TcpConnection(EventLoop& loop, Fd fd, FrameHandler& handler, std::string peer, int index);
  ~TcpConnection() override;

  Status start() override;
  int fd() const { return fd_.get(); }
  bool closed() const override { return closed_; }

  void send_control(const Header& h, std::span<const std::byte> body = {}) override;
  bool data_busy() const override { return data_frames_ > 0 && want_write_; }
  std::size_t data_frames() const override { return data_frames_; }
  std::uint64_t data_bytes_pending() const override { return data_bytes_pending_; }
  void send_data(const Header& h, const std::byte* payload, std::uint64_t tag) override;
  Status flush() override;
  std::vector<std::uint64_t> take_completed() override;
  bool output_idle() const override { return out_.empty(); }
  std::uint64_t bytes_written() const override { return bytes_written_; }
  std::uint64_t bytes_read() const override { return bytes_read_; }

  Result<std::uint64_t> unconfirmed_bytes() const override;
  Status enable_wire_timestamps() override;
  bool wire_timestamps() const override { return wire_enabled_; }
  void poll_wire() override;
  const WireProgress& wire() const override { return wire_; }
  std::optional<TcpRepairs> repairs() const override;
  std::string congestion_control() const override;

  std::span<const std::byte> small_payload() const override { return small_; }
  void set_read_buffer_size(std::size_t bytes) override {
    read_buffer_size_ = bytes > 0 ? bytes : 1;
  }
  std::size_t buffer_bytes() const override { return rbuf_.capacity() + small_.capacity(); }
  void close(const Status& why, bool tell_peer = false, bool abort = false) override;
  void shutdown_when_flushed() override {
    shutdown_pending_ = true;
    maybe_shutdown();
  }

 private:
  struct OutFrame {
    HeaderBytes header{};
    std::vector<std::byte> body;         // control frames
    const std::byte* payload = nullptr;  // data frames
    std::size_t payload_len = 0;
    std::size_t written = 0;
    bool data = false;
    std::uint64_t tag = 0;
    std::size_t total() const { return kHeaderSize + (data ? payload_len : body.size()); }
  };

  void on_events(std::uint32_t events);
  Status read_some();
  Status deliver(const std::byte* p, std::size_t n);
  Status end_of_frame();
  // Stamps h with the CRC32C of its payload when checksums are on.
  void stamp(Header& h, const void* payload, std::size_t n) const;
  void set_want_write(bool on);
  void maybe_shutdown();

  EventLoop& loop_;
  Fd fd_;
  FrameHandler& handler_;
  bool started_ = false;
  bool closed_ = false;
  bool want_write_ = false;
  bool shutdown_pending_ = false;
  bool shut_down_ = false;

  // Receive state.
  std::vector<std::byte> rbuf_;  // empty until the first read; freed on close
  std::size_t read_buffer_size_ = kDefaultReadBuffer;
  std::size_t rpos_ = 0, rend_ = 0;  // unread bytes are rbuf_[rpos_, rend_)
  HeaderBytes hbuf_{};
  std::size_t hhave_ = 0;
  bool in_payload_ = false;
  Header cur_{};
  PayloadTarget target_{};
  std::uint64_t got_ = 0, want_ = 0;
  std::uint32_t payload_crc_ = 0;  // CRC32C of the current payload's bytes so far
  std::vector<std::byte> small_;
  std::uint64_t bytes_read_ = 0;
  bool wire_enabled_ = false;
  WireProgress wire_;

  // Send state.
  std::deque<OutFrame> out_;              // at most one data frame
  std::size_t data_frames_ = 0;           // data frames in out_
  std::uint64_t data_bytes_pending_ = 0;  // their bytes not yet written
  std::vector<std::uint64_t> completed_;
  std::uint64_t bytes_written_ = 0;
};

// The worker's side of the transport: a TCP connection to `host:port` (retried until
// `deadline`), authenticated with `secret` when one is given (auth.h; `auth_context` names
// the protocol), configured with `options`, not started.
Result<std::unique_ptr<TcpConnection>> connect_tcp_connection(
    EventLoop& loop, const std::string& host, int port, TimeNs deadline, const Secret* secret,
    std::string_view auth_context, const SocketOptions& options, FrameHandler& handler,
    std::string peer, int index);

// What a node's connections repaired since the last take(): the totals of their repairs()
// (connections without are skipped) minus those seen last time, never negative; timeouts
// -1 when some connection does not count them. The first take() sets the baseline.
class RepairTally {
 public:
  TcpRepairs take(const std::vector<const Connection*>& conns);

 private:
  TcpRepairs seen_{0, 0};
};

// How a TCP acceptor treats strangers.
struct TcpAcceptSettings {
  const Secret* secret = nullptr;  // authenticate every peer first (auth.h); null: none
  std::string auth_context;        // names the protocol in the authentication
  SocketOptions socket;            // applied to every accepted socket
  bool payload_checksums = true;   // Connection::set_payload_checksums
  AcceptLimits limits;
  // A pending connection's read buffer: its first frame, no more (kDefaultReadBuffer once
  // admitted).
  std::size_t first_frame_bytes = Connection::kDefaultReadBuffer;
  std::string owner;  // "server 0": in log lines and peer names
  std::string first;  // what a peer must do before it is admitted ("say hello")
  std::function<void(const std::string&)> log;  // refusals and pauses; null: none
  std::function<void()> on_change;              // the counters changed; null: none
};

// Listens on host:port (0: any) on `loop`.
Result<std::unique_ptr<Acceptor>> make_tcp_acceptor(EventLoop& loop, const std::string& host,
                                                    int port, TcpAcceptSettings settings);

}  // namespace qs::transport
