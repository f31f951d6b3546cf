#include "tbf_netlink.h"

#include "quicksilver/core/check.h"
#include "quicksilver/runtime/netns.h"

#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>

namespace qs::runtime {
namespace {

// A request: header, tcmsg and room for the attributes.
struct Request {
  nlmsghdr n;
  tcmsg t;
  char attrs[256];
};

// Appends attribute `type` with `len` bytes of `data` (none when data is null).
rtattr* add_attr(Request& r, unsigned short type, const void* data, std::size_t len) {
  const std::size_t at = NLMSG_ALIGN(r.n.nlmsg_len);
  QS_CHECK(at + RTA_SPACE(len) <= sizeof(Request));
  auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&r) + at);
  a->rta_type = type;
  a->rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
  if (len) std::memcpy(RTA_DATA(a), data, len);
  r.n.nlmsg_len = static_cast<std::uint32_t>(at + RTA_ALIGN(a->rta_len));
  return a;
}

// The socket and ifindex, made in the caller's namespace.
Status open_here(const std::string& dev, int* fd, int* ifindex) {
  *fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (*fd < 0) return io_error(std::string("netlink socket: ") + std::strerror(errno));
  sockaddr_nl local{};
  local.nl_family = AF_NETLINK;
  if (bind(*fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    const int e = errno;
    close(*fd);
    *fd = -1;
    return io_error(std::string("netlink bind: ") + std::strerror(e));
  }
  *ifindex = static_cast<int>(if_nametoindex(dev.c_str()));
  if (*ifindex == 0) {
    const int e = errno;
    close(*fd);
    *fd = -1;
    return not_found("no network device '" + dev + "': " + std::strerror(e));
  }
  return Status::ok();
}

}  // namespace

Result<TbfLink> TbfLink::open(const std::string& ns, const std::string& dev) {
  int fd = -1, ifindex = 0;
  Status s;
  if (ns.empty()) {
    s = open_here(dev, &fd, &ifindex);
  } else {
    // setns() moves only the calling thread: a short-lived thread enters the namespace,
    // and the socket it makes stays bound there.
    std::thread t([&] {
      s = NetnsCluster::enter(ns);
      if (s.is_ok()) s = open_here(dev, &fd, &ifindex);
    });
    t.join();
  }
  const std::string name = dev + (ns.empty() ? "" : " in " + ns);
  if (!s.is_ok()) return s.with_context("tbf on " + name);
  return TbfLink(fd, ifindex, name);
}

TbfLink::TbfLink(TbfLink&& o) noexcept
    : fd_(o.fd_), ifindex_(o.ifindex_), name_(std::move(o.name_)), seq_(o.seq_) {
  o.fd_ = -1;
}

TbfLink& TbfLink::operator=(TbfLink&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    ifindex_ = o.ifindex_;
    name_ = std::move(o.name_);
    seq_ = o.seq_;
    o.fd_ = -1;
  }
  return *this;
}

TbfLink::~TbfLink() {
  if (fd_ >= 0) close(fd_);
}

Status TbfLink::set(const TbfParams& p, bool create) {
  const std::uint64_t bytes_per_s = static_cast<std::uint64_t>(p.rate.bits_per_second) / 8;
  if (bytes_per_s == 0 || p.burst <= 0 || p.limit <= 0 ||
      p.burst > std::numeric_limits<std::uint32_t>::max() || p.limit > std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument("tbf on " + name_ + ": rate, burst and limit must be positive (burst and limit < 4 GiB)");
  }
  Request r{};
  r.n.nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
  r.n.nlmsg_type = RTM_NEWQDISC;
  r.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (create ? NLM_F_CREATE | NLM_F_EXCL : 0);
  r.n.nlmsg_seq = ++seq_;
  r.t.tcm_family = AF_UNSPEC;
  r.t.tcm_ifindex = ifindex_;
  r.t.tcm_parent = TC_H_ROOT;
  add_attr(r, TCA_KIND, "tbf", 4);
  rtattr* options = add_attr(r, TCA_OPTIONS, nullptr, 0);
  tc_tbf_qopt q{};
  // Rates of 2^32 bytes/s and more travel in TCA_TBF_RATE64 (as tc sends them). With an
  // Ethernet link layer the kernel needs no rate table.
  q.rate.rate = static_cast<std::uint32_t>(std::min<std::uint64_t>(bytes_per_s, std::numeric_limits<std::uint32_t>::max()));
  q.rate.linklayer = TC_LINKLAYER_ETHERNET;
  q.limit = static_cast<std::uint32_t>(p.limit);
  // The bucket in psched ticks (64 ns); TCA_TBF_BURST, in bytes, takes precedence.
  q.buffer = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(p.burst) * 1'000'000'000ULL / bytes_per_s / 64, std::numeric_limits<std::uint32_t>::max()));
  add_attr(r, TCA_TBF_PARMS, &q, sizeof q);
  if (bytes_per_s >= (1ULL << 32)) add_attr(r, TCA_TBF_RATE64, &bytes_per_s, sizeof bytes_per_s);
  const std::uint32_t burst = static_cast<std::uint32_t>(p.burst);
  add_attr(r, TCA_TBF_BURST, &burst, sizeof burst);
  options->rta_len = static_cast<unsigned short>(r.n.nlmsg_len - (reinterpret_cast<char*>(options) - reinterpret_cast<char*>(&r)));

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = sendto(fd_, &r, r.n.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(r.n.nlmsg_len)) {
    return io_error("tbf on " + name_ + ": netlink send: " + std::strerror(errno));
  }
  // The answer: an NLMSG_ERROR carrying 0 (success) or -errno, for our sequence number.
  alignas(nlmsghdr) char buf[8192];
  while (true) {
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("tbf on " + name_ + ": netlink receive: " + std::strerror(errno));
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != seq_ || h->nlmsg_type != NLMSG_ERROR) continue;
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      if (e->error == 0) return Status::ok();
      return io_error("tbf on " + name_ + ": the kernel refused " + (create ? "adding" : "changing") +
                      " the qdisc: " + std::strerror(-e->error));
    }
  }
}

}  // namespace qs::runtime
