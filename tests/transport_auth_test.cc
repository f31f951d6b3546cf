// Peer authentication (quicksilver/transport/auth.h): both sides must know the secret; a
// wrong secret, a replayed exchange, another context, a silent peer are all refused; the
// caller's protocol starts on the very next byte; secret files are bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/socket.h"

namespace qs::transport {
namespace {

using ::testing::HasSubstr;

constexpr TimeNs kTimeout = 5 * kNsPerSec;

Secret secret_of(const std::string& s) {
  auto r = Secret::from_bytes(s);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(*r);
}

struct AuthPair {
  Fd a, b;
};
AuthPair socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return {Fd(fds[0]), Fd(fds[1])};
}

// Runs a connector on p.a and an acceptor on p.b, concurrently.
std::pair<Status, Status> run_both(AuthPair& p, const Secret& connector, const Secret& acceptor,
                                   std::string_view cctx = "ps", std::string_view actx = "ps") {
  auto acc = std::async(std::launch::async, [&] {
    Status s = authenticate(p.b.get(), acceptor, AuthRole::kAcceptor, actx, kTimeout);
    if (!s.is_ok()) p.b.reset();  // refused: closed, as a server does
    return s;
  });
  Status c = authenticate(p.a.get(), connector, AuthRole::kConnector, cctx, kTimeout);
  return {c, acc.get()};
}

TEST(Auth, SameSecretAuthenticatesBothSidesAndLeavesTheStreamToTheCaller) {
  const Secret s = secret_of("sixteen byte key!");
  AuthPair p = socket_pair();
  auto [c, a] = run_both(p, s, s);
  ASSERT_TRUE(c.is_ok()) << c.to_string();
  ASSERT_TRUE(a.is_ok()) << a.to_string();
  // Nothing of the handshake is left unread: the next bytes are the caller's.
  ASSERT_EQ(::send(p.a.get(), "hello", 5, 0), 5);
  char buf[8] = {};
  ASSERT_EQ(::recv(p.b.get(), buf, sizeof buf, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
}

TEST(Auth, WrongSecretIsRefusedOnBothSides) {
  AuthPair p = socket_pair();
  auto [c, a] = run_both(p, secret_of("the attacker's guess"), secret_of("the cluster's secret"));
  EXPECT_EQ(a.code(), StatusCode::kProtocolError);
  EXPECT_THAT(a.message(), HasSubstr("authentication failed"));
  // The acceptor closed without a word: the connector sees the connection end.
  EXPECT_FALSE(c.is_ok());
  EXPECT_THAT(c.message(), HasSubstr("a different secret?"));
}

TEST(Auth, AnotherContextIsRefused) {
  const Secret s = secret_of("sixteen byte key!");
  AuthPair p = socket_pair();
  auto [c, a] = run_both(p, s, s, "rendezvous", "ps");
  EXPECT_THAT(a.message(), HasSubstr("authentication failed"));
  EXPECT_FALSE(c.is_ok());
}

TEST(Auth, ARecordedExchangeCannotBeReplayed) {
  const Secret s = secret_of("sixteen byte key!");
  // Record what a real connector sends to a real acceptor.
  AuthPair p = socket_pair();
  Handshake acceptor(s, AuthRole::kAcceptor, "ps");
  ASSERT_EQ(*acceptor.step(p.b.get()), Handshake::Want::kRead);  // its nonce went out
  auto conn = std::async(std::launch::async, [&] {
    return authenticate(p.a.get(), s, AuthRole::kConnector, "ps", kTimeout);
  });
  // Read the connector's message (68 bytes) off the wire as an eavesdropper would, then
  // hand the same bytes on so the real exchange completes.
  AuthPair tap = socket_pair();
  std::string recorded;
  while (recorded.size() < 68) {
    char buf[128];
    const ssize_t n = ::recv(p.b.get(), buf, 68 - recorded.size(), 0);
    ASSERT_GT(n, 0);
    recorded.append(buf, static_cast<std::size_t>(n));
  }
  ASSERT_EQ(::send(tap.a.get(), recorded.data(), recorded.size(), 0), 68);
  Result<Handshake::Want> w = acceptor.step(tap.b.get());
  while (w.is_ok() && *w != Handshake::Want::kDone) w = acceptor.step(tap.b.get());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  // The acceptor's proof went to tap.b; pass it to the real connector.
  char proof[32];
  ASSERT_EQ(::recv(tap.a.get(), proof, sizeof proof, 0), 32);
  ASSERT_EQ(::send(p.b.get(), proof, sizeof proof, 0), 32);
  ASSERT_TRUE(conn.get().is_ok());

  // Later, the recording is replayed to a new acceptor: its nonce is fresh, so it fails.
  AuthPair q = socket_pair();
  auto replayed = std::async(std::launch::async, [&] {
    return authenticate(q.b.get(), s, AuthRole::kAcceptor, "ps", kTimeout);
  });
  char nonce[36];
  ASSERT_EQ(::recv(q.a.get(), nonce, sizeof nonce, MSG_WAITALL), 36);
  ASSERT_EQ(::send(q.a.get(), recorded.data(), recorded.size(), 0), 68);
  Status r = replayed.get();
  EXPECT_EQ(r.code(), StatusCode::kProtocolError);
  EXPECT_THAT(r.message(), HasSubstr("a replay"));
}

TEST(Auth, APeerWithoutAuthenticationIsNotAQuicksilverPeer) {
  const Secret s = secret_of("sixteen byte key!");
  AuthPair p = socket_pair();
  auto acc = std::async(std::launch::async, [&] {
    return authenticate(p.b.get(), s, AuthRole::kAcceptor, "ps", kTimeout);
  });
  // A peer that goes straight to its protocol (here, an old worker's hello frame).
  std::string junk(68, 'x');
  ASSERT_EQ(::send(p.a.get(), junk.data(), junk.size(), 0), 68);
  EXPECT_THAT(acc.get().message(), HasSubstr("did not start a Quicksilver authentication"));
}

TEST(Auth, ASilentPeerTimesOutAndAStepNeverBlocks) {
  const Secret s = secret_of("sixteen byte key!");
  AuthPair p = socket_pair();
  Handshake h(s, AuthRole::kConnector, "ps");
  EXPECT_EQ(*h.step(p.a.get()), Handshake::Want::kRead);  // nothing to read: returns at once
  EXPECT_FALSE(h.done());
  Status st = authenticate(p.b.get(), s, AuthRole::kConnector, "ps", 50 * kNsPerMs);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("authentication timed out"));
}

TEST(Auth, SecretFilesAreBoundedAndWrittenPrivately) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("qs-auth-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string small = (dir / "small").string(), big = (dir / "big").string(),
                    fifo = (dir / "fifo").string();
  std::ofstream(small) << "15 bytes secret";
  std::ofstream(big) << std::string(Secret::kMaxBytes + 1, 'x');
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(Secret::from_file(small).status().message(), HasSubstr("holds 15 bytes"));
  EXPECT_THAT(Secret::from_file(small).status().message(), HasSubstr(small));
  EXPECT_THAT(Secret::from_file(big).status().message(), HasSubstr("more than 4096 bytes"));
  EXPECT_THAT(Secret::from_file(fifo).status().message(), HasSubstr("not a regular file"));
  EXPECT_THAT(Secret::from_file((dir / "none").string()).status().message(),
              HasSubstr("No such file"));
  EXPECT_EQ(Secret::from_file(small).status().code(), StatusCode::kInvalidArgument);

  const std::string written = (dir / "secret").string();
  const Secret g = Secret::generate();
  EXPECT_EQ(g.size(), 32u);
  ASSERT_TRUE(g.write_file(written).is_ok());
  struct stat st {};
  ASSERT_EQ(::stat(written.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(g.write_file(written).is_ok());  // never over an existing file
  auto back = Secret::from_file(written);
  ASSERT_TRUE(back.is_ok());
  AuthPair p = socket_pair();
  auto [c, a] = run_both(p, g, *back);
  EXPECT_TRUE(c.is_ok() && a.is_ok()) << c.to_string() << " / " << a.to_string();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qs::transport
