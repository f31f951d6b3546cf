// Golden scenarios for the parameter-server policies, each timeline worked out by hand.
#include <gtest/gtest.h>

#include "quicksilver/sim/simulator.h"
#include "test_profiles.h"

namespace qs {
namespace {

using testing::layer;
using testing::mercury_fig2;
using testing::one_to_one;

// One layer of `bytes` (one tensor), bp and fp 1 us each.
Profile one_layer(Bytes bytes) {
  Profile p;
  p.name = "one";
  p.batch_size = 1;
  p.layers = {layer("l1", 1000, 1000, bytes)};
  return p;
}

TimeNs iteration(const Profile& p, const std::string& policy, const PolicyOptions& o,
                 const ClusterConfig& c) {
  return testing::steady_iteration(p, policy, o, c);
}

// Fig. 2(a), WFBP (times in us): bp3 [0,3] bp2 [3,6] bp1 [6,9];
// push3 [3,7] pull3 [7,11]; push2 [7,15] pull2 [15,23]; push1 [15,17], its pull waits for
// the server's link: [23,25]; fp1 [25,27] fp2 [27,29] fp3 [29,31].
TEST(MercuryFig2, WfbpTimeline) {
  EXPECT_EQ(iteration(mercury_fig2(), "wfbp", {}, one_to_one()), 31'000);
}

// TicTac orders whole tensors by priority but cannot preempt: here the order is the same
// as WFBP's (TS2 is queued before TS1 is ready), so the timeline is too.
TEST(MercuryFig2, TictacTimeline) {
  EXPECT_EQ(iteration(mercury_fig2(), "tictac", {}, one_to_one()), 31'000);
}

// Fig. 2(c), Mercury with 500-byte packets (0.5 us each):
// push3 [3,6] (3000 B), preempted by push2 [6,9] (3000 B), preempted by push1 [9,11],
// push2 resumes [11,16], push3 finishes [16,17]. Every packet is pulled as soon as it
// arrives, one packet behind: pull1 ends 11.5, pull2 16.5, pull3 17.5.
// fp1 [11.5,13.5] fp2 [16.5,18.5] fp3 [18.5,20.5].
TEST(MercuryFig2, MercuryTimeline) {
  PolicyOptions o;
  o.packet_size = 500;
  EXPECT_EQ(iteration(mercury_fig2(), "mercury", o, one_to_one()), 20'500);
}

// The paper's model (Algorithm 1 with infinitely small packets) gives 20 us; the
// simulator approaches it as packets shrink (one packet of pull pipeline delay).
TEST(MercuryFig2, MercuryConvergesToThePaperModel) {
  PolicyOptions o;
  o.packet_size = 40;
  EXPECT_EQ(iteration(mercury_fig2(), "mercury", o, one_to_one()), 20'040);
}

// Without preemption the packets go FIFO: push3 [3,7] push2 [7,15] push1 [15,17];
// pulls pipelined: pull1 ends 17.5; fp1 [17.5,19.5] fp2 [19.5,21.5] fp3 [21.5,23.5].
TEST(MercuryFig2, MercuryWithoutPreemption) {
  PolicyOptions o;
  o.packet_size = 500;
  EXPECT_EQ(iteration(mercury_fig2(), "mercury-nopreempt", o, one_to_one()), 23'500);
}

// The Mercury paper's eq. 6-7 for WFBP (issue 14 defect 4): pushes as above, but each
// pull takes its own time from the end of its push, overlapping the others:
// pull3 [7,11], pull2 [15,23], pull1 [17,19] (no wait for pull2);
// fp1 [19,21] fp2 [23,25] fp3 [25,27].
TEST(MercuryFig2, WfbpWithTheOverlappingPullsOfEq7) {
  ClusterConfig c = one_to_one();
  c.overlapping_pulls = true;
  EXPECT_EQ(iteration(mercury_fig2(), "wfbp", {}, c), 27'000);
  // Mercury's packets are pulled as they arrive anyway: eq. 7 changes nothing for it
  // beyond the one-packet pipeline delay.
  PolicyOptions o;
  o.packet_size = 500;
  EXPECT_EQ(iteration(mercury_fig2(), "mercury", o, c), 20'500);
}

// LinkSharing::kFair: the messages a host has in flight to different peers share its
// links, as TCP connections do. One worker, two servers, an 8000-byte tensor split in two
// 4000-byte slices, 1 byte/ns, bp and fp 1 us each.
// kFifo: push0 [1,5] push1 [5,9]; pull0 [5,9] on the worker's downlink, pull1 [9,13];
// fp [13,14]. kFair: both pushes share the worker's uplink, [1,9] at half the rate each;
// both servers' pulls then share the worker's downlink, [9,17]; fp [17,18].
TEST(LinkSharing, TwoServersShareAWorkersLinks) {
  const Profile p = one_layer(8000);
  PolicyOptions o;
  o.split_threshold = 1000;
  ClusterConfig c = one_to_one();
  c.servers = 2;
  EXPECT_EQ(iteration(p, "wfbp", o, c), 14'000);
  c.link_sharing = LinkSharing::kFair;
  EXPECT_EQ(iteration(p, "wfbp", o, c), 18'000);
}

// One server sending to two workers at once (kFair): each pull gets half the server's
// uplink and both end together. Two workers push 4000 bytes each to one server, which
// sums at 9 us either way; kFifo pulls to worker 0 [9,13] then worker 1 [13,17], kFair to
// both [9,17].
TEST(LinkSharing, OneServerSharesItsUplinkBetweenTwoWorkers) {
  const Profile p = one_layer(4000);
  ClusterConfig c = one_to_one();
  c.workers = 2;
  SimOptions so;
  so.iterations = 1;
  so.record_trace = true;
  auto pulls = [&]() {
    std::vector<std::pair<TimeNs, TimeNs>> out(2, {-1, -1});
    auto r = simulate(p, "wfbp", {}, c, so);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) return out;
    for (const TraceSpan& t : r->trace) {
      if (t.track == 2 && t.host < 2) out[static_cast<std::size_t>(t.host)] = {t.start, t.end};
    }
    return out;
  };
  using Span = std::pair<TimeNs, TimeNs>;
  EXPECT_EQ(pulls(), (std::vector<Span>{{9'000, 13'000}, {13'000, 17'000}}));
  c.link_sharing = LinkSharing::kFair;
  EXPECT_EQ(pulls(), (std::vector<Span>{{9'000, 17'000}, {9'000, 17'000}}));
}

// kFair changes nothing for Mercury: its packets leave one at a time in priority order
// (PsPolicy::packet_level), the timelines of MercuryFig2 above.
TEST(LinkSharing, MercurysPacketsStayOneAtATime) {
  PolicyOptions o;
  o.packet_size = 500;
  ClusterConfig c = one_to_one();
  c.link_sharing = LinkSharing::kFair;
  EXPECT_EQ(iteration(mercury_fig2(), "mercury", o, c), 20'500);
  EXPECT_EQ(iteration(mercury_fig2(), "mercury-nopreempt", o, c), 23'500);
}

// kFair changes nothing for a stop-and-wait policy either (PsPolicy::stop_and_wait): the
// runtime's p3 has one short slice per worker in flight, written whole and queued whole
// by the links, so two workers pushing to one server fall out of step and then pipeline
// over the servers. Two workers, two servers, an 8000-byte tensor split in two 4000-byte
// slices, p3 slices of 2000 bytes sent a, b, c, d alternately to servers 0 and 1.
// Per message: worker 0's a [1,3] (server 0), b [3,5], c [5,7], d [7,9]; worker 1's a
// queues behind it on server 0's downlink [3,5], then b [5,7], c [7,9], d [9,11]. Sums at
// 5, 7, 9, 11; each server pulls to worker 0 then worker 1: worker 0's downlink
// [5,7] [7,9] [9,11] [11,13], worker 1's [7,9] ... [13,15]; fp [15,16]. Sharing instead
// would keep both workers on one server at half its downlink: pushes end at 17.
TEST(LinkSharing, StopAndWaitSlicesStayWhole) {
  const Profile p = one_layer(8000);
  PolicyOptions o;
  o.split_threshold = 1000;
  o.slice_size = 2000;
  o.startup_time = 0;
  ClusterConfig c = one_to_one();
  c.workers = 2;
  c.servers = 2;
  SimOptions so;
  so.iterations = 1;
  auto first = [&]() {
    auto r = simulate(p, "p3", o, c, so);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->iteration_time : -1;
  };
  EXPECT_EQ(first(), 16'000);
  c.link_sharing = LinkSharing::kFair;
  EXPECT_EQ(first(), 16'000);
}

// Which policies keep one unit in flight: p3, and bytescheduler with a credit of one
// partition (Mercury III-A: the credit scheme then degenerates to stop-and-wait).
TEST(LinkSharing, StopAndWaitPolicies) {
  Profile p = mercury_fig2();
  TensorLayout layout(p);
  Placement placement(layout, 1);
  PsContext ctx{&p, &layout, &placement, 1, 1};
  auto stop_and_wait = [&](const std::string& name, const PolicyOptions& o) {
    auto policy = make_ps_policy(name, o, ctx);
    EXPECT_TRUE(policy.is_ok()) << policy.status().to_string();
    return policy.is_ok() && (*policy)->stop_and_wait();
  };
  PolicyOptions o;
  EXPECT_TRUE(stop_and_wait("p3", o));
  EXPECT_FALSE(stop_and_wait("bytescheduler", o));
  EXPECT_FALSE(stop_and_wait("wfbp", o));
  EXPECT_FALSE(stop_and_wait("mercury", o));
  o.credit_size = o.partition_size;
  EXPECT_TRUE(stop_and_wait("bytescheduler", o));
}

// The paper's PS Ready Queue is a plain queue (IV-C); ours is served by priority unless
// mercury_server_fifo. It matters when sums complete faster than the server's link sends
// them: a worker twice as slow completes each sum as its copy arrives, and the server
// then owes two pulls per arriving packet. Behind that backlog, the urgent layer 1 waits
// under FIFO and overtakes under priority.
TEST(MercuryServer, PriorityReadyQueueLetsUrgentSumsOvertake) {
  ClusterConfig c = one_to_one();
  c.workers = 2;
  c.compute_factor = {1.0, 2.0};
  PolicyOptions o;
  o.packet_size = 500;
  SimOptions so;
  so.iterations = 6;
  so.verify_bytes = true;
  auto priority = simulate(mercury_fig2(), "mercury", o, c, so);
  o.mercury_server_fifo = true;
  auto fifo = simulate(mercury_fig2(), "mercury", o, c, so);
  ASSERT_TRUE(priority.is_ok() && fifo.is_ok());
  EXPECT_GT(fifo->iteration_time, priority->iteration_time);
}

// Per-frame cost (issue 14 defect 6). One 8000-byte layer in 1000-byte packets, 1 us of
// backward and forward, 1 byte/ns. Free frames: push [1,9] us, the last pull one packet
// later, 10; forward [10,11]. With a 24-byte header every frame takes 1024 ns on each
// link: pushes end at 1 + 8.192, the last pull 1.024 later, forward to 11.216 us. With
// 2 us of CPU per frame as well, every frame holds each link 3.024 us: pushes end at
// 1 + 24.192, the last pull 3.024 later, forward to 29.216 us.
TEST(FrameCost, HeaderBytesAndCpuPerFrame) {
  const Profile p = one_layer(8000);
  PolicyOptions o;
  o.packet_size = 1000;
  ClusterConfig c = one_to_one();
  EXPECT_EQ(iteration(p, "mercury", o, c), 11'000);
  c.frame_header = 24;
  EXPECT_EQ(iteration(p, "mercury", o, c), 11'216);
  c.frame_cpu = 2000;
  EXPECT_EQ(iteration(p, "mercury", o, c), 29'216);
  // One frame per tensor (wfbp) pays the header and the CPU once: push [1,11.024], pull
  // [11.024,21.048], forward to 22.048 us.
  EXPECT_EQ(iteration(p, "wfbp", o, c), 22'048);
}

// The packet-size trade-off of Mercury's Fig. 17: with free frames the smallest packet is
// never slower (finer preemption, shorter pull pipeline); with a per-frame cost, 4 KiB
// packets lose to 32 KiB ones on a communication-bound job, and 4 MiB packets lose too.
TEST(FrameCost, SmallPacketsPayForTheirFrames) {
  Profile p;
  p.name = "three";
  p.batch_size = 1;
  p.layers = {layer("l1", 200'000, 200'000, 4 * kMiB), layer("l2", 200'000, 200'000, 16 * kMiB),
              layer("l3", 200'000, 200'000, 8 * kMiB)};
  ClusterConfig c = one_to_one();
  c.bandwidth = Rate::gbps(10);
  auto at = [&](Bytes packet) {
    PolicyOptions o;
    o.packet_size = packet;
    return iteration(p, "mercury", o, c);
  };
  EXPECT_LE(at(4 * kKiB), at(32 * kKiB));
  c.frame_header = 24;
  c.frame_cpu = 1000;
  EXPECT_GT(at(4 * kKiB), at(32 * kKiB));
  EXPECT_GT(at(4 * kMiB), at(32 * kKiB));
}

// Oracle (eq. 9): 3 x (3 + 2) us.
TEST(MercuryFig2, Oracle) {
  EXPECT_EQ(iteration(mercury_fig2(), "oracle", {}, one_to_one()), 15'000);
}

// P3 stop-and-wait, 1000-byte slices, 1 us startup, no latency (us): ready at 1;
// slice1 enters the library at 2, sent [2,3], acked at 3; slice2 enters 4, [4,5];
// slice3 enters 6, [6,7]; its pull [7,8]; forward [8,9].
TEST(CreditSchedulers, P3StopAndWait) {
  PolicyOptions o;
  o.slice_size = 1000;
  o.startup_time = 1000;
  EXPECT_EQ(iteration(one_layer(3000), "p3", o, one_to_one()), 9'000);
}

// The same with every link a token bucket (ClusterConfig::link_burst), as the emulated
// cluster's tbf shapers are. A bucket of a whole slice refills during each 1 us startup,
// so every slice and the pull leave at once: slices enter at 2, 3, 4, the pull arrives at
// 4, forward [4,5]. Half a slice: each frame sends 500 bytes at once and 500 at the rate
// on both links: slice1 [2,2.5], slice2 [3.5,4], slice3 [5,5.5], the pull [5.5,6],
// forward [6,7]. The bucket starts full and never holds more than its depth.
TEST(CreditSchedulers, P3SlicesLeaveAtOnceFromAFullBucket) {
  PolicyOptions o;
  o.slice_size = 1000;
  o.startup_time = 1000;
  ClusterConfig c = one_to_one();
  c.link_burst = 1000;
  EXPECT_EQ(iteration(one_layer(3000), "p3", o, c), 5'000);
  c.link_burst = 500;
  EXPECT_EQ(iteration(one_layer(3000), "p3", o, c), 7'000);
  c.link_burst = 0;
  EXPECT_EQ(iteration(one_layer(3000), "p3", o, c), 9'000);
}

// Issue 14 point 7: with ack_queue an acknowledgement waits behind the pull in flight on
// the server's link and what the worker's downlink still carries, up to the cap. Two
// workers, two servers, an 8000-byte tensor split over both, 1000-byte slices at
// 1 byte/ns: when a slice arrives, its server is still sending the previous sum, so under
// stop-and-wait each acknowledgement's wait delays the next slice; p3 slows down, by at
// most the cap per slice; a cap of 0 changes nothing.
TEST(CreditSchedulers, AcknowledgementsQueueBehindPulls) {
  const Profile p = one_layer(8000);
  PolicyOptions o;
  o.slice_size = 1000;
  o.startup_time = 0;
  o.split_threshold = 1000;
  ClusterConfig c = one_to_one();
  c.workers = 2;
  c.servers = 2;
  SimOptions so;
  so.iterations = 4;
  so.verify_bytes = true;
  auto run = [&]() {
    auto r = simulate(p, "p3", o, c, so);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->iteration_time : -1;
  };
  const TimeNs plain = run();
  c.ack_queue = 0;
  EXPECT_EQ(run(), plain);
  c.ack_queue = kNsPerMs;
  const TimeNs queued = run();
  EXPECT_GT(queued, plain);
  EXPECT_LE(queued, plain + 8 * 2'000);  // at most two pulls' time per slice
  c.ack_queue = 200;                     // a cap below the backlog bounds every wait
  const TimeNs capped = run();
  EXPECT_GT(capped, plain);
  EXPECT_LT(capped, queued);
  EXPECT_LE(capped, plain + 8 * 200);
}

TEST(CreditSchedulers, P3PaysTheAcknowledgementDelay) {
  PolicyOptions o;
  o.slice_size = 1000;
  o.startup_time = 1000;
  EXPECT_EQ(iteration(one_layer(3000), "p3", o, one_to_one(100)), 9'600);
}

// ByteScheduler, 1000-byte partitions, credit 2000: partitions 1 and 2 start up together
// ([1,2]) and go back to back [2,3] [3,4]; partition 3 is issued at the first ack (3),
// enters at 4, sent [4,5], pulled [5,6]; forward [6,7].
TEST(CreditSchedulers, ByteSchedulerCreditOverlapsStartup) {
  PolicyOptions o;
  o.partition_size = 1000;
  o.credit_size = 2000;
  o.startup_time = 1000;
  EXPECT_EQ(iteration(one_layer(3000), "bytescheduler", o, one_to_one()), 7'000);
}

TEST(PsPolicies, AllReduceOnlyPolicyIsAClearError) {
  auto r = simulate(mercury_fig2(), "mgwfbp", {}, one_to_one(), {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("all-reduce"), std::string::npos);
}

TEST(PsPolicies, UnknownPolicyListsTheKnownOnes) {
  auto r = simulate(mercury_fig2(), "fastest", {}, one_to_one(), {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("mercury"), std::string::npos);
}

TEST(PsPolicies, ZeroPacketSizeIsRejected) {
  PolicyOptions o;
  o.packet_size = 0;
  auto r = simulate(mercury_fig2(), "mercury", o, one_to_one(), {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--packet-size"), std::string::npos);
}

}  // namespace
}  // namespace qs
