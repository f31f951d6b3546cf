// The rendezvous (include/runtime/quicksilver/runtime/rendezvous.h): its line parsers, the
// coordinator's bounds, and one job's registrations and look-ups over loopback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "quicksilver/runtime/rendezvous.h"

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
  for (const char* bad : {"servers ", "servers a:0", "servers a:65536", "servers :80", "servers a:80,",
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
  EXPECT_THAT(register_server(at, 5, 7000, kNsPerSec).message(), HasSubstr("server id 5 not in [0, 2)"));
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

}  // namespace
}  // namespace qs::runtime
