// The accepting side of the PS runtime's transport (connection.h): strangers are bounded
// (docs/reliability.md, "Bounds"). A peer is pending from accept until its owner admits it
// on its first frame (a worker's hello): first the transport's authentication (with a
// secret), then a started Connection that delivers that frame. A pending peer is closed
// when AcceptLimits::handshake_timeout passes, or when max_pending others arrived after it
// (the oldest goes). TCP implements it (tcp_connection.h: make_tcp_acceptor).
#pragma once

#include <cstdint>
#include <memory>

#include "quicksilver/core/status.h"
#include "quicksilver/transport/connection.h"

namespace qs::transport {

class Acceptor {
 public:
  struct Counters {
    std::int64_t accepted = 0, refused = 0, accept_failures = 0;
    int pending = 0;  // waiting to authenticate or to be admitted
    int held = 0;     // pending, and refused ones not yet freed
  };
  // Pending connections are numbered from here (their index until admitted).
  static constexpr int kPendingBase = 1 << 20;
  static bool is_pending(const Connection& c) { return c.index() >= kPendingBase; }

  virtual ~Acceptor() = default;
  virtual int port() const = 0;
  // Starts accepting on the loop; pending connections deliver to `handler`, which routes
  // a pending one's frames and closure here (admit, closed).
  virtual Status start(FrameHandler& handler) = 0;
  // The handler accepts pending `c` (from its on_frame): the caller's from now on; it
  // renumbers and renames it, and gives it its full read buffer.
  virtual std::unique_ptr<Connection> admit(Connection& c) = 0;
  // A pending connection closed (the handler's on_closed): counted as refused, logged,
  // freed once the current callback returned.
  virtual void closed(Connection& c, const Status& why) = 0;
  // Stops accepting and closes every pending connection.
  virtual void stop() = 0;
  // Loop thread.
  virtual Counters counters() const = 0;
};

}  // namespace qs::transport
