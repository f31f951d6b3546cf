// TCP sockets for the runtime: an owning file descriptor, the socket options Quicksilver
// relies on, listening, and connecting with retries until a deadline. Every system-call
// failure becomes a Status naming the call, the peer and errno's text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::transport {

// An owning file descriptor (move-only; closes on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Options applied to every data connection (DESIGN.md "Transport and runtime": preemption is
// only as fine as the bytes already committed to the kernel).
struct SocketOptions {
  // TCP congestion control set with TCP_CONGESTION. MACHINE-NOTES: the machine default
  // (bbr) is 2-4x slower than cubic on loopback and veth. Empty = leave the system default.
  std::string congestion = "cubic";
  // TCP_NOTSENT_LOWAT: the socket reports writable only while fewer unsent bytes than this
  // sit in the kernel, so an urgent packet waits behind at most about this much. 0 = unset.
  Bytes notsent_lowat = 128 * kKiB;
  // SO_SNDBUF (the kernel doubles it). Bounded so the kernel queue stays short; 0 = autotune.
  Bytes send_buffer = 4 * kMiB;
  // SO_RCVBUF; 0 = autotune.
  Bytes receive_buffer = 0;
  // SO_MAX_PACING_RATE in bytes/s (TCP paces itself without fq); 0 = unpaced.
  std::int64_t max_pacing_rate = 0;
};

// Sets TCP_NODELAY, non-blocking mode and `opts` on a connected socket. Errors name the
// option; a refused congestion control says where the allowed list is.
Status configure_socket(int fd, const SocketOptions& opts);
// Whether this kernel has congestion control `name`
// (/proc/sys/net/ipv4/tcp_available_congestion_control; ok when that cannot be read).
Status check_congestion_available(const std::string& name);
// The congestion control algorithm in effect on `fd` (getsockopt TCP_CONGESTION).
Result<std::string> congestion_of(int fd);
// Bytes written to `fd` that its peer's TCP has not yet acknowledged (ioctl SIOCOUTQ:
// unsent plus in flight).
Result<std::int64_t> unacknowledged_bytes(int fd);

// What a connection's TCP has had to repair so far (TCP_INFO): segments retransmitted
// (tcpi_total_retrans), and retransmission timeouts (tcpi_total_rto, Linux 6.7 and later;
// -1 on an older kernel). Both only grow; take differences.
struct TcpRepairs {
  std::int64_t retransmitted_segments = 0;
  std::int64_t timeouts = -1;
};
Result<TcpRepairs> tcp_repairs(int fd);

// Transmit timestamps: when written bytes left this host (the driver's software timestamp,
// taken after the qdisc, so after any tc shaper's queue), as the simulator's "on the wire".
// enable_tx_timestamps asks for one (SO_TIMESTAMPING: TX_SOFTWARE, OPT_ID, OPT_TSONLY) for
// the last byte of every write; call it on a connected socket before the first write, so
// that its byte count starts with the connection's. Errors name the option.
Status enable_tx_timestamps(int fd);
struct WireProgress {
  std::uint64_t bytes = 0;  // bytes written since enable_tx_timestamps() that left the host
  TimeNs at = -1;           // when the last of them left (CLOCK_MONOTONIC ns); -1 = none yet
};
// Reads every transmit timestamp queued on `fd`'s error queue (non-blocking) into
// `progress` (the newest wins; retransmissions report a byte again, no harm). An error
// only when reading the queue fails.
Status drain_tx_timestamps(int fd, WireProgress* progress);

// A listening TCP socket on host:port (port 0 = ephemeral), SO_REUSEADDR, non-blocking.
Result<Fd> listen_tcp(const std::string& host, int port, int backlog = 128);
// The local port a socket is bound to.
Result<int> local_port(int fd);
// Connects to host:port, retrying refused or unreachable attempts every `retry_every`
// until `deadline` (a Clock time in ns on the steady clock). The socket is returned
// blocking; call configure_socket() next.
Result<Fd> connect_tcp(const std::string& host, int port, TimeNs deadline,
                       TimeNs retry_every = 20 * kNsPerMs);
// Accepts one pending connection on a non-blocking listener; an empty Fd if none. `peer`,
// when given, receives the peer's "address:port". Errors: kUnavailable when the process or
// the system is out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM: the caller
// should pause accepting and retry, not fail; AcceptLimits::backoff), kIoError otherwise.
Result<Fd> accept_tcp(int listen_fd, std::string* peer = nullptr);

// What a listening node lets strangers hold (docs/reliability.md, "Bounds"). A connection
// is "pending" from accept until it has authenticated and said who it is (a worker's
// hello, a rendezvous request).
struct AcceptLimits {
  // A pending connection is closed this long after accept (a peer that never speaks holds
  // no descriptor for longer).
  TimeNs handshake_timeout = 5 * kNsPerSec;
  // At most this many pending connections: when one more arrives, the oldest is closed.
  // Twice the largest job's workers, so a whole job connecting at once always fits.
  int max_pending = 128;
  // After accept fails for lack of descriptors or memory, listening pauses this long (the
  // node goes on; the peer waits in the kernel's backlog or retries).
  TimeNs backoff = 100 * kNsPerMs;
};

// "call: strerror(errno)" as an io_error (kIoError) or, for connection loss
// (EPIPE/ECONNRESET/ETIMEDOUT), unavailable (kUnavailable).
Status errno_status(const std::string& what, int err);

}  // namespace qs::transport
