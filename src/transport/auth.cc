#include "quicksilver/transport/auth.h"

#include <fcntl.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"

namespace qs::transport {
namespace {

constexpr unsigned char kAuthMagic[Handshake::kMagicBytes] = {'Q', 'S', 'A', '1'};
constexpr std::size_t kMaxContext = 255;

// libsodium must be initialised once before its random generator is used (sodium_init is
// idempotent and thread-safe; a magic static runs it once anyway).
void ensure_sodium() {
  static const int ok = ::sodium_init();
  QS_CHECK_MSG(ok >= 0, "libsodium could not be initialised");
}

const char* role_name(AuthRole r) { return r == AuthRole::kConnector ? "connector" : "acceptor"; }

}  // namespace

// ---- Secret ----

Result<Secret> Secret::from_bytes(std::string_view bytes) {
  if (bytes.size() < kMinBytes || bytes.size() > kMaxBytes) {
    return invalid_argument("a secret must be " + std::to_string(kMinBytes) + " to " +
                            std::to_string(kMaxBytes) + " bytes, not " +
                            std::to_string(bytes.size()));
  }
  return Secret(std::vector<unsigned char>(bytes.begin(), bytes.end()));
}

Result<Secret> Secret::from_file(const std::string& path) {
  // O_NONBLOCK: a FIFO must not block the open; it is refused below as not a regular file.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return invalid_argument("secret file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return invalid_argument("secret file '" + path + "' is not a regular file");
  }
  std::vector<unsigned char> bytes(kMaxBytes + 1);
  std::size_t have = 0;
  while (have < bytes.size()) {
    const ssize_t n = ::read(fd.get(), bytes.data() + have, bytes.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::sodium_memzero(bytes.data(), bytes.size());
      return invalid_argument("secret file '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  if (have < kMinBytes || have > kMaxBytes) {
    ::sodium_memzero(bytes.data(), bytes.size());
    return invalid_argument(
        "secret file '" + path + "' holds " + (have > kMaxBytes ? "more than " : "") +
        std::to_string(std::min(have, kMaxBytes)) + " bytes; a secret is its whole content, " +
        std::to_string(kMinBytes) + " to " + std::to_string(kMaxBytes) + " bytes");
  }
  Secret s{
      std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(have))};
  ::sodium_memzero(bytes.data(), bytes.size());
  return s;
}

Secret Secret::generate() {
  ensure_sodium();
  std::vector<unsigned char> bytes(32);
  ::randombytes_buf(bytes.data(), bytes.size());
  return Secret(std::move(bytes));
}

Status Secret::write_file(const std::string& path) const {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid())
    return io_error("cannot create secret file '" + path + "': " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes_.size()) {
    const ssize_t n = ::write(fd.get(), bytes_.data() + done, bytes_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error("cannot write secret file '" + path + "': " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Secret& Secret::operator=(Secret&& o) noexcept {
  if (this != &o) {
    wipe();
    bytes_ = std::move(o.bytes_);
  }
  return *this;
}

Secret::~Secret() { wipe(); }

void Secret::wipe() {
  if (!bytes_.empty()) ::sodium_memzero(bytes_.data(), bytes_.size());
}

// ---- Handshake ----

Handshake::Handshake(const Secret& secret, AuthRole role, std::string_view context)
    : secret_(secret), role_(role), context_(context.substr(0, kMaxContext)) {
  ensure_sodium();
  ::randombytes_buf(mine_, sizeof mine_);
  std::memset(theirs_, 0, sizeof theirs_);
  if (role_ == AuthRole::kAcceptor) {
    stage_ = Stage::kSendNonce;
    out_.assign(kAuthMagic, kAuthMagic + kMagicBytes);
    out_.insert(out_.end(), mine_, mine_ + kNonceBytes);
  } else {
    stage_ = Stage::kReadNonce;
    in_.resize(kMagicBytes + kNonceBytes);
  }
}

Handshake::~Handshake() {
  ::sodium_memzero(mine_, sizeof mine_);
  ::sodium_memzero(theirs_, sizeof theirs_);
}

void Handshake::proof(AuthRole role, unsigned char out[kProofBytes]) const {
  const unsigned char* nonce_c = role_ == AuthRole::kConnector ? mine_ : theirs_;
  const unsigned char* nonce_a = role_ == AuthRole::kConnector ? theirs_ : mine_;
  crypto_auth_hmacsha256_state st;
  ::crypto_auth_hmacsha256_init(&st, secret_.data(), secret_.size());
  const auto update = [&st](const void* p, std::size_t n) {
    ::crypto_auth_hmacsha256_update(&st, static_cast<const unsigned char*>(p), n);
  };
  // Every variable-length field is followed by a 0 byte, so no two inputs concatenate alike.
  static constexpr char kLabel[] = "quicksilver-auth-v1";  // with its terminating 0
  update(kLabel, sizeof kLabel);
  update(context_.data(), context_.size());
  update("", 1);
  const char* r = role_name(role);
  update(r, std::strlen(r) + 1);
  update(nonce_c, kNonceBytes);
  update(nonce_a, kNonceBytes);
  ::crypto_auth_hmacsha256_final(&st, out);
  ::sodium_memzero(&st, sizeof st);
}

Result<Handshake::Want> Handshake::step(int fd) {
  while (true) {
    switch (stage_) {
      case Stage::kDone:
        return Want::kDone;
      case Stage::kSendNonce:
      case Stage::kSendProof: {
        const ssize_t n =
            ::send(fd, out_.data() + sent_, out_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) return Want::kWrite;
          if (errno == EINTR) continue;
          return errno_status("authentication: send", errno);
        }
        sent_ += static_cast<std::size_t>(n);
        if (sent_ < out_.size()) continue;
        sent_ = 0;
        out_.clear();
        if (stage_ == Stage::kSendNonce) {  // acceptor: now the connector's nonce and proof
          stage_ = Stage::kReadNonce;
          in_.assign(kMagicBytes + kNonceBytes + kProofBytes, 0);
        } else if (role_ == AuthRole::kConnector) {
          stage_ = Stage::kReadProof;
          in_.assign(kProofBytes, 0);
        } else {
          stage_ = Stage::kDone;
        }
        break;
      }
      case Stage::kReadNonce:
      case Stage::kReadProof: {
        // Exactly the bytes of this message: what follows belongs to the caller.
        const ssize_t n = ::recv(fd, in_.data() + got_, in_.size() - got_, MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) return Want::kRead;
          if (errno == EINTR) continue;
          return errno_status("authentication: recv", errno);
        }
        if (n == 0) {
          return unavailable("the peer closed the connection during authentication (" +
                             std::to_string(got_) + " of " + std::to_string(in_.size()) + " bytes" +
                             (role_ == AuthRole::kConnector && stage_ == Stage::kReadProof
                                  ? "; it refused our proof: a different secret?)"
                                  : ")"));
        }
        got_ += static_cast<std::size_t>(n);
        if (got_ < in_.size()) continue;
        got_ = 0;
        if (stage_ == Stage::kReadProof) {
          unsigned char want[kProofBytes];
          proof(AuthRole::kAcceptor, want);
          const bool ok = ::sodium_memcmp(want, in_.data(), kProofBytes) == 0;
          ::sodium_memzero(want, sizeof want);
          if (!ok)
            return protocol_error(
                "authentication failed: the peer's proof is wrong (a different secret)");
          stage_ = Stage::kDone;
          break;
        }
        if (std::memcmp(in_.data(), kAuthMagic, kMagicBytes) != 0) {
          return protocol_error(
              "authentication failed: the peer did not start a Quicksilver authentication "
              "(no secret configured there, or not a Quicksilver peer)");
        }
        std::memcpy(theirs_, in_.data() + kMagicBytes, kNonceBytes);
        if (role_ == AuthRole::kAcceptor) {
          unsigned char want[kProofBytes];
          proof(AuthRole::kConnector, want);
          const bool ok =
              ::sodium_memcmp(want, in_.data() + kMagicBytes + kNonceBytes, kProofBytes) == 0;
          ::sodium_memzero(want, sizeof want);
          if (!ok)
            return protocol_error(
                "authentication failed: the peer's proof is wrong (a different secret, or a "
                "replay)");
          out_.assign(kProofBytes, 0);
          proof(AuthRole::kAcceptor, out_.data());
        } else {
          out_.assign(kAuthMagic, kAuthMagic + kMagicBytes);
          out_.insert(out_.end(), mine_, mine_ + kNonceBytes);
          unsigned char p[kProofBytes];
          proof(AuthRole::kConnector, p);
          out_.insert(out_.end(), p, p + kProofBytes);
        }
        stage_ = Stage::kSendProof;
        break;
      }
    }
  }
}

Status authenticate(int fd, const Secret& secret, AuthRole role, std::string_view context,
                    TimeNs timeout) {
  const Clock& clock = SteadyClock::instance();
  const TimeNs deadline = clock.now() + timeout;
  Handshake hs(secret, role, context);
  while (true) {
    QS_ASSIGN_OR_RETURN(Handshake::Want want, hs.step(fd));
    if (want == Handshake::Want::kDone) return Status::ok();
    const TimeNs left = deadline - clock.now();
    if (left <= 0) {
      return unavailable("authentication timed out after " + format_time(timeout) +
                         (role == AuthRole::kConnector
                              ? " (does the peer run with the same --secret-file?)"
                              : ""));
    }
    pollfd p{fd, static_cast<short>(want == Handshake::Want::kRead ? POLLIN : POLLOUT), 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<TimeNs>(left / kNsPerMs + 1, 1000)));
    if (r < 0 && errno != EINTR) return errno_status("authentication: poll", errno);
  }
}

Status step_for_poll(std::unique_ptr<Handshake>* auth, int fd, short* events) {
  QS_ASSIGN_OR_RETURN(const Handshake::Want want, (*auth)->step(fd));
  if (want == Handshake::Want::kDone) {
    auth->reset();
    *events = POLLIN;
  } else {
    *events = want == Handshake::Want::kRead ? POLLIN : POLLOUT;
  }
  return Status::ok();
}

}  // namespace qs::transport
