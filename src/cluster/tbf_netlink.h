// TbfLink: sets a tbf rate limit on one network device through route netlink
// (RTM_NEWQDISC), the message `tc qdisc add|change dev DEV root tbf ...` sends, without a
// process per change. The emulated cluster's dynamic scenarios change 2 shapers per host at
// every rate step; one `tc` process each (an `ip netns exec` fork, exec and mount
// namespace per shaper) put the last of 16 shapers tens of milliseconds behind the first
// on this loaded 2-core machine. A message on a socket opened in advance takes
// microseconds.
//
// Private to the runtime (netns.cc). Thread safety: one thread at a time per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::runtime {

// The shaper of one device: a token bucket of `burst` bytes refilled at `rate`, and a
// queue of at most `limit` bytes behind it.
struct TbfParams {
  Rate rate;
  Bytes burst = 0;
  Bytes limit = 0;
};

class TbfLink {
 public:
  // Opens a route-netlink socket in network namespace `ns` ("" = the caller's; otherwise
  // the name under /var/run/netns) and resolves `dev` there. The socket keeps that
  // namespace for its life, whichever namespace the caller is in later.
  static Result<TbfLink> open(const std::string& ns, const std::string& dev);
  TbfLink(TbfLink&& o) noexcept;
  TbfLink& operator=(TbfLink&& o) noexcept;
  TbfLink(const TbfLink&) = delete;
  TbfLink& operator=(const TbfLink&) = delete;
  ~TbfLink();

  // Installs tbf as the device's root qdisc (`create`) or changes the one installed, and
  // waits for the kernel's answer. Errors name the device and the kernel's reason.
  Status set(const TbfParams& p, bool create);
  // Packets the shaper has dropped since it was installed: its queue was full (the
  // kernel's qdisc statistics, `tc -s qdisc show`).
  Result<std::uint64_t> drops();

 private:
  // Sends one netlink message of `len` bytes to the kernel.
  Status send(const void* message, std::size_t len);
  // Receives the kernel's next datagram into buf (at most 5 s of waiting).
  Result<std::size_t> receive(void* buf, std::size_t size);
  TbfLink(int fd, int ifindex, std::string name)
      : fd_(fd), ifindex_(ifindex), name_(std::move(name)) {}
  int fd_ = -1;
  int ifindex_ = 0;
  std::string name_;  // "DEV in NS", for messages
  unsigned seq_ = 0;
};

}  // namespace qs::runtime
