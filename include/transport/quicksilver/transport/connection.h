// Connection: one framed TCP stream (wire.h) on an EventLoop.
//
// Receive path. A frame is read in two steps: its 24 header bytes, then its payload. The
// header is decoded (decode_header) and handed to FrameHandler::on_header, which validates
// it against everything the receiver knows and says where the payload goes; only then is
// any payload byte read. A bad header or a handler error closes the connection with that
// error (a best-effort `error` frame tells the peer why), so a payload byte is never
// written anywhere the receiver did not approve. Payloads go:
//   kDirect  straight into receiver memory (a worker's parameter buffer): large payloads
//            are recv()'d in place, small ones copied from the read buffer;
//   kStream  in pieces to on_payload (a server sums them into its accumulation buffer);
//   kBuffer  into a small owned buffer (hello, error text), read in on_frame.
// A stream that ends inside a frame closes with an error saying how much of what arrived.
//
// Integrity (wire.h; docs/reliability.md "Corruption"). decode_header checks the header's
// CRC32C before anything else. The payload's CRC32C is computed as its bytes arrive and
// checked before on_frame: a frame that fails closes the connection with an error naming
// the peer, the frame and both checksums, and is never delivered (a kStream payload may
// have reached on_payload by then: the owner must act on a frame only in on_frame, as the
// server does; a kDirect payload may have been written to its approved destination).
//
// Send path. Control frames (hello, ack, bye, error) carry owned bytes; a data frame
// (push, pull) carries a pointer to payload memory that must stay valid and unchanged
// until the frame is written (the send queue holds headers only: Mercury IV-C). Frames go
// out with sendmsg (header + payload iovecs, no copy), partial writes resume where they
// stopped, and at most one data frame is queued at a time, so the owner's Sender decides
// the order across connections. Control frames overtake a data frame that has not started.
//
// Not thread-safe: everything runs on the loop's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/transport/event_loop.h"
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
  // `peer` names the other side in messages ("server 1 (127.0.0.1:4000)"); `index` is the
  // owner's number for it. The socket must already be configured (non-blocking).
  Connection(EventLoop& loop, Fd fd, FrameHandler& handler, std::string peer, int index);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts reading. Precondition: not started.
  Status start();
  int index() const { return index_; }
  // Renumbers the connection (a server learns a worker's id from its hello).
  void set_index(int index) { index_ = index; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  bool closed() const { return closed_; }

  // ---- integrity ----
  // On (the default): every frame sent carries its payload's CRC32C, and every frame
  // received with a payload must carry one (a peer without is refused, naming the
  // setting). Off: frames go without (the header keeps its own checksum); frames that do
  // carry one are still checked. Set before the first frame.
  void set_payload_checksums(bool on) { checksums_ = on; }
  bool payload_checksums() const { return checksums_; }

  // ---- send ----
  // Queues a control frame; `body` is copied (its size must equal wire_payload_length(h)).
  void send_control(const Header& h, std::span<const std::byte> body = {});
  // True while the kernel refuses more and data frames wait in this connection: the
  // sender must not commit more to it (the head of its queue waits).
  bool data_busy() const { return data_frames_ > 0 && want_write_; }
  // Data frames queued or partly written, and their bytes not yet handed to the kernel.
  std::size_t data_frames() const { return data_frames_; }
  std::uint64_t data_bytes_pending() const { return data_bytes_pending_; }
  // Queues a data frame (several may be queued: flush() writes them with one sendmsg).
  // Precondition: payload valid for h.length bytes until the frame completes.
  void send_data(const Header& h, const std::byte* payload, std::uint64_t tag);
  // Writes what the socket accepts now. Errors: the socket failed (the connection is then
  // closed and on_closed has run).
  Status flush();
  // Tags of data frames fully handed to the kernel since the last call.
  std::vector<std::uint64_t> take_completed();
  // Nothing queued.
  bool output_idle() const { return out_.empty(); }
  std::uint64_t bytes_written() const { return bytes_written_; }
  std::uint64_t bytes_read() const { return bytes_read_; }

  // ---- when written bytes left the host (transmit timestamps; socket.h) ----
  // Asks the kernel for them. Precondition: nothing written yet. Errors: the kernel refused.
  Status enable_wire_timestamps();
  bool wire_timestamps() const { return wire_enabled_; }
  // Reads the timestamps queued so far (the event loop also does, when the kernel signals
  // them); a failure closes the connection.
  void poll_wire();
  // Of bytes_written(), how many had left the host at the newest timestamp, and when.
  const WireProgress& wire() const { return wire_; }

  // The kBuffer payload of the frame being delivered to on_frame.
  std::span<const std::byte> small_payload() const { return small_; }

  // ---- memory ----
  // The read buffer's size (default kDefaultReadBuffer), allocated at the first read after
  // the previous one is drained: a server gives a peer that has not said hello a small one
  // (what strangers can make it hold is bounded), and the full size once it is known.
  void set_read_buffer_size(std::size_t bytes) { read_buffer_size_ = bytes > 0 ? bytes : 1; }
  static constexpr std::size_t kDefaultReadBuffer = 256 * 1024;
  // Heap bytes the connection holds for receiving (read buffer, small payload); 0 after
  // close(), which frees them.
  std::size_t buffer_bytes() const { return rbuf_.capacity() + small_.capacity(); }

  // Closes now (no further callbacks except on_closed(why), which runs once). With
  // `tell_peer`, first tries one non-blocking send of an `error` frame carrying the message.
  // `abort` resets the connection (RST) instead of an orderly FIN.
  void close(const Status& why, bool tell_peer = false, bool abort = false);
  // Orderly end: shuts the write side down once output is flushed.
  void shutdown_when_flushed() {
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
  std::string peer_;
  int index_;
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
  bool checksums_ = true;
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

}  // namespace qs::transport
