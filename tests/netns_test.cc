// The emulated cluster's shapers, read back with `tc` (needs root and iproute2; skipped
// otherwise): tbf installed on both directions of every host's link through netlink, and
// rate changes that reach every shaper while the queue keeps its nominal size.
#include "quicksilver/runtime/netns.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/tbf_netlink.h"

namespace qs::runtime {
namespace {

// `tc qdisc show dev DEV` in namespace ns ("" = this one).
std::string qdisc(const std::string& ns, const std::string& dev) {
  std::string out;
  std::vector<std::string> argv;
  if (!ns.empty()) argv = {"ip", "netns", "exec", ns};
  for (const char* a : {"tc", "-raw", "qdisc", "show", "dev"}) argv.push_back(a);
  argv.push_back(dev);
  Status s = run_command(argv, &out);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

// The "rate R" and "lat/limit" words of a tbf line, e.g. "rate 500Mbit burst 62500b".
std::string field(const std::string& line, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex(name + " ([^ ]+)")))
    return "(no " + name + " in '" + line + "')";
  return m[1].str();
}

class Netns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
    NetnsOptions o;
    o.hosts = 2;
    o.rate = Rate::mbps(500);
    // A tag of its own per test: a veth of the previous test's cluster may outlive its
    // namespace for a moment (the kernel deletes it asynchronously).
    static int next = 0;
    tag_ = "qst" + std::to_string(getpid() % 10000) + static_cast<char>('a' + next++ % 26);
    o.tag = tag_;
    auto c = NetnsCluster::create(o);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    cluster_ = std::move(*c);
  }
  // Uplink (in the host's namespace) and downlink (bridge side, here) of host h.
  std::string uplink(int h) {
    return qdisc(cluster_->namespace_name(h), tag() + "v" + std::to_string(h));
  }
  std::string downlink(int h) { return qdisc("", tag() + "p" + std::to_string(h)); }
  const std::string& tag() const { return tag_; }
  std::string tag_;
  std::unique_ptr<NetnsCluster> cluster_;
};

TEST_F(Netns, EveryLinkIsShapedInBothDirections) {
  for (int h = 0; h < 2; ++h) {
    for (const std::string& q : {uplink(h), downlink(h)}) {
      EXPECT_NE(q.find("qdisc tbf"), std::string::npos) << q;
      EXPECT_EQ(field(q, "rate"), "500Mbit") << q;
      // 1 ms of the rate, but at least a whole GSO packet (64 KiB + headers), which tbf
      // would otherwise segment in software.
      EXPECT_EQ(field(q, "burst"), "68Kb") << q;
    }
    EXPECT_EQ(field(uplink(h), "limit"), "1319632b") << uplink(h);  // the host's 20 ms + the burst
    EXPECT_EQ(field(downlink(h), "limit"), "194632b")
        << downlink(h);  // the switch port's 2 ms + the burst
  }
}

// Every host hands its link TCP packets of at most NetnsOptions::gso_max (48 KiB).
TEST_F(Netns, HostsSendPacketsOfAtMostTheGsoSize) {
  for (int h = 0; h < 2; ++h) {
    std::string out;
    Status s = run_command({"ip", "-n", cluster_->namespace_name(h), "-d", "link", "show", "dev",
                            tag() + "v" + std::to_string(h)},
                           &out);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(field(out, "gso_max_size"), "49152") << out;
  }
}

// The shapers' drop counters: a burst of datagrams larger than host 0's queue is dropped
// there, on its uplink, and counted as the host queue's; its switch port toward host 1
// receives no more than the uplink's rate and drops nothing.
TEST_F(Netns, DropsAreCountedWhereTheQueueOverflowed) {
  auto before = cluster_->drops(0);
  ASSERT_TRUE(before.is_ok()) << before.status().message();
  EXPECT_EQ(before->host_queue, 0U);
  EXPECT_EQ(before->switch_port, 0U);
  // 10 Mbit/s: the queue keeps its bytes (1.3 MB, 20 ms of the nominal 500 Mbit/s) but
  // drains at 1.25 KB per ms, so the burst overflows it however slowly this loaded
  // machine sends.
  ASSERT_TRUE(cluster_->set_rate_all(Rate::mbps(10)).is_ok());
  Status sent;
  std::thread t([&] {
    sent = NetnsCluster::enter(cluster_->namespace_name(0));
    if (!sent.is_ok()) return;
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    // A send buffer larger than the burst, so that sendto() does not wait for the queue.
    const int sndbuf = 16 << 20;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);  // discard: nobody listens, the datagrams only cross the links
    inet_pton(AF_INET, cluster_->address(1).c_str(), &to.sin_addr);
    const std::vector<char> payload(60000, 'x');
    // One datagram first, so that host 1's address is resolved (ARP) before the burst.
    (void)sendto(fd, payload.data(), payload.size(), 0, reinterpret_cast<sockaddr*>(&to),
                 sizeof to);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // 6 MB in datagrams of 41 fragments each, against the queue of 1.3 MB.
    for (int i = 0; i < 100; ++i) {
      (void)sendto(fd, payload.data(), payload.size(), 0, reinterpret_cast<sockaddr*>(&to),
                   sizeof to);
    }
    close(fd);
  });
  t.join();
  ASSERT_TRUE(sent.is_ok()) << sent.message();
  auto sender = cluster_->drops(0);
  auto receiver = cluster_->drops(1);
  ASSERT_TRUE(sender.is_ok() && receiver.is_ok());
  EXPECT_GT(sender->host_queue, 0U);
  EXPECT_EQ(receiver->switch_port, 0U);
  EXPECT_EQ(receiver->host_queue, 0U);
  EXPECT_FALSE(cluster_->drops(2).is_ok());
}

TEST_F(Netns, RateChangesReachEveryShaperAndKeepTheQueue) {
  ASSERT_TRUE(cluster_->set_rate_all(Rate::mbps(50)).is_ok());
  for (int h = 0; h < 2; ++h) {
    for (const std::string& q : {uplink(h), downlink(h)}) {
      EXPECT_EQ(field(q, "rate"), "50Mbit") << q;
      // Burst and queue stay those of the nominal 500 Mbit/s: a packet queued under the
      // nominal burst must still fit the bucket at the new rate.
      EXPECT_EQ(field(q, "burst"), "68Kb") << q;
    }
    EXPECT_EQ(field(uplink(h), "limit"), "1319632b");
    EXPECT_EQ(field(downlink(h), "limit"), "194632b");
  }
  ASSERT_TRUE(cluster_->set_rate(1, Rate::gbps(40)).is_ok());  // above 2^32 B/s: TCA_TBF_RATE64
  EXPECT_EQ(field(uplink(1), "rate"), "40Gbit");
  EXPECT_EQ(field(downlink(1), "rate"), "40Gbit");
  EXPECT_EQ(field(uplink(0), "rate"), "50Mbit");
  EXPECT_FALSE(cluster_->set_rate(2, Rate::mbps(1)).is_ok());
}

// The start-up calibration's candidates: the cluster re-sized for a new nominal rate, as if
// built at it (burst 1 ms, queues 20 and 2 ms of the new rate).
TEST_F(Netns, ANewNominalRateResizesBurstAndQueues) {
  ASSERT_TRUE(cluster_->set_nominal_rate(Rate::mbps(100)).is_ok());
  EXPECT_EQ(cluster_->nominal_rate().bits_per_second, Rate::mbps(100).bits_per_second);
  for (int h = 0; h < 2; ++h) {
    for (const std::string& q : {uplink(h), downlink(h)}) {
      EXPECT_EQ(field(q, "rate"), "100Mbit") << q;
      EXPECT_EQ(field(q, "burst"), "68Kb") << q;  // 1 ms of 100 Mbit/s is under a GSO packet
    }
    EXPECT_EQ(field(uplink(h), "limit"), "319632b");  // 20 ms + the burst
    EXPECT_EQ(field(downlink(h), "limit"),
              "100Kb");  // the 2 ms queue under its 32 KiB floor, + the burst
  }
  ASSERT_TRUE(cluster_->set_nominal_rate(Rate::gbps(1)).is_ok());
  EXPECT_EQ(field(downlink(1), "burst"), "125000b");
  EXPECT_EQ(field(downlink(1), "limit"), "375000b");
}

// Every link at once: one flow per host, each near the shaped rate on an idle machine.
TEST_F(Netns, WholeClusterGoodputLoadsEveryLinkAtOnce) {
  ASSERT_TRUE(cluster_->set_nominal_rate(Rate::mbps(50)).is_ok());
  auto g = measure_cluster_goodput(*cluster_, "cubic", 0, 1);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  ASSERT_EQ(g->flows.size(), 2U);
  for (Rate r : g->flows) {
    // 50 Mbit/s shaped: TCP payload is at most 1448/1514 of it; the machine may be busy.
    EXPECT_GT(r.bits_per_second, Rate::mbps(20).bits_per_second);
    EXPECT_LT(r.bits_per_second, Rate::mbps(50).bits_per_second);
  }
  EXPECT_LE(g->min.bits_per_second, g->median.bits_per_second);
  EXPECT_GE(g->cpu_idle, 0.0);
  EXPECT_LE(g->cpu_idle, 1.0);
  EXPECT_FALSE(measure_cluster_goodput(*cluster_, "cubic", 1, 1).is_ok());  // one host: no link
}

// `--switch-buffer`: the bridge side of every link (the switch port toward its host)
// queues that long at the nominal rate; the hosts' own queues stay as they are
// (`--host-queue`, here 5 ms).
TEST(NetnsSwitch, TheSwitchBufferSizesTheDownlinkQueuesOnly) {
  if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
  NetnsOptions o;
  o.hosts = 2;
  o.rate = Rate::mbps(500);
  o.switch_buffer = 10 * kNsPerMs;
  o.host_queue = 5 * kNsPerMs;
  o.tag = "qsb" + std::to_string(getpid() % 10000);
  auto c = NetnsCluster::create(o);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  for (int h = 0; h < 2; ++h) {
    const std::string up = qdisc((*c)->namespace_name(h), o.tag + "v" + std::to_string(h));
    const std::string down = qdisc("", o.tag + "p" + std::to_string(h));
    EXPECT_EQ(field(up, "limit"), "382132b") << up;      // 5 ms + the burst
    EXPECT_EQ(field(down, "limit"), "694632b") << down;  // 10 ms + the burst
  }
  ASSERT_TRUE((*c)->set_rate_all(Rate::mbps(100)).is_ok());  // a changing rate keeps both
  EXPECT_EQ(field(qdisc("", o.tag + "p0"), "limit"), "694632b");
  EXPECT_EQ(field(qdisc((*c)->namespace_name(0), o.tag + "v0"), "limit"), "382132b");
}

// `fan_in`: every switch port also holds one shaper burst (68 KiB) from each host that
// sends to it at once, whatever the rate; the hosts' own queues do not change.
TEST(NetnsSwitch, EverySwitchPortHoldsABurstFromEachSender) {
  if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
  NetnsOptions o;
  o.hosts = 2;
  o.rate = Rate::mbps(500);
  o.fan_in = 4;
  o.tag = "qsf" + std::to_string(getpid() % 10000);
  auto c = NetnsCluster::create(o);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(field(qdisc("", o.tag + "p" + std::to_string(h)), "limit"),
              "473160b");  // 2 ms + 5 bursts
    EXPECT_EQ(field(qdisc((*c)->namespace_name(h), o.tag + "v" + std::to_string(h)), "limit"),
              "1319632b");
  }
  ASSERT_TRUE((*c)->set_rate_all(Rate::mbps(100)).is_ok());  // a changing rate keeps it
  EXPECT_EQ(field(qdisc("", o.tag + "p1"), "limit"), "473160b");
}

TEST(TbfLink, UnknownDeviceOrNamespaceIsNamed) {
  if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
  auto a = TbfLink::open("", "nosuchdev0");
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("no network device 'nosuchdev0'"), std::string::npos)
      << a.status().message();
  auto b = TbfLink::open("qsnosuchns", "lo");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("/var/run/netns/qsnosuchns"), std::string::npos)
      << b.status().message();
}

TEST(TbfLink, KernelRefusalIsReported) {
  if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
  auto lo = TbfLink::open("", "lo");
  ASSERT_TRUE(lo.is_ok()) << lo.status().message();
  // lo has no tbf to change: the kernel says so, and nothing is installed.
  Status s = lo->set(TbfParams{Rate::mbps(100), 32 * 1024, 64 * 1024}, false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("the kernel refused changing the qdisc"), std::string::npos)
      << s.message();
  EXPECT_EQ(qdisc("", "lo").find("tbf"), std::string::npos);
  EXPECT_FALSE(lo->set(TbfParams{Rate::mbps(100), 0, 64 * 1024}, false).is_ok());
}

}  // namespace
}  // namespace qs::runtime

namespace qs::runtime {
namespace {

// `--rto-min` and `--quickack`: every host's route carries the metrics asked for, and
// none otherwise (the kernel's 200 ms floor, delayed acknowledgements).
TEST(NetnsRoutes, RtoMinAndQuickackAreSetOnEveryHostRouteOnlyWhenAsked) {
  if (Status s = NetnsCluster::available(); !s.is_ok()) GTEST_SKIP() << s.message();
  for (TimeNs rto : {TimeNs{0}, 5 * kNsPerMs}) {
    NetnsOptions o;
    o.hosts = 2;
    o.rate = Rate::mbps(500);
    o.rto_min = rto;
    o.quickack = rto == 0;
    o.tag =
        "qsr" + std::to_string(getpid() % 10000) + (rto > 0 ? "b" : "a");  // one tag per cluster
    auto c = NetnsCluster::create(o);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    for (int h = 0; h < 2; ++h) {
      std::string out;
      ASSERT_TRUE(
          run_command({"ip", "-n", (*c)->namespace_name(h), "route", "show"}, &out).is_ok());
      if (rto > 0) {
        EXPECT_NE(out.find("rto_min lock 5ms"), std::string::npos) << out;
        EXPECT_EQ(out.find("quickack"), std::string::npos) << out;
      } else {
        EXPECT_EQ(out.find("rto_min"), std::string::npos) << out;
        EXPECT_NE(out.find("quickack 1"), std::string::npos) << out;
      }
    }
  }
}

}  // namespace
}  // namespace qs::runtime
