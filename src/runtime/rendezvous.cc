#include "quicksilver/runtime/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "line_io.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"

namespace qs::runtime {
namespace {

constexpr std::size_t kMaxLine = 256;

// One line to a peer; the coordinator gives its own peers kReplyTime to take it.
constexpr TimeNs kReplyTime = 5 * kNsPerSec;
Status send_line(int fd, const std::string& line,
                 TimeNs deadline = transport::steady_now() + kReplyTime) {
  return send_all(fd, line + "\n", deadline, "send to the coordinator's peer");
}

// One request/response exchange with the coordinator, authenticated first when there is
// a secret.
Result<std::string> ask(const Endpoint& coordinator, const std::string& request, TimeNs timeout,
                        const transport::Secret* secret) {
  const TimeNs deadline = transport::steady_now() + timeout;
  const std::string who =
      "coordinator " + coordinator.host + ":" + std::to_string(coordinator.port);
  auto fd = transport::connect_tcp(coordinator.host, coordinator.port, deadline);
  if (!fd) return fd.status().with_context(who);
  if (secret != nullptr) {
    QS_RETURN_IF_ERROR(
        transport::authenticate(fd->get(), *secret, transport::AuthRole::kConnector,
                                kRendezvousAuthContext,
                                std::max<TimeNs>(deadline - transport::steady_now(), kNsPerMs))
            .with_context(who));
  }
  QS_RETURN_IF_ERROR(send_line(fd->get(), request, deadline));
  std::string buffer;
  QS_ASSIGN_OR_RETURN(std::string reply,
                      read_line(fd->get(), deadline, &buffer, kMaxLine, "the coordinator"));
  if (reply.rfind("error ", 0) == 0) return invalid_argument("coordinator: " + reply.substr(6));
  return reply;
}

struct Client {
  transport::Fd fd;
  std::string from;                            // "address:port", for log lines
  std::string peer_host;                       // the address alone: a registering server's host
  std::unique_ptr<transport::Handshake> auth;  // while authenticating
  short events = POLLIN;
  std::string buffer;
  int worker = -1;      // a worker waiting for the list (identified: no deadline)
  TimeNs deadline = 0;  // until identified (AcceptLimits::handshake_timeout)
};

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::create(const CoordinatorOptions& o) {
  // Bounded before anything is allocated: the tables below are per worker and per server.
  QS_RETURN_IF_ERROR(check_job_size(o.workers, o.servers));
  QS_ASSIGN_OR_RETURN(transport::Fd fd, transport::listen_tcp(o.listen.host, o.listen.port));
  QS_ASSIGN_OR_RETURN(int port, transport::local_port(fd.get()));
  return std::unique_ptr<Coordinator>(new Coordinator(o, fd.release(), port));
}

Coordinator::~Coordinator() {
  if (fd_ >= 0) ::close(fd_);
}

Coordinator::Counters Coordinator::counters() const {
  return Counters{accepted_.load(), refused_.load(), pending_.load(), accept_failures_.load(),
                  polls_.load()};
}

Status Coordinator::run() {
  const TimeNs deadline = transport::steady_now() + options_.timeout;
  const transport::AcceptLimits& limits = options_.limits;
  const auto log = [this](const std::string& line) {
    if (options_.log) options_.log(line);
  };
  std::vector<Endpoint> servers(static_cast<std::size_t>(options_.servers));
  // A worker is `waiting` from its request until the list reached it (`served`); one whose
  // connection drops before that may ask again.
  std::vector<bool> registered(servers.size(), false);
  std::vector<bool> waiting(static_cast<std::size_t>(options_.workers), false);
  std::vector<bool> served(static_cast<std::size_t>(options_.workers), false);
  int registered_count = 0, served_count = 0;
  std::vector<Client> clients;  // in arrival order
  TimeNs paused_until = 0;      // accepting paused (out of descriptors) until then
  // A peer that has not authenticated is closed without a word; an authenticated one (or
  // any, without a secret) is told why.
  auto refuse = [&](Client& c, const std::string& why) {
    if (!c.auth) (void)send_line(c.fd.get(), "error " + why);
    log("coordinator: refused " + c.from + ": " + why);
    ++refused_;
    c.fd.reset();
  };
  while (true) {
    const TimeNs now = transport::steady_now();
    if (now > deadline) {
      return unavailable("coordinator: timed out with " + std::to_string(registered_count) +
                         " of " + std::to_string(options_.servers) + " servers registered and " +
                         std::to_string(served_count) + " of " + std::to_string(options_.workers) +
                         " workers served");
    }
    // Answer waiting workers once every server is known.
    if (registered_count == options_.servers) {
      std::string list;
      for (const Endpoint& e : servers)
        list += (list.empty() ? "" : ",") + e.host + ":" + std::to_string(e.port);
      for (Client& c : clients) {
        if (!c.fd.valid() || c.worker < 0) continue;
        const auto w = static_cast<std::size_t>(c.worker);
        waiting[w] = false;
        if (send_line(c.fd.get(), "servers " + list).is_ok()) {
          served[w] = true;
          ++served_count;
        }
        c.fd.reset();
      }
      if (served_count == options_.workers) break;
    }
    // Peers not identified in time are closed.
    for (Client& c : clients) {
      if (c.fd.valid() && c.worker < 0 && now > c.deadline) {
        refuse(c, std::string("did not ") + (c.auth ? "authenticate and " : "") +
                      "send a request within " + format_time(limits.handshake_timeout));
      }
    }
    std::erase_if(clients, [](const Client& c) { return !c.fd.valid(); });
    pending_.store(static_cast<int>(std::count_if(clients.begin(), clients.end(),
                                                  [](const Client& c) { return c.worker < 0; })));
    // The listener is left out while accepting is paused, so that a full descriptor table
    // does not make poll return at once, again and again.
    const bool listening = now >= paused_until;
    std::vector<pollfd> fds;
    if (listening) fds.push_back({fd_, POLLIN, 0});
    const std::size_t first_client = fds.size();
    for (const Client& c : clients) fds.push_back({c.fd.get(), c.events, 0});
    TimeNs wait = 200 * kNsPerMs;
    if (!listening) wait = std::min(wait, paused_until - now);
    ++polls_;
    int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<TimeNs>(wait / kNsPerMs, 1)));
    if (r < 0 && errno != EINTR) return transport::errno_status("coordinator poll", errno);
    if (r <= 0) continue;
    if (listening && (fds[0].revents & POLLIN)) {
      while (true) {
        std::string from;
        auto a = transport::accept_tcp(fd_, &from);
        if (!a.is_ok()) {
          ++accept_failures_;
          if (a.status().code() == StatusCode::kUnavailable) {
            paused_until = transport::steady_now() + limits.backoff;
            if (accept_failures_ == 1 || accept_failures_ % 100 == 0) {
              log("coordinator: " + a.status().message() + "; accepting paused for " +
                  format_time(limits.backoff) + " (" + std::to_string(accept_failures_.load()) +
                  " times so far)");
            }
          } else {
            log("coordinator: " + a.status().message());
          }
          break;
        }
        if (!a->valid()) break;
        ++accepted_;
        const int fd = a->get();
        if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK) != 0) continue;
        // At the cap of unidentified peers, the oldest goes.
        int pending = 0;
        for (const Client& c : clients) pending += c.fd.valid() && c.worker < 0 ? 1 : 0;
        for (Client& c : clients) {
          if (pending < limits.max_pending) break;
          if (!c.fd.valid() || c.worker >= 0) continue;
          refuse(c, std::to_string(pending) +
                        " connections already wait to send a request (the oldest goes)");
          --pending;
        }
        Client c;
        c.fd = std::move(*a);
        c.from = from;
        c.peer_host = from.substr(0, from.rfind(':'));
        c.deadline = transport::steady_now() + limits.handshake_timeout;
        if (options_.secret) {
          c.auth = std::make_unique<transport::Handshake>(
              *options_.secret, transport::AuthRole::kAcceptor, kRendezvousAuthContext);
          c.events = POLLOUT;  // our nonce goes first
        }
        clients.push_back(std::move(c));
      }
    }
    for (std::size_t i = first_client; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLOUT | POLLHUP | POLLERR))) continue;
      Client& c = clients[i - first_client];
      if (!c.fd.valid()) continue;
      if (c.auth) {
        Status s = transport::step_for_poll(&c.auth, c.fd.get(), &c.events);
        if (!s.is_ok()) refuse(c, s.message());
        continue;
      }
      char buf[256];
      ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        if (c.worker >= 0) waiting[static_cast<std::size_t>(c.worker)] = false;
        c.fd.reset();
        continue;
      }
      if (c.worker >= 0) continue;  // a waiting worker has nothing more to say
      c.buffer.append(buf, static_cast<std::size_t>(n));
      auto nl = c.buffer.find('\n');
      if (nl == std::string::npos) {
        if (c.buffer.size() > kMaxLine) refuse(c, "line too long");
        continue;
      }
      auto request = parse_rendezvous_request(std::string_view(c.buffer).substr(0, nl));
      const long id = request ? request->id : -1, port = request ? request->port : -1;
      if (!request) {
        refuse(c, request.status().message());
      } else if (request->role == RendezvousRequest::Role::kServer) {
        if (id < 0 || id >= options_.servers) {
          refuse(c, "server id " + std::to_string(id) + " not in [0, " +
                        std::to_string(options_.servers) + ")");
        } else if (registered[static_cast<std::size_t>(id)]) {
          refuse(c, "server " + std::to_string(id) + " registered twice");
        } else if (port <= 0 || port > 65535) {
          refuse(c, "bad port " + std::to_string(port));
        } else {
          servers[static_cast<std::size_t>(id)] = Endpoint{c.peer_host, static_cast<int>(port)};
          registered[static_cast<std::size_t>(id)] = true;
          ++registered_count;
          (void)send_line(c.fd.get(), "ok");
          c.fd.reset();
        }
      } else {
        if (id < 0 || id >= options_.workers) {
          refuse(c, "worker id " + std::to_string(id) + " not in [0, " +
                        std::to_string(options_.workers) + ")");
        } else if (served[static_cast<std::size_t>(id)] || waiting[static_cast<std::size_t>(id)]) {
          refuse(c, "worker " + std::to_string(id) + " asked twice");
        } else {
          waiting[static_cast<std::size_t>(id)] = true;
          c.worker = static_cast<int>(id);
        }
      }
    }
  }
  return Status::ok();
}

Status register_server(const Endpoint& coordinator, int id, int port, TimeNs timeout,
                       const transport::Secret* secret) {
  QS_ASSIGN_OR_RETURN(std::string reply,
                      ask(coordinator, "server " + std::to_string(id) + " " + std::to_string(port),
                          timeout, secret));
  if (reply != "ok")
    return protocol_error("coordinator answered '" + reply + "' to a registration");
  return Status::ok();
}

Result<std::vector<Endpoint>> lookup_servers(const Endpoint& coordinator, int worker_id,
                                             TimeNs timeout, const transport::Secret* secret) {
  QS_ASSIGN_OR_RETURN(std::string reply,
                      ask(coordinator, "worker " + std::to_string(worker_id), timeout, secret));
  return parse_server_list(reply);
}

Result<RendezvousRequest> parse_rendezvous_request(std::string_view text) {
  std::istringstream line{std::string(text)};
  std::string role, extra;
  RendezvousRequest r;
  line >> role >> r.id;
  if (role == "server" && (line >> r.port) && !(line >> extra)) {
    r.role = RendezvousRequest::Role::kServer;
    return r;
  }
  if (role == "worker" && !line.fail() && !(line >> extra)) {
    r.role = RendezvousRequest::Role::kWorker;
    r.port = -1;
    return r;
  }
  return protocol_error("expected 'server ID PORT' or 'worker ID'");
}

Result<std::vector<Endpoint>> parse_server_list(std::string_view reply) {
  if (reply.substr(0, 8) != "servers ") {
    return protocol_error("coordinator answered '" + std::string(reply.substr(0, kMaxLine)) +
                          "' to a look-up");
  }
  std::vector<Endpoint> out;
  std::string_view rest = reply.substr(8);
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto bad = [&](const char* what) {
      return protocol_error(std::string("coordinator sent a bad ") + what + " in '" +
                            std::string(item.substr(0, kMaxLine)) + "'");
    };
    const std::size_t colon = item.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return bad("address");
    const std::string_view digits = item.substr(colon + 1);
    int port = 0;
    if (digits.empty() || digits.size() > 5) return bad("port");
    for (char ch : digits) {
      if (ch < '0' || ch > '9') return bad("port");
      port = port * 10 + (ch - '0');
    }
    if (port <= 0 || port > 65535) return bad("port");
    out.push_back(Endpoint{std::string(item.substr(0, colon)), port});
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

}  // namespace qs::runtime
