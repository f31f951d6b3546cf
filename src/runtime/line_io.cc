#include "line_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"

namespace qs::runtime {

Status send_all(int fd, std::string_view data, TimeNs deadline, std::string_view what) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (transport::steady_now() > deadline) return unavailable(std::string(what) + " timed out");
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return transport::errno_status(std::string(what), errno);
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Result<std::string> read_line(int fd, TimeNs deadline, std::string* buffer, std::size_t max_line,
                              std::string_view peer) {
  while (true) {
    if (const std::size_t nl = buffer->find('\n'); nl != std::string::npos) {
      std::string line = buffer->substr(0, nl);
      buffer->erase(0, nl + 1);
      return line;
    }
    if (buffer->size() > max_line) {
      return protocol_error("a line from " + std::string(peer) + " longer than " +
                            std::to_string(max_line) + " bytes");
    }
    const TimeNs left = deadline - transport::steady_now();
    if (left <= 0)
      return unavailable("no answer from " + std::string(peer) + " before the deadline");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<TimeNs>(left / kNsPerMs + 1, 1000)));
    if (r < 0 && errno != EINTR) return transport::errno_status("poll", errno);
    if (r <= 0) continue;
    char buf[16384];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return transport::errno_status("recv from " + std::string(peer), errno);
    if (n == 0) return unavailable(std::string(peer) + " closed the connection");
    buffer->append(buf, static_cast<std::size_t>(n));
  }
}

}  // namespace qs::runtime
