#include "quicksilver/runtime/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>

#include "line_io.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"

namespace qs::runtime {
namespace {

constexpr std::size_t kMaxKey = 128;
// "set " + key + " " + hex value.
constexpr std::size_t kMaxStoreLine = 4 + kMaxKey + 1 + 2 * kMaxStoreValue;

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '/' || c == ':' || c == '-';
}

Status check_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxKey)
    return protocol_error("store key must be 1.." + std::to_string(kMaxKey) + " characters");
  for (char c : key) {
    if (!key_char(c)) return protocol_error("store key has a character outside [A-Za-z0-9_./:-]");
  }
  return Status::ok();
}

Status write_all(int fd, const std::string& s, TimeNs deadline) {
  return send_all(fd, s, deadline, "store send");
}

struct StoreConnection {
  transport::Fd fd;
  std::string from;
  std::unique_ptr<transport::Handshake> auth;  // while authenticating
  short events = POLLIN;
  TimeNs deadline = 0;  // to authenticate by
  std::string in;
  std::string waiting_for;  // a get not yet answerable
};

}  // namespace

std::string hex_encode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> hex_decode(std::string_view hex) {
  if (hex.size() % 2 != 0) return protocol_error("store value: odd number of hex digits");
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return protocol_error("store value: not a hex digit");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

Result<StoreRequest> parse_store_request(std::string_view line) {
  const std::size_t sp = line.find(' ');
  const std::string_view verb = line.substr(0, sp);
  const std::string_view rest =
      sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
  StoreRequest r;
  if (verb == "set") {
    const std::size_t sp2 = rest.find(' ');
    if (sp2 == std::string_view::npos) return protocol_error("expected 'set KEY HEX'");
    r.kind = StoreRequest::Kind::kSet;
    r.key = std::string(rest.substr(0, sp2));
    QS_RETURN_IF_ERROR(check_key(r.key));
    const std::string_view hex = rest.substr(sp2 + 1);
    if (hex.size() > 2 * kMaxStoreValue) {
      return protocol_error("store value longer than " + std::to_string(kMaxStoreValue) + " bytes");
    }
    QS_ASSIGN_OR_RETURN(r.value, hex_decode(hex));
    return r;
  }
  if (verb == "get") {
    r.kind = StoreRequest::Kind::kGet;
    r.key = std::string(rest);
    QS_RETURN_IF_ERROR(check_key(r.key));
    return r;
  }
  if (verb == "done") {
    r.kind = StoreRequest::Kind::kDone;
    if (rest.empty() || rest.size() > 6) return protocol_error("expected 'done RANK'");
    long v = 0;
    for (char c : rest) {
      if (c < '0' || c > '9') return protocol_error("expected 'done RANK'");
      v = v * 10 + (c - '0');
    }
    r.rank = v;
    return r;
  }
  return protocol_error("expected 'set KEY HEX', 'get KEY' or 'done RANK'");
}

// ---- server ----

StoreServer::StoreServer(int fd, int port, int ranks, TimeNs timeout)
    : fd_(fd), port_(port), ranks_(ranks), timeout_(timeout) {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
}

StoreServer::~StoreServer() {
  for (int fd : {fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

Result<std::unique_ptr<StoreServer>> StoreServer::create(
    const Endpoint& listen, int ranks, TimeNs timeout,
    std::shared_ptr<const transport::Secret> secret, transport::AcceptLimits limits) {
  QS_RETURN_IF_ERROR(check_job_size(ranks, 1));
  QS_ASSIGN_OR_RETURN(transport::Fd fd, transport::listen_tcp(listen.host, listen.port));
  QS_ASSIGN_OR_RETURN(int port, transport::local_port(fd.get()));
  std::unique_ptr<StoreServer> s(new StoreServer(fd.release(), port, ranks, timeout));
  s->secret_ = std::move(secret);
  s->limits_ = limits;
  return s;
}

void StoreServer::request_stop() {
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
}

Status StoreServer::run() {
  const TimeNs deadline = transport::steady_now() + timeout_;
  std::map<std::string, std::string, std::less<>> values;
  std::size_t value_bytes = 0;
  std::vector<bool> done(static_cast<std::size_t>(ranks_), false);
  int done_count = 0;
  std::vector<StoreConnection> clients;
  // A client that has not authenticated is closed without a word.
  auto refuse = [&](StoreConnection& c, const std::string& why) {
    if (!c.auth)
      (void)write_all(c.fd.get(), "error " + why + "\n", transport::steady_now() + kNsPerSec);
    std::fprintf(stderr, "coordinator: refused %s: %s\n", c.from.c_str(), why.c_str());
    c.fd.reset();
  };
  TimeNs paused_until = 0;  // accepting paused (out of descriptors) until then
  auto answer = [&](StoreConnection& c, const std::string& line) {
    if (!write_all(c.fd.get(), line + "\n", transport::steady_now() + 5 * kNsPerSec).is_ok())
      c.fd.reset();
  };
  bool stopped = false;
  while (done_count < ranks_ && !stopped) {
    if (transport::steady_now() > deadline) {
      std::string missing;
      for (int r = 0; r < ranks_; ++r) {
        if (!done[static_cast<std::size_t>(r)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return unavailable("coordinator: timed out before rank(s) " + missing +
                         " finished the rendezvous");
    }
    // Answer the gets whose key is there by now.
    for (StoreConnection& c : clients) {
      if (!c.fd.valid() || c.waiting_for.empty()) continue;
      if (auto it = values.find(c.waiting_for); it != values.end()) {
        c.waiting_for.clear();
        answer(c, "value " + hex_encode(it->second));
      }
    }
    const TimeNs now = transport::steady_now();
    for (StoreConnection& c : clients) {
      if (c.fd.valid() && c.auth && now > c.deadline) {
        refuse(c, "did not authenticate within " + format_time(limits_.handshake_timeout));
      }
    }
    std::erase_if(clients, [](const StoreConnection& c) { return !c.fd.valid(); });
    // The listener is left out while accepting is paused (a full descriptor table would
    // make poll return at once, again and again).
    const bool listening = now >= paused_until;
    std::vector<pollfd> fds{{listening ? fd_ : -1, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    for (const StoreConnection& c : clients) fds.push_back({c.fd.get(), c.events, 0});
    const int r = ::poll(
        fds.data(), fds.size(),
        listening ? 200 : static_cast<int>(std::max<TimeNs>(1, (paused_until - now) / kNsPerMs)));
    if (r < 0 && errno != EINTR) return transport::errno_status("coordinator poll", errno);
    if (r <= 0) continue;
    if (fds[1].revents & POLLIN) stopped = true;
    if (listening && (fds[0].revents & POLLIN)) {
      while (true) {
        std::string from;
        auto a = transport::accept_tcp(fd_, &from);
        if (!a.is_ok()) {
          if (a.status().code() == StatusCode::kUnavailable)
            paused_until = transport::steady_now() + limits_.backoff;
          break;
        }
        if (!a->valid()) break;
        const int afd = a->get();
        if (::fcntl(afd, F_SETFL, ::fcntl(afd, F_GETFL, 0) | O_NONBLOCK) != 0) continue;
        // At the cap of unauthenticated clients, the oldest goes.
        int pending = 0;
        for (const StoreConnection& c : clients) pending += c.fd.valid() && c.auth ? 1 : 0;
        for (StoreConnection& c : clients) {
          if (pending < limits_.max_pending) break;
          if (!c.fd.valid() || !c.auth) continue;
          refuse(c, "too many connections waiting to authenticate (the oldest goes)");
          --pending;
        }
        if (clients.size() >= kMaxStoreClients) {
          StoreConnection extra;
          extra.fd = std::move(*a);
          extra.from = from;
          refuse(extra, "too many connections");
          continue;
        }
        StoreConnection c;
        c.fd = std::move(*a);
        c.from = from;
        c.deadline = transport::steady_now() + limits_.handshake_timeout;
        if (secret_) {
          c.auth = std::make_unique<transport::Handshake>(*secret_, transport::AuthRole::kAcceptor,
                                                          kStoreAuthContext);
          c.events = POLLOUT;  // our nonce goes first
        }
        clients.push_back(std::move(c));
      }
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLOUT | POLLHUP | POLLERR))) continue;
      StoreConnection& c = clients[i - 2];
      if (!c.fd.valid()) continue;
      if (c.auth) {
        Status s = transport::step_for_poll(&c.auth, c.fd.get(), &c.events);
        if (!s.is_ok()) refuse(c, s.message());
        continue;
      }
      char buf[16384];
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        c.fd.reset();
        continue;
      }
      c.in.append(buf, static_cast<std::size_t>(n));
      // Bounded whatever the client does, a get pending or not: a client asks one thing at
      // a time, so one request line is all it may have buffered.
      if (c.in.size() > kMaxStoreLine + 1) {
        refuse(c, "more than one request line buffered");
        continue;
      }
      while (c.fd.valid() && c.waiting_for.empty()) {
        const std::size_t nl = c.in.find('\n');
        if (nl == std::string::npos) {
          if (c.in.size() > kMaxStoreLine) refuse(c, "line too long");
          break;
        }
        auto req = parse_store_request(std::string_view(c.in).substr(0, nl));
        c.in.erase(0, nl + 1);
        if (!req) {
          refuse(c, req.status().message());
          break;
        }
        switch (req->kind) {
          case StoreRequest::Kind::kSet: {
            auto it = values.find(req->key);
            const std::size_t old = it == values.end() ? 0 : it->second.size();
            if (it == values.end() && values.size() >= kMaxStoreKeys) {
              refuse(c, "store full (" + std::to_string(kMaxStoreKeys) + " keys)");
              break;
            }
            if (value_bytes - old + req->value.size() > kMaxStoreBytes) {
              refuse(c, "store full (" + std::to_string(kMaxStoreBytes) + " bytes)");
              break;
            }
            value_bytes = value_bytes - old + req->value.size();
            values[req->key] = std::move(req->value);
            answer(c, "ok");
            break;
          }
          case StoreRequest::Kind::kGet:
            c.waiting_for = req->key;  // answered at the top of the loop once set
            break;
          case StoreRequest::Kind::kDone:
            if (req->rank < 0 || req->rank >= ranks_) {
              refuse(c, "rank " + std::to_string(req->rank) + " not in [0, " +
                            std::to_string(ranks_) + ")");
              break;
            }
            if (!done[static_cast<std::size_t>(req->rank)]) {
              done[static_cast<std::size_t>(req->rank)] = true;
              ++done_count;
            }
            answer(c, "ok");
            break;
        }
      }
    }
  }
  if (done_count < ranks_)
    return unavailable("coordinator: stopped before every rank finished the rendezvous");
  return Status::ok();
}

// ---- client ----

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const Endpoint& server, TimeNs timeout,
                                                          const transport::Secret* secret) {
  const std::string where = "coordinator " + server.host + ":" + std::to_string(server.port);
  auto fd = transport::connect_tcp(server.host, server.port, transport::steady_now() + timeout);
  if (!fd) return fd.status().with_context(where);
  if (secret != nullptr) {
    QS_RETURN_IF_ERROR(transport::authenticate(fd->get(), *secret, transport::AuthRole::kConnector,
                                               kStoreAuthContext, timeout)
                           .with_context(where));
  }
  return std::unique_ptr<StoreClient>(new StoreClient(fd->release()));
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::string> StoreClient::request(const std::string& line, TimeNs timeout) {
  const TimeNs deadline = transport::steady_now() + timeout;
  QS_RETURN_IF_ERROR(write_all(fd_, line + "\n", deadline));
  QS_ASSIGN_OR_RETURN(std::string reply,
                      read_line(fd_, deadline, &buffer_, kMaxStoreLine, "the coordinator"));
  if (reply.rfind("error ", 0) == 0) return unavailable("coordinator: " + reply.substr(6));
  return reply;
}

Status StoreClient::set(std::string_view key, std::string_view value) {
  QS_RETURN_IF_ERROR(check_key(key));
  if (value.size() > kMaxStoreValue)
    return invalid_argument("store value longer than " + std::to_string(kMaxStoreValue));
  QS_ASSIGN_OR_RETURN(std::string reply,
                      request("set " + std::string(key) + " " + hex_encode(value), 30 * kNsPerSec));
  if (reply != "ok")
    return protocol_error("coordinator answered '" + reply.substr(0, 80) + "' to a set");
  return Status::ok();
}

Result<std::string> StoreClient::get(std::string_view key, TimeNs timeout) {
  QS_RETURN_IF_ERROR(check_key(key));
  QS_ASSIGN_OR_RETURN(std::string reply, request("get " + std::string(key), timeout));
  if (reply.rfind("value ", 0) != 0)
    return protocol_error("coordinator answered '" + reply.substr(0, 80) + "' to a get");
  return hex_decode(std::string_view(reply).substr(6));
}

Status StoreClient::done(int rank) {
  QS_ASSIGN_OR_RETURN(std::string reply, request("done " + std::to_string(rank), 30 * kNsPerSec));
  if (reply != "ok")
    return protocol_error("coordinator answered '" + reply.substr(0, 80) + "' to done");
  return Status::ok();
}

}  // namespace qs::runtime
