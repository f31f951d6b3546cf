// The PS runtime's transport seam (docs/architecture.md, "Adding a transport"): one framed
// stream (wire.h) between a worker and a server, on an EventLoop. The worker and the
// server are written against this interface and FrameHandler; TCP (tcp_connection.h,
// src/transport/tcp/) is the implementation. Its contract, per call:
//
// Receive path. A frame is delivered in two steps: its 24-byte header, decoded and handed
// to FrameHandler::on_header, which validates it against everything the receiver knows and
// says where the payload goes; only then is any payload byte taken. A bad header or a
// handler error closes the connection with that error (the peer is told why, best effort),
// so a payload byte is never written anywhere the receiver did not approve. Payloads go:
//   kDirect  straight into receiver memory (a worker's parameter buffer);
//   kStream  in pieces to on_payload (a server sums them into its accumulation buffer);
//   kBuffer  into a small owned buffer (hello, error text), read in on_frame.
// A stream that ends inside a frame closes with an error saying how much arrived.
//
// Integrity (docs/reliability.md "Corruption"). The header's CRC32C is checked before
// anything else, the payload's as its bytes arrive and before on_frame: a frame that fails
// closes the connection with an error naming the peer, the frame and both checksums, and is
// never delivered (a kStream payload may have reached on_payload by then: act on a frame
// only in on_frame; a kDirect payload may have been written to its approved destination).
//
// Send path. Control frames (hello, ack, bye, error) carry owned bytes; a data frame
// (push, pull) carries a pointer to payload memory that must stay valid and unchanged
// until the frame is handed to the transport (take_completed; the send queue holds
// headers only: Mercury IV-C). At most one data frame is committed per connection at a
// time (data_busy), so the owner's Sender decides the order across connections. Control
// frames overtake a data frame that has not started.
//
// Delivery. unconfirmed_bytes() is what the bandwidth monitor and the "while pushing"
// measurement call busy: bytes handed to the transport whose arrival the peer has not
// confirmed. The wire timestamps (when handed bytes left this host) and the repairs are
// optional: a transport without them says so (wire_timestamps() false, repairs() empty).
//
// Not thread-safe: everything runs on the loop's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/socket.h"  // WireProgress, TcpRepairs
#include "quicksilver/transport/socket.h"
#include "quicksilver/transport/wire.h"

namespace qs::transport {

class Connection;

struct PayloadTarget {
  enum class Mode { kDirect, kStream, kBuffer };
  Mode mode = Mode::kBuffer;
  std::byte* direct = nullptr;  // kDirect: destination of payload byte 0

  static PayloadTarget buffer() { return {}; }
  static PayloadTarget stream() { return {Mode::kStream, nullptr}; }
  static PayloadTarget to(std::byte* p) { return {Mode::kDirect, p}; }
};

// The owner's side of a connection. Every callback runs on the loop thread; any of them may
// send on or close the connection.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A decoded header. Return where its payload goes, or an error to close the connection
  // before any payload byte is read.
  virtual Result<PayloadTarget> on_header(Connection& c, const Header& h) = 0;
  // A piece [at, at + n) of a kStream payload. An error closes the connection.
  virtual Status on_payload(Connection& c, const Header& h, std::uint64_t at, const std::byte* data,
                            std::size_t n) {
    (void)c, (void)h, (void)at, (void)data, (void)n;
    return internal_error("unexpected streamed payload");
  }
  // The whole frame arrived. An error closes the connection.
  virtual Status on_frame(Connection& c, const Header& h) = 0;
  // The socket accepted more bytes (a data frame may have completed).
  virtual void on_writable(Connection& c) { (void)c; }
  // The connection closed: `why` says how (kUnavailable for a peer that went away,
  // kProtocolError for a bad frame, ...). Called exactly once.
  virtual void on_closed(Connection& c, const Status& why) = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts reading. Precondition: not started.
  virtual Status start() = 0;
  // The owner's number for the peer, and its name in messages ("server 1 (127.0.0.1:4000)").
  int index() const { return index_; }
  // Renumbers the connection (a server learns a worker's id from its hello).
  void set_index(int index) { index_ = index; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  const std::string& peer() const { return peer_; }
  virtual bool closed() const = 0;

  // ---- integrity ----
  // On (the default): every frame sent carries its payload's CRC32C, and every frame
  // received with a payload must carry one (a peer without is refused, naming the
  // setting). Off: frames go without (the header keeps its own checksum); frames that do
  // carry one are still checked. Set before the first frame.
  void set_payload_checksums(bool on) { checksums_ = on; }
  bool payload_checksums() const { return checksums_; }

  // ---- send ----
  // Queues a control frame; `body` is copied (its size must equal wire_payload_length(h)).
  virtual void send_control(const Header& h, std::span<const std::byte> body = {}) = 0;
  // True while the transport refuses more and data frames wait in this connection: the
  // sender must not commit more to it (the head of its queue waits).
  virtual bool data_busy() const = 0;
  // Data frames queued or partly written, and their bytes not yet handed over.
  virtual std::size_t data_frames() const = 0;
  virtual std::uint64_t data_bytes_pending() const = 0;
  // Queues a data frame (several may be queued: flush() writes them together).
  // Precondition: payload valid for h.length bytes until the frame completes.
  virtual void send_data(const Header& h, const std::byte* payload, std::uint64_t tag) = 0;
  // Hands over what the transport accepts now. Errors: the transport failed (the
  // connection is then closed and on_closed has run).
  virtual Status flush() = 0;
  // Tags of data frames fully handed over since the last call.
  virtual std::vector<std::uint64_t> take_completed() = 0;
  // Nothing queued.
  virtual bool output_idle() const = 0;
  virtual std::uint64_t bytes_written() const = 0;
  virtual std::uint64_t bytes_read() const = 0;

  // ---- delivery ----
  // Bytes handed over whose arrival the peer has not confirmed yet (TCP: unsent plus
  // unacknowledged). Errors: the transport cannot tell now.
  virtual Result<std::uint64_t> unconfirmed_bytes() const = 0;
  // Optional: when written bytes left this host. Asks for them (precondition: nothing
  // written yet); errors: not offered.
  virtual Status enable_wire_timestamps() = 0;
  virtual bool wire_timestamps() const = 0;
  // Reads the timestamps so far; a failure closes the connection.
  virtual void poll_wire() = 0;
  // Of bytes_written(), how many had left the host at the newest timestamp, and when.
  virtual const WireProgress& wire() const = 0;
  // Optional: what the transport repaired so far (cumulative; TCP: retransmissions and
  // timeouts); empty when it has no such notion.
  virtual std::optional<TcpRepairs> repairs() const { return std::nullopt; }
  // Optional: the congestion control the transport runs ("cubic"); empty when none.
  virtual std::string congestion_control() const { return ""; }

  // The kBuffer payload of the frame being delivered to on_frame.
  virtual std::span<const std::byte> small_payload() const = 0;

  // ---- memory ----
  // The receive buffer's size, allocated at the first read after the previous one is
  // drained: a server gives a peer that has not said hello a small one (what strangers can
  // make it hold is bounded), and the full size once it is known.
  virtual void set_read_buffer_size(std::size_t bytes) = 0;
  static constexpr std::size_t kDefaultReadBuffer = 256 * 1024;
  // Heap bytes the connection holds for receiving; 0 after close(), which frees them.
  virtual std::size_t buffer_bytes() const = 0;

  // Closes now (no further callbacks except on_closed(why), which runs once). With
  // `tell_peer`, first tries once to send an `error` frame carrying the message. `abort`
  // ends the stream abruptly (TCP: RST) instead of an orderly end.
  virtual void close(const Status& why, bool tell_peer = false, bool abort = false) = 0;
  // Orderly end: ends the write side once output is flushed.
  virtual void shutdown_when_flushed() = 0;

 protected:
  Connection(std::string peer, int index) : peer_(std::move(peer)), index_(index) {}

 private:
  std::string peer_;
  int index_;
  bool checksums_ = true;
};

}  // namespace qs::transport
