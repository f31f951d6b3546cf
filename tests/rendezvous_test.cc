// The rendezvous (include/runtime/quicksilver/runtime/rendezvous.h): its line parsers, the
// coordinator's bounds, and one job's registrations and look-ups over loopback.
#include "quicksilver/runtime/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <chrono>
#include <functional>
#include <thread>

#include "quicksilver/core/check.h"
#include "quicksilver/transport/clock.h"

namespace qs::runtime {
namespace {

using ::testing::HasSubstr;

TEST(Rendezvous, ParsesRequests) {
  auto s = parse_rendezvous_request("server 3 7100");
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->role, RendezvousRequest::Role::kServer);
  EXPECT_EQ(s->id, 3);
  EXPECT_EQ(s->port, 7100);
  auto w = parse_rendezvous_request("worker 1");
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->role, RendezvousRequest::Role::kWorker);
  EXPECT_EQ(w->id, 1);
  for (const char* bad : {"", "server 1", "worker", "worker 1 2", "server x 1", "hello 1",
                          "server 99999999999999999999 1"}) {
    EXPECT_EQ(parse_rendezvous_request(bad).status().code(), StatusCode::kProtocolError) << bad;
  }
}

TEST(Rendezvous, ParsesServerLists) {
  auto l = parse_server_list("servers 10.0.0.1:7100,host:1");
  ASSERT_TRUE(l.is_ok());
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].host, "10.0.0.1");
  EXPECT_EQ((*l)[1].port, 1);
  for (const char* bad :
       {"servers ", "servers a:0", "servers a:65536", "servers :80", "servers a:80,",
        "servers a:8x", "servers a:0000080000", "error nope", "servers"}) {
    EXPECT_EQ(parse_server_list(bad).status().code(), StatusCode::kProtocolError) << bad;
  }
}

TEST(Rendezvous, CoordinatorBoundsTheJobBeforeAllocating) {
  auto c = Coordinator::create({Endpoint{"127.0.0.1", 0}, 2'000'000'000, 1, kNsPerSec});
  EXPECT_THAT(c.status().message(), HasSubstr("--workers must be in 1..64"));
  c = Coordinator::create({Endpoint{"127.0.0.1", 0}, 1, kMaxServers + 1, kNsPerSec});
  EXPECT_THAT(c.status().message(), HasSubstr("--servers must be in 1..1024"));
}

TEST(Rendezvous, ServersRegisterAndWorkersLookUp) {
  auto c = Coordinator::create({Endpoint{"127.0.0.1", 0}, 2, 2, 10 * kNsPerSec});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Endpoint at{"127.0.0.1", (*c)->port()};
  Status run;
  std::thread coordinator([&] { run = (*c)->run(); });
  Result<std::vector<Endpoint>> w0 = internal_error("not run"), w1 = internal_error("not run");
  std::thread worker0([&] { w0 = lookup_servers(at, 0, 10 * kNsPerSec); });
  EXPECT_THAT(register_server(at, 5, 7000, kNsPerSec).message(),
              HasSubstr("server id 5 not in [0, 2)"));
  EXPECT_TRUE(register_server(at, 1, 7001, 10 * kNsPerSec).is_ok());
  EXPECT_TRUE(register_server(at, 0, 7000, 10 * kNsPerSec).is_ok());
  std::thread worker1([&] { w1 = lookup_servers(at, 1, 10 * kNsPerSec); });
  worker0.join();
  worker1.join();
  coordinator.join();
  EXPECT_TRUE(run.is_ok()) << run.to_string();
  for (const auto* w : {&w0, &w1}) {
    ASSERT_TRUE(w->is_ok()) << w->status().to_string();
    ASSERT_EQ((*w)->size(), 2u);
    EXPECT_EQ((**w)[0].port, 7000);
    EXPECT_EQ((**w)[1].port, 7001);
  }
}

// ---- Who may register (issue 15) ----

std::shared_ptr<const transport::Secret> secret_of(const std::string& text) {
  auto s = transport::Secret::from_bytes(text);
  QS_CHECK_MSG(s.is_ok(), s.status().to_string());
  return std::make_shared<const transport::Secret>(std::move(*s));
}

transport::Fd raw_connect(int port) {
  auto fd = transport::connect_tcp("127.0.0.1", port,
                                   transport::SteadyClock::instance().now() + 5 * kNsPerSec);
  QS_CHECK(fd.is_ok());
  timeval tv{5, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return std::move(*fd);
}

std::string read_all(int fd) {
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    got.append(buf, static_cast<std::size_t>(n));
  return got;
}

bool eventually_true(const std::function<bool()>& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Issue 15: "server 0 4444" sent to the coordinator first hijacked that slot and sent every
// worker to the attacker. With a secret, the line is never read; the real server 0 then
// registers and the workers get its address.
TEST(Rendezvous, AnUnauthenticatedPeerCannotHijackAServerSlot) {
  const auto secret = secret_of("the cluster's own secret");
  CoordinatorOptions o{Endpoint{"127.0.0.1", 0}, 1, 1, 10 * kNsPerSec};
  o.secret = secret;
  o.limits.handshake_timeout = 500 * kNsPerMs;  // the attacker's short line never completes one
  std::vector<std::string> log;  // written by the coordinator's thread, read after join
  o.log = [&log](std::string_view l) { log.emplace_back(l); };
  auto c = Coordinator::create(o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Endpoint at{"127.0.0.1", (*c)->port()};
  Status run;
  std::thread coordinator([&] { run = (*c)->run(); });
  transport::Fd attacker = raw_connect(at.port);
  ASSERT_EQ(::send(attacker.get(), "server 0 4444\n", 14, MSG_NOSIGNAL), 14);
  EXPECT_EQ(read_all(attacker.get()).size(),
            36u);  // our nonce, then the end: no "ok", no "error"
  // A client with another secret is refused too, and a coordinator without ours is refused
  // by the client.
  EXPECT_THAT(register_server(at, 0, 4444, 2 * kNsPerSec, secret_of("an attacker's guess!").get())
                  .message(),
              HasSubstr("a different secret?"));
  EXPECT_TRUE(register_server(at, 0, 7000, 10 * kNsPerSec, secret.get()).is_ok());
  auto list = lookup_servers(at, 0, 10 * kNsPerSec, secret.get());
  coordinator.join();
  EXPECT_TRUE(run.is_ok()) << run.to_string();
  ASSERT_TRUE(list.is_ok()) << list.status().to_string();
  EXPECT_EQ((*list)[0].port, 7000);
  std::string all;
  for (const auto& l : log) all += l + "\n";
  EXPECT_THAT(all, HasSubstr("coordinator: refused 127.0.0.1:"));
  EXPECT_THAT(all, HasSubstr("authentication failed"));
}

// A coordinator that does not know the secret cannot send workers anywhere: its proof is
// refused before any line is read.
TEST(Rendezvous, ClientsRefuseACoordinatorWithoutTheSecret) {
  auto l = transport::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(l.is_ok());
  const int port = *transport::local_port(l->get());
  std::thread impostor([&] {
    transport::Fd c;
    ASSERT_TRUE(eventually_true([&] {
      auto a = transport::accept_tcp(l->get());
      if (a.is_ok() && a->valid()) c = std::move(*a);
      return c.valid();
    }));
    std::string hello = "QSA1" + std::string(32, '\x07');
    ASSERT_EQ(::send(c.get(), hello.data(), hello.size(), MSG_NOSIGNAL), 36);
    char proof[68];
    ASSERT_EQ(::recv(c.get(), proof, sizeof proof, MSG_WAITALL), 68);
    const std::string reply = std::string(32, '\0') + "servers evil:1\n";
    (void)::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    (void)read_all(c.get());
  });
  auto list = lookup_servers(Endpoint{"127.0.0.1", port}, 0, 2 * kNsPerSec,
                             secret_of("the cluster's own secret").get());
  impostor.join();
  ASSERT_FALSE(list.is_ok());
  EXPECT_THAT(list.status().message(),
              HasSubstr("authentication failed: the peer's proof is wrong"));
}

// Silent peers are closed at the deadline and capped; out of descriptors, the coordinator
// pauses accepting instead of spinning (issue 15: 66 % CPU).
TEST(Rendezvous, CoordinatorBoundsStrangersAndDoesNotSpinWithoutDescriptors) {
  CoordinatorOptions o{Endpoint{"127.0.0.1", 0}, 1, 1, 20 * kNsPerSec};
  o.secret = secret_of("the cluster's own secret");
  o.limits.max_pending = 4;
  o.limits.handshake_timeout = 300 * kNsPerMs;
  o.limits.backoff = 100 * kNsPerMs;
  auto c = Coordinator::create(o);
  ASSERT_TRUE(c.is_ok());
  const int port = (*c)->port();
  Status run;
  std::thread coordinator([&] { run = (*c)->run(); });
  std::vector<transport::Fd> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(raw_connect(port));
  ASSERT_TRUE(eventually_true([&] { return (*c)->counters().accepted == 10; }));
  EXPECT_LE((*c)->counters().pending, 4);
  ASSERT_TRUE(eventually_true(
      [&] { return (*c)->counters().refused == 10 && (*c)->counters().pending == 0; }));
  silent.clear();
  // Every descriptor taken (sockets to connect made first): accept fails with EMFILE.
  std::vector<transport::Fd> clients, fillers;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.emplace_back(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (auto& s : clients)
    EXPECT_EQ(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const bool failed = eventually_true([&] { return (*c)->counters().accept_failures >= 1; });
  const std::int64_t polls_before = (*c)->counters().polls;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::int64_t polls = (*c)->counters().polls - polls_before;
  fillers.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_TRUE(failed);
  // Paused for 100 ms at a time: a handful of polls in 500 ms, where a spinning loop makes
  // tens of thousands.
  EXPECT_LT(polls, 50);
  // And it goes on: the real server and worker get through.
  clients.clear();
  EXPECT_TRUE(register_server(Endpoint{"127.0.0.1", port}, 0, 7000, 10 * kNsPerSec, o.secret.get())
                  .is_ok());
  auto list = lookup_servers(Endpoint{"127.0.0.1", port}, 0, 10 * kNsPerSec, o.secret.get());
  coordinator.join();
  EXPECT_TRUE(run.is_ok()) << run.to_string();
  EXPECT_TRUE(list.is_ok()) << list.status().to_string();
}

}  // namespace
}  // namespace qs::runtime
