// NetnsCluster: an emulated multi-host cluster on one machine (DESIGN.md "Emulated
// cluster"). One network namespace per host, each joined by a veth pair to one bridge,
// with a tbf rate limit on both directions of every host's link (the namespace side
// shapes its uplink, the bridge side its downlink). Requires root and iproute2.
//
// Everything is torn down by the destructor, on every path; a process killed outright
// leaves names tagged with its pid (the default tag), which cleanup_stale() removes on the
// next cluster's creation, or `quicksilver cleanup` at once. Names of a launcher still
// running are never touched.
// Addresses are 10.213.0.0/16, private to the namespaces this object creates.
//
// Thread safety: not thread-safe; one owner (the launcher).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::runtime {

class TbfLink;

// What NetnsCluster::cleanup_stale did (or would do, dry run): one line per thing.
struct StaleCleanup {
  std::vector<std::string> removed;  // "namespace qs123h0 (launcher 123 is gone)", ...
  std::vector<std::string> errors;   // what could not be removed, and why
  std::vector<std::string> live;     // left alone: clusters whose launcher still runs
};

// How the emulated links queue, retransmit and acknowledge: what a launch (run_cluster,
// run_script) takes from its flags and gives every host. Part of NetnsOptions.
struct LinkShaping {
  // The minimum retransmission timeout of every host's route (the route metric rto_min,
  // as datacenters configure it; Linux's own floor is 200 ms). 0: the kernel's default.
  // A lost tail segment of a burst (incast at a shaper's queue) waits at least this long,
  // so on a link whose round trip is well under a millisecond the default turns one loss
  // into a 200 ms stall.
  TimeNs rto_min = 0;
  // Every host's route with the quickack metric: acknowledge every segment at once
  // instead of delaying acknowledgements (up to 40-200 ms). A locked rto_min also caps the
  // delayed-acknowledgement timer, so this tells the two effects apart.
  bool quickack = false;
  // The buffer of each switch port, i.e. of the bridge's side of every host's link (its
  // downlink shaper's queue), as time at the nominal rate. Where several senders answer
  // one host at once (incast), this is what overflows.
  TimeNs switch_buffer = 2 * kNsPerMs;
  // Each host's own queue (its uplink shaper's), as time at the nominal rate: the NIC's
  // queue, which on a real host TCP never overflows (TCP small queues hold each socket to
  // a few packets in it, and the qdisc holds 1000). A packet the sender's own queue drops
  // is one TCP counts as never sent: with nothing else in flight, Linux waits at least
  // 200 ms (its zero-window probe timer, which ignores the route's rto_min) before it sends
  // again. 20 ms, with gso_max below, never dropped a packet in the e2e scenarios
  // (docs/runtime.md, "The 200 ms stall").
  TimeNs host_queue = 20 * kNsPerMs;
  // The largest packet a host's TCP hands its link (the host side veth's gso_max_size;
  // 0: the kernel's 64 KiB). TCP small queues let every socket hold two such packets in
  // the host's queue, so at the emulation's scaled-down rates a 64 KiB packet is a long
  // wait for the packets behind it; smaller ones cost CPU per byte.
  Bytes gso_max = 48 * 1024;

  friend bool operator==(const LinkShaping&, const LinkShaping&) = default;
};

// Checks a launch's shaping, naming the flag: rto_min in 0..60s, the queues as
// check_netns_queues; without network namespaces (`netns` false) nothing but the defaults
// ("--rto-min needs --netns", ...).
Status check_link_shaping(const LinkShaping& shaping, bool netns);

struct NetnsOptions : LinkShaping {
  int hosts = 2;
  Rate rate = Rate::gbps(1);  // each host's NIC, each direction
  // Congestion control the processes will set with TCP_CONGESTION. Outside the root
  // namespace only algorithms on net.ipv4.tcp_allowed_congestion_control may be chosen
  // (MACHINE-NOTES.md): it is added to that list while any cluster lives; the original
  // list is kept in /run/quicksilver-allowed-cc and put back by the last cluster to go, or
  // by the next run's cleanup_stale() after a crash.
  std::string congestion = "cubic";
  // The most hosts that send to one host at once (a PS job: max(workers, servers); an
  // all-reduce job 0: each host hears one peer at a time). Each switch port holds, beyond
  // switch_buffer and its own burst, one shaper burst (68 KiB, a whole GSO packet) from
  // each of them. Bursts are byte counts that do not shrink with the emulation's
  // scaled rate, while the buffer does: 2 ms of a 10 Gbit/s port hold 2.5 MB, 36 such
  // bursts, but 2 ms of the scaled 500 Mbit/s hold 125 KB, under two; without the floor,
  // four workers' bursts to one server overflowed it where a real port would not
  // (docs/runtime.md, "Incast and the scaled buffer"). 0: switch_buffer alone.
  int fan_in = 0;
  // DeFT's second link (its III-C): a second veth per host on a bridge and subnet of its
  // own (10.214.0.0/16), shaped at this rate both ways. 0: none.
  Rate second_rate{0};
  // Name tag; default "qs<pid>". Must be at most 8 characters (interface names are
  // limited to 15).
  std::string tag;
};

// Checks NetnsOptions::switch_buffer and host_queue (100us..1s) and gso_max (0, or
// 1500 B..64 KiB), naming the flag that is wrong.
Status check_netns_queues(TimeNs switch_buffer, TimeNs host_queue, Bytes gso_max);

class NetnsCluster {
 public:
  static Result<std::unique_ptr<NetnsCluster>> create(const NetnsOptions& options);
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int hosts() const { return options_.hosts; }
  std::string namespace_name(int host) const;
  std::string address(int host) const;
  // The host's address on the second link (NetnsOptions::second_rate).
  std::string second_address(int host) const;
  bool has_second_link() const { return options_.second_rate.bits_per_second > 0; }
  // Bytes the host has sent on link 0 or 1 so far (the bridge side's receive counter).
  Result<std::uint64_t> sent_bytes(int host, int link) const;
  // The host's interface inside its namespace (what GLOO_SOCKET_IFNAME names).
  std::string interface_name(int host) const;
  // Packets the host's own queue (uplink) and its switch port (downlink) have dropped
  // since the cluster was built (the shapers' qdisc statistics).
  struct Drops {
    std::uint64_t host_queue = 0, switch_port = 0;
  };
  Result<Drops> drops(int host) const;
  // Changes host's rate limit in both directions (the dynamic scenarios). Through
  // netlink sockets opened when the cluster was built: microseconds per shaper.
  Status set_rate(int host, Rate rate);
  // Changes every host's rate limit in both directions, all 2 x hosts shapers back to back.
  Status set_rate_all(Rate rate);
  // The nominal rate of every link 0 (and the second link's in proportion): rate, burst
  // and queues sized for it, as if the cluster had been built at it (the start-up
  // calibration's candidates).
  Status set_nominal_rate(Rate rate);
  Rate nominal_rate() const { return options_.rate; }
  // Removes everything this cluster made. Idempotent; the destructor calls it.
  Status teardown();

  // Moves the calling process into namespace `name` (setns). For a child between fork
  // and exec.
  static Status enter(const std::string& name);
  // Removes what clusters of launchers that no longer run left (their pid is in every
  // name): processes still inside their namespaces, the namespaces, bridges and veths; and
  // puts net.ipv4.tcp_allowed_congestion_control back from its saved copy once no cluster
  // namespace is left. `dry_run`: only says what it would do. Needs root (else finds
  // nothing it may remove). Serialised with every cluster's build and teardown.
  static StaleCleanup cleanup_stale(bool dry_run = false);
  // Whether this process can build clusters (root, iproute2 present).
  static Status available();

 private:
  explicit NetnsCluster(NetnsOptions options);
  Status build();
  Status teardown_locked();
  static StaleCleanup cleanup_stale_locked(bool dry_run);
  // Installs the shaper of `dev` in namespace `ns` ("" = the launcher's) at the nominal
  // rate, as a host's own queue (`uplink`) or a switch port, and keeps its netlink socket
  // in `into`.
  Status shape(const std::string& ns, const std::string& dev, Rate rate, bool uplink,
               std::vector<std::unique_ptr<TbfLink>>* into);
  Status add_link(int host, const std::string& bridge, const std::string& vh, const std::string& vb,
                  const std::string& address, const std::string& subnet, Rate rate,
                  std::vector<std::unique_ptr<TbfLink>>* shapers);

  NetnsOptions options_;
  std::vector<std::string> namespaces_;                   // created so far, for teardown
  std::vector<std::unique_ptr<TbfLink>> shapers_;         // host h: [2h] uplink, [2h + 1] downlink
  std::vector<std::unique_ptr<TbfLink>> second_shapers_;  // the same on the second link
  bool bridge_made_ = false, second_bridge_made_ = false;
  bool torn_down_ = false;
};

// Runs argv (no shell) and waits; a non-zero exit becomes an error carrying its stderr.
// When `out` is given, the command's stdout is captured into it.
Status run_command(const std::vector<std::string>& argv, std::string* out = nullptr);

// The machine's CPU time so far (/proc/stat, every core): idle (idle + iowait) and total,
// in clock ticks. Differences of two readings give the idle share between them.
struct CpuTicks {
  std::uint64_t idle = 0, total = 0;
};
CpuTicks cpu_ticks();
// The idle share between two readings (-1 when none passed).
double idle_share(const CpuTicks& before, const CpuTicks& after);

// Every link loaded at once: of the hosts from `first_host` on, each sends to the next
// (the last to the first) with iperf3 for `seconds`, so every uplink and every downlink of link 0
// carries one flow, as a job's traffic loads them all together. What one link alone carries says
// little on a machine whose cores emulate all of them (issue 16).
struct ClusterGoodput {
  std::vector<Rate> flows;  // flow h: from host h
  Rate median{0}, min{0};
  double cpu_idle = -1;  // the machine's idle share while the flows ran
};
Result<ClusterGoodput> measure_cluster_goodput(const NetnsCluster& cluster, const std::string& cc,
                                               int first_host = 0, int seconds = 2);

// TCP goodput from host `from` to host `to` of `cluster`, measured with iperf3 for
// `seconds` with congestion control `cc`. Errors when iperf3 is missing or fails.
Result<Rate> measure_goodput(const NetnsCluster& cluster, int from, int to, const std::string& cc,
                             int seconds = 2);

}  // namespace qs::runtime
