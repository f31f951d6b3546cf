// TCP's accepting side (quicksilver/transport/acceptor.h): a listening socket, accept with
// back-off when descriptors or memory run out, the authentication handshake driven by the
// loop, and pending peers bounded in number and time.
#include <sys/epoll.h>

#include <map>
#include <vector>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/tcp_connection.h"

namespace qs::transport {

namespace {

class TcpAcceptor final : public Acceptor {
 public:
  TcpAcceptor(EventLoop& loop, Fd listener, int port, TcpAcceptSettings s)
      : loop_(loop), listener_(std::move(listener)), port_(port), s_(std::move(s)) {}
  // No callbacks from here: the owner may be half destroyed.
  ~TcpAcceptor() override { close_all(); }

  int port() const override { return port_; }

  Status start(FrameHandler& handler) override {
    handler_ = &handler;
    QS_RETURN_IF_ERROR(
        loop_.watch(listener_.get(), EPOLLIN, [this](std::uint32_t) { accept_all(); }));
    watching_ = true;
    return Status::ok();
  }

  std::unique_ptr<Connection> admit(Connection& c) override {
    auto node = pending_.extract(c.index());
    QS_CHECK(!node.empty() && node.mapped().conn.get() == &c);
    if (node.mapped().deadline != 0) loop_.cancel(node.mapped().deadline);
    c.set_read_buffer_size(Connection::kDefaultReadBuffer);
    changed();
    return std::move(node.mapped().conn);
  }

  // A refused or broken peer before it was admitted: it was told why; the owner goes on,
  // and it is freed once this callback returned.
  void closed(Connection& c, const Status& why) override {
    auto it = pending_.find(c.index());
    if (it == pending_.end()) return;
    log(s_.owner + ": refused " + it->second.from + ": " + why.message());
    ++counters_.refused;
    if (it->second.deadline != 0) loop_.cancel(it->second.deadline);
    retire(std::move(it->second));
    pending_.erase(it);
    changed();
  }

  void stop() override {
    close_all();
    changed();
  }

  Counters counters() const override {
    Counters c = counters_;
    c.pending = static_cast<int>(pending_.size());
    c.held = static_cast<int>(pending_.size() + retired_.size());
    return c;
  }

 private:
  void close_all() {
    if (watching_) loop_.unwatch(listener_.get());
    watching_ = false;
    listening_ = false;
    for (auto& [idx, p] : pending_) {
      if (p.fd.valid()) loop_.unwatch(p.fd.get());
      if (p.deadline != 0) loop_.cancel(p.deadline);
    }
    pending_.clear();
    retired_.clear();
  }

  struct Pending {
    std::string from;                  // "address:port"
    Fd fd;                             // while authenticating
    std::unique_ptr<Handshake> auth;   // while authenticating
    std::unique_ptr<Connection> conn;  // then, until admitted
    EventLoop::TimerId deadline = 0;
  };

  void log(const std::string& line) const {
    if (s_.log) s_.log(line);
  }
  void changed() {
    if (s_.on_change) s_.on_change();
  }

  void accept_all() {
    while (listening_) {
      std::string from;
      auto fd = accept_tcp(listener_.get(), &from);
      if (!fd.is_ok() && fd.status().code() == StatusCode::kUnavailable) {
        pause(fd.status());
        return;
      }
      if (!fd.is_ok()) {
        loop_.fail(fd.status().with_context(s_.owner));
        return;
      }
      if (!fd->valid()) return;
      ++counters_.accepted;
      Status st = configure_socket(fd->get(), s_.socket);
      if (!st.is_ok()) {
        loop_.fail(st.with_context(s_.owner));
        return;
      }
      while (static_cast<int>(pending_.size()) >= s_.limits.max_pending) {
        drop(pending_.begin()->first, "closed: " + std::to_string(pending_.size()) +
                                          " connections already wait to " + s_.first +
                                          " (the oldest goes)");
      }
      const int idx = kPendingBase + next_++;
      Pending& p = pending_[idx];
      p.from = from;
      p.deadline = loop_.schedule_after(s_.limits.handshake_timeout, [this, idx] {
        auto it = pending_.find(idx);
        if (it == pending_.end()) return;
        it->second.deadline = 0;
        drop(idx, "did not " + std::string(s_.secret ? "authenticate and " : "") + s_.first +
                      " within " + format_time(s_.limits.handshake_timeout));
      });
      if (s_.secret != nullptr) {
        p.fd = std::move(*fd);
        p.auth = std::make_unique<Handshake>(*s_.secret, AuthRole::kAcceptor, s_.auth_context);
        st = loop_.watch(p.fd.get(), EPOLLIN, [this, idx](std::uint32_t) { authenticate(idx); });
        if (!st.is_ok()) {
          loop_.fail(st);
          return;
        }
        authenticate(idx);  // sends our nonce
      } else {
        start_connection(idx, std::move(*fd));
      }
      changed();
    }
  }

  // Out of descriptors or memory: the owner goes on; accepting pauses (the listener is not
  // watched, so the loop does not spin on it) and resumes after limits.backoff.
  void pause(const Status& why) {
    ++counters_.accept_failures;
    if (counters_.accept_failures == 1 || counters_.accept_failures % 100 == 0) {
      log(s_.owner + ": " + why.message() + "; accepting paused for " +
          format_time(s_.limits.backoff) + " (" + std::to_string(counters_.accept_failures) +
          " times so far)");
    }
    loop_.unwatch(listener_.get());
    watching_ = false;
    listening_ = false;
    loop_.schedule_after(s_.limits.backoff, [this] {
      Status st = loop_.watch(listener_.get(), EPOLLIN, [this](std::uint32_t) { accept_all(); });
      if (!st.is_ok()) {
        loop_.fail(st.with_context(s_.owner));
        return;
      }
      watching_ = true;
      listening_ = true;
      accept_all();
    });
    changed();
  }

  void authenticate(int idx) {
    auto it = pending_.find(idx);
    if (it == pending_.end() || !it->second.auth) return;
    Pending& p = it->second;
    auto want = p.auth->step(p.fd.get());
    if (!want.is_ok()) {
      drop(idx, want.status().message());
      return;
    }
    if (*want == Handshake::Want::kDone) {
      loop_.unwatch(p.fd.get());
      p.auth.reset();
      start_connection(idx, std::move(p.fd));
      return;
    }
    Status st = loop_.modify(p.fd.get(), *want == Handshake::Want::kRead ? EPOLLIN : EPOLLOUT);
    if (!st.is_ok()) loop_.fail(st);
  }

  void start_connection(int idx, Fd fd) {
    Pending& p = pending_[idx];
    p.conn = std::make_unique<TcpConnection>(
        loop_, std::move(fd), *handler_, "unidentified peer " + p.from + " of " + s_.owner, idx);
    p.conn->set_read_buffer_size(s_.first_frame_bytes);
    p.conn->set_payload_checksums(s_.payload_checksums);
    Status st = p.conn->start();
    if (!st.is_ok()) loop_.fail(st);
  }

  // Closes a pending peer with a log line. Before authentication it is told nothing; a
  // connection (authenticated, or no secret) is told why, and closed() retires it.
  void drop(int idx, const std::string& why) {
    auto it = pending_.find(idx);
    if (it == pending_.end()) return;
    if (it->second.conn) {
      it->second.conn->close(unavailable(why), /*tell_peer=*/true);  // closed() retires it
      return;
    }
    log(s_.owner + ": refused " + it->second.from + ": " + why);
    ++counters_.refused;
    if (it->second.deadline != 0) loop_.cancel(it->second.deadline);
    if (it->second.fd.valid()) loop_.unwatch(it->second.fd.get());
    retire(std::move(it->second));
    pending_.erase(it);
    changed();
  }

  // Frees a pending peer's state once the current callback returned (it may be running
  // inside that peer's own callback).
  void retire(Pending&& p) {
    retired_.push_back(std::move(p));
    if (retired_.size() == 1) {
      loop_.defer([this] {
        retired_.clear();
        changed();
      });
    }
  }

  EventLoop& loop_;
  Fd listener_;
  const int port_;
  const TcpAcceptSettings s_;
  FrameHandler* handler_ = nullptr;
  bool watching_ = false;           // the listener is watched
  bool listening_ = true;           // not paused
  std::map<int, Pending> pending_;  // by temporary index (the oldest first)
  std::vector<Pending> retired_;    // closed, freed after the current callback
  Counters counters_;
  int next_ = 0;
};

}  // namespace

Result<std::unique_ptr<Acceptor>> make_tcp_acceptor(EventLoop& loop, const std::string& host,
                                                    int port, TcpAcceptSettings settings) {
  QS_ASSIGN_OR_RETURN(Fd listener, listen_tcp(host, port));
  QS_ASSIGN_OR_RETURN(int bound, local_port(listener.get()));
  return std::unique_ptr<Acceptor>(
      std::make_unique<TcpAcceptor>(loop, std::move(listener), bound, std::move(settings)));
}

}  // namespace qs::transport
