#include "quicksilver/transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "quicksilver/transport/clock.h"

namespace qs::transport {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status errno_status(const std::string& what, int err) {
  std::string msg = what + ": " + std::strerror(err);
  if (err == EPIPE || err == ECONNRESET || err == ETIMEDOUT || err == ECONNREFUSED) {
    return unavailable(msg);
  }
  return io_error(msg);
}

namespace {

Status set_int(int fd, int level, int opt, int value, const char* name) {
  if (::setsockopt(fd, level, opt, &value, sizeof value) != 0) {
    return errno_status(std::string("setsockopt(") + name + "=" + std::to_string(value) + ")",
                        errno);
  }
  return Status::ok();
}

Result<sockaddr_in> resolve(const std::string& host, int port) {
  if (port < 0 || port > 65535)
    return invalid_argument("port " + std::to_string(port) + " out of range");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_argument("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

}  // namespace

Status configure_socket(int fd, const SocketOptions& o) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return errno_status("fcntl(O_NONBLOCK)", errno);
  }
  QS_RETURN_IF_ERROR(set_int(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
  if (!o.congestion.empty()) {
    if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o.congestion.data(),
                     static_cast<socklen_t>(o.congestion.size())) != 0) {
      const int err = errno;
      return errno_status("setsockopt(TCP_CONGESTION='" + o.congestion +
                              "') (available: /proc/sys/net/ipv4/tcp_available_congestion_control;"
                              " unprivileged or namespaced: tcp_allowed_congestion_control)",
                          err);
    }
  }
  if (o.notsent_lowat > 0) {
    QS_RETURN_IF_ERROR(set_int(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT,
                               static_cast<int>(o.notsent_lowat), "TCP_NOTSENT_LOWAT"));
  }
  if (o.send_buffer > 0) {
    QS_RETURN_IF_ERROR(
        set_int(fd, SOL_SOCKET, SO_SNDBUF, static_cast<int>(o.send_buffer), "SO_SNDBUF"));
  }
  if (o.receive_buffer > 0) {
    QS_RETURN_IF_ERROR(
        set_int(fd, SOL_SOCKET, SO_RCVBUF, static_cast<int>(o.receive_buffer), "SO_RCVBUF"));
  }
  if (o.max_pacing_rate > 0) {
    const std::uint64_t rate = static_cast<std::uint64_t>(o.max_pacing_rate);
    if (::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof rate) != 0) {
      return errno_status("setsockopt(SO_MAX_PACING_RATE)", errno);
    }
  }
  return Status::ok();
}

Result<std::string> congestion_of(int fd) {
  char buf[32] = {};
  socklen_t len = sizeof buf;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, buf, &len) != 0) {
    return errno_status("getsockopt(TCP_CONGESTION)", errno);
  }
  return std::string(buf, strnlen(buf, len));
}

Status check_congestion_available(const std::string& name) {
  if (name.empty()) return Status::ok();
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::string list, word;
  if (!in || !std::getline(in, list)) return Status::ok();
  std::istringstream words(list);
  while (words >> word) {
    if (word == name) return Status::ok();
  }
  return invalid_argument("congestion control '" + name +
                          "' is not available on this kernel (available: " + list +
                          "; a module such as tcp_" + name + " may need loading)");
}

Result<std::int64_t> unacknowledged_bytes(int fd) {
  int n = 0;
  if (::ioctl(fd, SIOCOUTQ, &n) != 0) return errno_status("ioctl(SIOCOUTQ)", errno);
  return std::int64_t{n};
}

Result<TcpRepairs> tcp_repairs(int fd) {
  // Read as bytes at the kernel ABI's offsets (uapi linux/tcp.h, append-only): the libc
  // and kernel headers here predate tcpi_total_rto, and a struct that ends earlier would
  // pad differently. tcpi_total_retrans is at 100 (u32); after tcpi_snd_wnd (228) come
  // tcpi_rcv_wnd (232), tcpi_rehash (236), tcpi_total_rto (240, u16).
  constexpr std::size_t kTotalRetrans = 100, kTotalRto = 240;
  unsigned char buf[512] = {};
  socklen_t len = sizeof buf;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, buf, &len) != 0)
    return errno_status("getsockopt(TCP_INFO)", errno);
  TcpRepairs r;
  if (len >= kTotalRetrans + 4) {
    std::uint32_t v;
    std::memcpy(&v, buf + kTotalRetrans, sizeof v);
    r.retransmitted_segments = v;
  }
  if (len >= kTotalRto + 2) {
    std::uint16_t v;
    std::memcpy(&v, buf + kTotalRto, sizeof v);
    r.timeouts = v;
  }
  return r;
}

Status enable_tx_timestamps(int fd) {
  const int flags = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE |
                    SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY;
  return set_int(fd, SOL_SOCKET, SO_TIMESTAMPING, flags, "SO_TIMESTAMPING");
}

Status drain_tx_timestamps(int fd, WireProgress* progress) {
  while (true) {
    alignas(cmsghdr) char control[256];
    msghdr m{};
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      if (errno == EINTR) continue;
      return errno_status("recvmsg(MSG_ERRQUEUE)", errno);
    }
    const timespec* ts = nullptr;
    const sock_extended_err* err = nullptr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
        ts = &reinterpret_cast<const scm_timestamping*>(CMSG_DATA(c))->ts[0];
      } else if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                 (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) {
        err = reinterpret_cast<const sock_extended_err*>(CMSG_DATA(c));
      }
    }
    if (ts == nullptr || err == nullptr || err->ee_origin != SO_EE_ORIGIN_TIMESTAMPING ||
        err->ee_info != SCM_TSTAMP_SND) {
      continue;  // not a transmit timestamp: nothing to learn from it
    }
    // ee_data: the offset of the write's last byte, modulo 2^32. Unwrapped against the
    // bytes known so far (a timestamp is never 2 GiB behind the newest).
    const std::uint64_t low = static_cast<std::uint32_t>(err->ee_data + 1);
    std::uint64_t bytes = (progress->bytes & ~std::uint64_t{0xffffffff}) | low;
    if (bytes + (std::uint64_t{1} << 31) < progress->bytes) bytes += std::uint64_t{1} << 32;
    if (bytes < progress->bytes) continue;
    // The timestamp is CLOCK_REALTIME; moved onto CLOCK_MONOTONIC by the clocks' offset now.
    timespec mono{}, real{};
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    const TimeNs offset =
        (mono.tv_sec - real.tv_sec) * 1'000'000'000LL + (mono.tv_nsec - real.tv_nsec);
    progress->bytes = bytes;
    progress->at = ts->tv_sec * 1'000'000'000LL + ts->tv_nsec + offset;
  }
}

Result<Fd> listen_tcp(const std::string& host, int port, int backlog) {
  QS_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket", errno);
  QS_RETURN_IF_ERROR(set_int(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return errno_status("bind " + host + ":" + std::to_string(port), errno);
  }
  if (::listen(fd.get(), backlog) != 0) return errno_status("listen", errno);
  return fd;
}

Result<int> local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return errno_status("getsockname", errno);
  }
  return static_cast<int>(ntohs(a.sin_port));
}

Result<Fd> connect_tcp(const std::string& host, int port, TimeNs deadline, TimeNs retry_every) {
  QS_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  const Clock& clock = SteadyClock::instance();
  int last_err = 0;
  int attempts = 0;
  for (;;) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errno_status("socket", errno);
    ++attempts;
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    last_err = errno;
    if (last_err != ECONNREFUSED && last_err != ENETUNREACH && last_err != EHOSTUNREACH &&
        last_err != ETIMEDOUT && last_err != EAGAIN && last_err != EINTR) {
      return errno_status("connect " + host + ":" + std::to_string(port), last_err);
    }
    if (clock.now() + retry_every > deadline) break;
    std::this_thread::sleep_for(std::chrono::nanoseconds(retry_every));
  }
  return unavailable("connect " + host + ":" + std::to_string(port) + ": no listener before the " +
                     "deadline (" + std::to_string(attempts) +
                     " attempts, last: " + std::strerror(last_err) + ")");
}

Result<Fd> accept_tcp(int listen_fd, std::string* peer) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) return Fd();
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      return unavailable(std::string("accept: ") + std::strerror(err) +
                         " (out of descriptors or memory)");
    }
    return errno_status("accept", err);
  }
  if (peer != nullptr) {
    char host[INET_ADDRSTRLEN] = "?";
    if (a.sin_family == AF_INET) ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
    *peer = std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  }
  return Fd(fd);
}

}  // namespace qs::transport
