#include "tbf_netlink.h"

#include <linux/gen_stats.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>

#include "quicksilver/core/check.h"
#include "quicksilver/runtime/netns.h"

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
  // The kernel answers at once; a lost answer must not hang the launcher.
  const timeval answer_within{5, 0};
  if (setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &answer_within, sizeof answer_within) != 0) {
    const int e = errno;
    close(*fd);
    *fd = -1;
    return io_error(std::string("netlink SO_RCVTIMEO: ") + std::strerror(e));
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
      p.burst > std::numeric_limits<std::uint32_t>::max() ||
      p.limit > std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument("tbf on " + name_ +
                            ": rate, burst and limit must be positive (burst and limit < 4 GiB)");
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
  q.rate.rate = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(bytes_per_s, std::numeric_limits<std::uint32_t>::max()));
  q.rate.linklayer = TC_LINKLAYER_ETHERNET;
  q.limit = static_cast<std::uint32_t>(p.limit);
  // The bucket in psched ticks (64 ns); TCA_TBF_BURST, in bytes, takes precedence.
  q.buffer = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(p.burst) * 1'000'000'000ULL / bytes_per_s / 64,
      std::numeric_limits<std::uint32_t>::max()));
  add_attr(r, TCA_TBF_PARMS, &q, sizeof q);
  if (bytes_per_s >= (1ULL << 32)) add_attr(r, TCA_TBF_RATE64, &bytes_per_s, sizeof bytes_per_s);
  const std::uint32_t burst = static_cast<std::uint32_t>(p.burst);
  add_attr(r, TCA_TBF_BURST, &burst, sizeof burst);
  options->rta_len = static_cast<unsigned short>(
      r.n.nlmsg_len - (reinterpret_cast<char*>(options) - reinterpret_cast<char*>(&r)));

  QS_RETURN_IF_ERROR(send(&r, r.n.nlmsg_len));
  // The answer: an NLMSG_ERROR carrying 0 (success) or -errno, for our sequence number.
  alignas(nlmsghdr) char buf[8192];
  while (true) {
    QS_ASSIGN_OR_RETURN(const std::size_t got, receive(buf, sizeof buf));
    auto n = static_cast<ssize_t>(got);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n));
         h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != seq_ || h->nlmsg_type != NLMSG_ERROR) continue;
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      if (e->error == 0) return Status::ok();
      return io_error("tbf on " + name_ + ": the kernel refused " +
                      (create ? "adding" : "changing") + " the qdisc: " + std::strerror(-e->error));
    }
  }
}

Status TbfLink::send(const void* message, std::size_t len) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = sendto(fd_, message, len, 0, reinterpret_cast<const sockaddr*>(&kernel), sizeof kernel);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(len)) {
    return io_error("tbf on " + name_ + ": netlink send: " + std::strerror(errno));
  }
  return Status::ok();
}

Result<std::size_t> TbfLink::receive(void* buf, std::size_t size) {
  while (true) {
    const ssize_t n = recv(fd_, buf, size, 0);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    return io_error(
        "tbf on " + name_ + ": netlink receive: " +
        (errno == EAGAIN ? std::string("no answer from the kernel in 5 s") : std::strerror(errno)));
  }
}

Result<std::uint64_t> TbfLink::drops() {
  // RTM_GETQDISC for the root qdisc answers with one RTM_NEWQDISC carrying its statistics:
  // TCA_STATS2, nesting TCA_STATS_QUEUE (struct gnet_stats_queue). Without NLM_F_ECHO the
  // kernel sends that answer to the RTNLGRP_TC group only, not to the asker.
  Request r{};
  r.n.nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
  r.n.nlmsg_type = RTM_GETQDISC;
  r.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_ECHO;
  r.n.nlmsg_seq = ++seq_;
  r.t.tcm_family = AF_UNSPEC;
  r.t.tcm_ifindex = ifindex_;
  r.t.tcm_parent = TC_H_ROOT;
  QS_RETURN_IF_ERROR(send(&r, r.n.nlmsg_len));
  alignas(nlmsghdr) char buf[16384];
  while (true) {
    QS_ASSIGN_OR_RETURN(const std::size_t got, receive(buf, sizeof buf));
    auto n = static_cast<ssize_t>(got);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n));
         h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != seq_) continue;
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        return io_error("tbf on " + name_ + ": the kernel did not give the qdisc's statistics: " +
                        std::strerror(-e->error));
      }
      if (h->nlmsg_type != RTM_NEWQDISC) continue;
      auto* t = static_cast<tcmsg*>(NLMSG_DATA(h));
      int len = static_cast<int>(h->nlmsg_len) - static_cast<int>(NLMSG_LENGTH(sizeof(tcmsg)));
      for (auto* a =
               reinterpret_cast<rtattr*>(reinterpret_cast<char*>(t) + NLMSG_ALIGN(sizeof(tcmsg)));
           RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type != TCA_STATS2) continue;
        int inner = static_cast<int>(RTA_PAYLOAD(a));
        for (auto* s = static_cast<rtattr*>(RTA_DATA(a)); RTA_OK(s, inner);
             s = RTA_NEXT(s, inner)) {
          if (s->rta_type != TCA_STATS_QUEUE || RTA_PAYLOAD(s) < sizeof(gnet_stats_queue)) continue;
          gnet_stats_queue q;
          std::memcpy(&q, RTA_DATA(s), sizeof q);
          return static_cast<std::uint64_t>(q.drops);
        }
      }
      return internal_error("tbf on " + name_ + ": the kernel's answer holds no queue statistics");
    }
  }
}

}  // namespace qs::runtime
