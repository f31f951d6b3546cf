#include "quicksilver/runtime/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include "tbf_netlink.h"

namespace qs::runtime {
namespace {

constexpr const char* kAllowedCc = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
// The allowed list as it was before the first cluster changed it. Shared by every
// cluster on the machine: the last one to go (or the next run's cleanup of a crashed one)
// puts the list back.
constexpr const char* kSavedCc = "/run/quicksilver-allowed-cc";
// Held (flock) while a cluster is built, torn down or stale ones are cleaned, so that one
// launcher never restores the allowed list between another's check of it and its first
// namespace. The kernel drops the lock of a process that dies, so it cannot go stale.
constexpr const char* kLockFile = "/run/quicksilver-netns.lock";
// Names of a cluster tagged with its launcher's pid (the default tag "qs<pid>"):
// namespaces qs<pid>h<host>; in the launcher's namespace the bridges qs<pid>br, qs<pid>bs
// and, until moved into a namespace or deleted with it, veths qs<pid>{v,p,w,q}<host>.
const std::regex kClusterNamespace("^qs([0-9]+)h[0-9]+$");
const std::regex kClusterLink("^qs([0-9]+)(br|bs|[vpwq][0-9]+)$");

// flock on kLockFile for the object's life; nothing where the file cannot be opened (not
// root: no cluster can be built either).
class MachineLock {
 public:
  MachineLock() : fd_(open(kLockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0) {
      while (flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~MachineLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  MachineLock(const MachineLock&) = delete;
  MachineLock& operator=(const MachineLock&) = delete;

 private:
  int fd_;
};

// Whether process `pid` exists (or exists and is not ours to signal).
bool pid_alive(const std::string& digits) {
  if (digits.empty() || digits.size() > 9) return true;  // not a pid of ours: never touch it
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  if (pid <= 0) return true;
  return kill(pid, 0) == 0 || errno != ESRCH;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

bool write_file(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value << "\n";
  return static_cast<bool>(out);
}

// The names of the cluster namespaces on this machine (`live_only`: of launchers that
// still run).
std::vector<std::string> cluster_namespaces(bool live_only = false) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/var/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kClusterNamespace)) continue;
    if (!live_only || pid_alive(m[1].str())) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Puts the allowed list back when no cluster namespace is left. Caller holds MachineLock.
// Returns what it did, or "" when there was nothing to do.
std::string restore_allowed_cc_if_unused(bool dry_run, std::string* kept) {
  std::error_code ec;
  if (!std::filesystem::exists(kSavedCc, ec)) return {};
  const std::vector<std::string> live = cluster_namespaces(/*live_only=*/true);
  if (!live.empty()) {
    if (kept)
      *kept = std::string(kAllowedCc) + " (" + std::to_string(live.size()) +
              " cluster namespaces still use it)";
    return {};
  }
  std::ifstream in(kSavedCc);
  std::string original;
  std::getline(in, original);
  if (original.empty()) return {};
  const std::string what = std::string("net.ipv4.tcp_allowed_congestion_control back to '") +
                           original + "' (was '" + read_file(kAllowedCc) + "')";
  if (dry_run) return what;
  if (!write_file(kAllowedCc, original)) return {};
  std::filesystem::remove(kSavedCc, ec);
  return what;
}

std::string bridge_name(const std::string& tag) { return tag + "br"; }
std::string second_bridge_name(const std::string& tag) { return tag + "bs"; }
std::string second_veth_host(const std::string& tag, int h) {
  return tag + "w" + std::to_string(h);
}
std::string second_veth_bridge(const std::string& tag, int h) {
  return tag + "q" + std::to_string(h);
}
std::string veth_host(const std::string& tag, int h) { return tag + "v" + std::to_string(h); }
std::string veth_bridge(const std::string& tag, int h) { return tag + "p" + std::to_string(h); }

// tbf parameters: a burst of about 1 ms of the nominal rate (MACHINE-NOTES: less loses
// rate), at least kMinBurst, and a queue of `queue_time` at the nominal rate
// (NetnsOptions::switch_buffer or host_queue). Both are byte counts fixed by the nominal
// rate, as a switch port's buffer is; a dynamic scenario changes only the rate:
//  * the queue: 2 ms at 1/10 of the rate held 8 packets, and TCP lost whole windows to
//    retransmission timeouts;
//  * the burst: it is also tbf's largest packet. A GSO packet of up to 64 KiB queued
//    under the old burst and larger than a new, smaller one can never be sent, and
//    stalled the link until the rate rose again (every connection through it then hit
//    retransmission timeouts with exponential backoff: iterations of seconds).
// The burst is also tbf's largest packet: a GSO packet larger than it is segmented in
// software by tbf (tbf_segment), one pass over its bytes per packet on the shaping core.
// TCP sizes its GSO packets to about 1 ms of its pacing rate, up to 64 KiB plus headers,
// so a 1 ms burst between about 300 and 600 Mbit/s sits just under them: measured with
// every link of 8 hosts loaded at once, 500 Mbit/s carried 53 % of its rate with the
// machine 1 % idle, while 1 Gbit/s (a 122 KiB burst) carried 95.5 % with 65 % idle
// (issue 16). So the burst is at least a whole GSO packet.
constexpr std::int64_t kMinBurst = 64 * 1024 + 4 * 1024;

TbfParams tbf_params(Rate rate, Rate nominal, TimeNs queue_time, int bursts = 1) {
  const std::int64_t burst = std::max<std::int64_t>(kMinBurst, nominal.bits_per_second / 8 / 1000);
  const auto queue = static_cast<std::int64_t>(static_cast<double>(nominal.bits_per_second) / 8 *
                                               static_cast<double>(queue_time) / kNsPerSec);
  return TbfParams{rate, burst, std::max<std::int64_t>(32 * 1024, queue) + burst * bursts};
}

// A host's own queue (its uplink shaper), and its switch port (downlink): the port also
// holds a burst from each of the fan_in hosts that may send to it at once.
TbfParams uplink_params(const NetnsOptions& o, Rate rate, Rate nominal) {
  return tbf_params(rate, nominal, o.host_queue);
}
TbfParams downlink_params(const NetnsOptions& o, Rate rate, Rate nominal) {
  return tbf_params(rate, nominal, o.switch_buffer, 1 + o.fan_in);
}

}  // namespace

namespace {

// A child started by start_command: its stderr (a pipe) and, when captured, its stdout
// (a temporary file: no second pipe to drain concurrently).
struct Child {
  pid_t pid = -1;
  int err_fd = -1;
  FILE* out_file = nullptr;
  std::vector<std::string> argv;
};

Result<Child> start_command(const std::vector<std::string>& argv, bool capture) {
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0)
    return io_error(std::string("pipe: ") + std::strerror(errno));
  FILE* out_file = capture ? std::tmpfile() : nullptr;
  pid_t pid = fork();
  if (pid < 0) {
    close(err_pipe[0]);
    close(err_pipe[1]);
    if (out_file) std::fclose(out_file);
    return io_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    dup2(err_pipe[1], 2);
    int devnull = open("/dev/null", O_WRONLY);
    if (out_file) {
      dup2(fileno(out_file), 1);
    } else if (devnull >= 0) {
      dup2(devnull, 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    dprintf(2, "cannot run %s: %s", args[0], std::strerror(errno));
    _exit(127);
  }
  close(err_pipe[1]);
  return Child{pid, err_pipe[0], out_file, argv};
}

// Waits for `c`; a non-zero exit becomes an error carrying its stderr.
Status finish_command(Child& c, std::string* out) {
  std::string err;
  char buf[512];
  for (ssize_t n; (n = read(c.err_fd, buf, sizeof buf)) > 0;)
    err.append(buf, static_cast<std::size_t>(n));
  close(c.err_fd);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (c.out_file) {
    std::rewind(c.out_file);
    if (out) out->clear();
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, c.out_file)) > 0;) {
      if (out) out->append(buf, n);
    }
    std::fclose(c.out_file);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok();
  std::string cmd;
  for (const auto& a : c.argv) cmd += (cmd.empty() ? "" : " ") + a;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  return io_error("'" + cmd + "' failed: " +
                  (err.empty() ? "exit status " + std::to_string(WEXITSTATUS(status)) : err));
}

}  // namespace

Status run_command(const std::vector<std::string>& argv, std::string* out) {
  auto c = start_command(argv, out != nullptr);
  if (!c) return c.status();
  return finish_command(*c, out);
}

Status NetnsCluster::available() {
  if (geteuid() != 0) return unavailable("network namespaces need root");
  Status s = run_command({"ip", "-V"});
  if (!s.is_ok()) return unavailable("iproute2 ('ip') is not installed: " + s.message());
  s = run_command({"tc", "-V"});
  if (!s.is_ok()) return unavailable("iproute2's 'tc' is not installed: " + s.message());
  return Status::ok();
}

Result<std::unique_ptr<NetnsCluster>> NetnsCluster::create(const NetnsOptions& options) {
  QS_RETURN_IF_ERROR(available());
  if (options.hosts < 1 || options.hosts > 250)
    return invalid_argument("netns cluster: hosts must be in 1..250");
  if (options.rate.bits_per_second < 1000) return invalid_argument("netns cluster: rate too small");
  NetnsOptions o = options;
  if (o.tag.empty()) o.tag = "qs" + std::to_string(getpid());
  if (o.tag.size() > 9)
    return invalid_argument("netns cluster: tag '" + o.tag + "' longer than 9 characters");
  MachineLock lock;
  (void)cleanup_stale_locked(false);  // what dead launchers left; a live one's is never touched
  std::unique_ptr<NetnsCluster> c(new NetnsCluster(std::move(o)));
  Status s = c->build();
  if (!s.is_ok()) {
    (void)c->teardown_locked();  // best effort; the build error is the one to report
    return s.with_context("building the emulated cluster");
  }
  return c;
}

std::string NetnsCluster::namespace_name(int host) const {
  return options_.tag + "h" + std::to_string(host);
}

std::string NetnsCluster::interface_name(int host) const { return veth_host(options_.tag, host); }

std::string NetnsCluster::address(int host) const {
  return "10.213." + std::to_string(host / 250) + "." + std::to_string(host % 250 + 1);
}

std::string NetnsCluster::second_address(int host) const {
  return "10.214." + std::to_string(host / 250) + "." + std::to_string(host % 250 + 1);
}

Result<std::uint64_t> NetnsCluster::sent_bytes(int host, int link) const {
  const std::string dev =
      link == 0 ? veth_bridge(options_.tag, host) : second_veth_bridge(options_.tag, host);
  std::ifstream in("/sys/class/net/" + dev + "/statistics/rx_bytes");
  std::uint64_t v = 0;
  if (!(in >> v)) return io_error("cannot read the byte counter of " + dev);
  return v;
}

Status NetnsCluster::shape(const std::string& ns, const std::string& dev, Rate rate, bool uplink,
                           std::vector<std::unique_ptr<TbfLink>>* into) {
  auto link = TbfLink::open(ns, dev);
  if (!link.is_ok()) return link.status();
  const TbfParams p =
      uplink ? uplink_params(options_, rate, rate) : downlink_params(options_, rate, rate);
  QS_RETURN_IF_ERROR(link->set(p, true));
  into->push_back(std::make_unique<TbfLink>(std::move(*link)));
  return Status::ok();
}

// One host's link: a veth pair from its namespace to `bridge`, `address` on it, the
// route metrics, a shaper on each side.
Status NetnsCluster::add_link(int h, const std::string& bridge, const std::string& vh,
                              const std::string& vb, const std::string& address,
                              const std::string& subnet, Rate rate,
                              std::vector<std::unique_ptr<TbfLink>>* shapers) {
  const std::string ns = namespace_name(h);
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "add", vh, "type", "veth", "peer", "name", vb}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vh, "netns", ns}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vb, "master", bridge}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vb, "up"}));
  QS_RETURN_IF_ERROR(run_command({"ip", "-n", ns, "addr", "add", address + "/16", "dev", vh}));
  QS_RETURN_IF_ERROR(run_command({"ip", "-n", ns, "link", "set", vh, "up"}));
  if (options_.gso_max > 0) {
    QS_RETURN_IF_ERROR(run_command(
        {"ip", "-n", ns, "link", "set", vh, "gso_max_size", std::to_string(options_.gso_max)}));
  }
  if (options_.rto_min > 0 || options_.quickack) {
    // The connected route again, with the metrics (ip prints and takes rto_min in ms).
    std::vector<std::string> argv = {"ip", "-n",    ns,       "route", "replace", subnet, "dev",
                                     vh,   "proto", "kernel", "scope", "link",    "src",  address};
    if (options_.rto_min > 0) {
      argv.push_back("rto_min");
      argv.push_back(
          std::to_string(std::max<TimeNs>(1, (options_.rto_min + kNsPerMs - 1) / kNsPerMs)) + "ms");
    }
    if (options_.quickack) {
      argv.push_back("quickack");
      argv.push_back("1");
    }
    QS_RETURN_IF_ERROR(run_command(argv));
  }
  QS_RETURN_IF_ERROR(shape(ns, vh, rate, true, shapers));  // uplink: [2h]
  return shape("", vb, rate, false, shapers);              // downlink: [2h + 1]
}

Status NetnsCluster::build() {
  const std::string& tag = options_.tag;
  if (!options_.congestion.empty()) {
    const std::string allowed = read_file(kAllowedCc);
    std::istringstream words(allowed);
    bool present = false;
    for (std::string w; words >> w;) present |= w == options_.congestion;
    if (!present) {
      std::error_code ec;
      if (!std::filesystem::exists(kSavedCc, ec) && !write_file(kSavedCc, allowed)) {
        return io_error(std::string("cannot save ") + kAllowedCc + " to " + kSavedCc);
      }
      if (!write_file(kAllowedCc, allowed + " " + options_.congestion)) {
        return io_error(std::string("cannot add ") + options_.congestion + " to " + kAllowedCc);
      }
    }
  }
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "add", bridge_name(tag), "type", "bridge"}));
  bridge_made_ = true;
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", bridge_name(tag), "up"}));
  for (int h = 0; h < options_.hosts; ++h) {
    const std::string ns = namespace_name(h);
    QS_RETURN_IF_ERROR(run_command({"ip", "netns", "add", ns}));
    namespaces_.push_back(ns);
    QS_RETURN_IF_ERROR(run_command({"ip", "-n", ns, "link", "set", "lo", "up"}));
    QS_RETURN_IF_ERROR(add_link(h, bridge_name(tag), veth_host(tag, h), veth_bridge(tag, h),
                                address(h), "10.213.0.0/16", options_.rate, &shapers_));
    if (has_second_link()) {
      if (!second_bridge_made_) {
        QS_RETURN_IF_ERROR(
            run_command({"ip", "link", "add", second_bridge_name(tag), "type", "bridge"}));
        second_bridge_made_ = true;
        QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", second_bridge_name(tag), "up"}));
      }
      QS_RETURN_IF_ERROR(add_link(h, second_bridge_name(tag), second_veth_host(tag, h),
                                  second_veth_bridge(tag, h), second_address(h), "10.214.0.0/16",
                                  options_.second_rate, &second_shapers_));
    }
  }
  return Status::ok();
}

Status NetnsCluster::set_rate(int host, Rate rate) {
  if (host < 0 || host >= options_.hosts)
    return invalid_argument("no host " + std::to_string(host));
  QS_RETURN_IF_ERROR(shapers_[2 * static_cast<std::size_t>(host)]->set(
      uplink_params(options_, rate, options_.rate), false));
  return shapers_[2 * static_cast<std::size_t>(host) + 1]->set(
      downlink_params(options_, rate, options_.rate), false);
}

Status check_netns_queues(TimeNs switch_buffer, TimeNs host_queue, Bytes gso_max) {
  if (switch_buffer < 100 * kNsPerUs || switch_buffer > kNsPerSec) {
    return invalid_argument("--switch-buffer must be in 100us..1s");
  }
  if (host_queue < 100 * kNsPerUs || host_queue > kNsPerSec) {
    return invalid_argument("--host-queue must be in 100us..1s");
  }
  if (gso_max != 0 && (gso_max < 1500 || gso_max > 64 * 1024)) {
    return invalid_argument("--host-gso must be in 1500B..64KiB");
  }
  return Status::ok();
}

Status check_link_shaping(const LinkShaping& s, bool netns) {
  if (s.rto_min < 0 || s.rto_min > 60 * kNsPerSec)
    return invalid_argument("--rto-min must be in 0..60s");
  QS_RETURN_IF_ERROR(check_netns_queues(s.switch_buffer, s.host_queue, s.gso_max));
  if (netns) return Status::ok();
  if (s.rto_min > 0) {
    return invalid_argument(
        "--rto-min needs --netns (the routes of the machine itself are not changed)");
  }
  if (s.quickack) {
    return invalid_argument(
        "--quickack needs --netns (the routes of the machine itself are not changed)");
  }
  const LinkShaping defaults;
  if (s.switch_buffer != defaults.switch_buffer || s.host_queue != defaults.host_queue ||
      s.gso_max != defaults.gso_max) {
    return invalid_argument(
        "--switch-buffer, --host-queue and --host-gso need --netns (loopback has no switch)");
  }
  return Status::ok();
}

Result<NetnsCluster::Drops> NetnsCluster::drops(int host) const {
  if (host < 0 || host >= options_.hosts)
    return invalid_argument("no host " + std::to_string(host));
  if (shapers_.size() < 2 * static_cast<std::size_t>(host + 1))
    return unavailable("the cluster is torn down");
  Drops d;
  QS_ASSIGN_OR_RETURN(d.host_queue, shapers_[2 * static_cast<std::size_t>(host)]->drops());
  QS_ASSIGN_OR_RETURN(d.switch_port, shapers_[2 * static_cast<std::size_t>(host) + 1]->drops());
  return d;
}

Status NetnsCluster::set_rate_all(Rate rate) {
  const TbfParams up = uplink_params(options_, rate, options_.rate);
  const TbfParams down = downlink_params(options_, rate, options_.rate);
  Status first;
  for (std::size_t i = 0; i < shapers_.size();
       ++i) {  // on, even past a failure: the others should still follow
    Status st = shapers_[i]->set(i % 2 == 0 ? up : down, false);
    if (!st.is_ok() && first.is_ok()) first = st;
  }
  return first;
}

Status NetnsCluster::teardown() {
  if (torn_down_) return Status::ok();
  MachineLock lock;
  return teardown_locked();
}

Status NetnsCluster::teardown_locked() {
  if (torn_down_) return Status::ok();
  torn_down_ = true;
  shapers_.clear();  // their sockets pin the namespaces
  second_shapers_.clear();
  Status first;
  // Each veth pair first, from the bridge's end (one deletion takes both ends, at once):
  // left to the namespace's deletion, the kernel removes them a moment after `ip netns
  // del` returns, and a check (or the next cluster) would still see them.
  for (std::size_t h = 0; h < namespaces_.size(); ++h) {
    (void)run_command({"ip", "link", "del", veth_bridge(options_.tag, static_cast<int>(h))});
    if (second_bridge_made_) {
      (void)run_command(
          {"ip", "link", "del", second_veth_bridge(options_.tag, static_cast<int>(h))});
    }
  }
  for (const std::string& ns : namespaces_) {
    Status s = run_command({"ip", "netns", "del", ns});
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  namespaces_.clear();
  if (bridge_made_) {
    Status s = run_command({"ip", "link", "del", bridge_name(options_.tag)});
    if (!s.is_ok() && first.is_ok()) first = s;
    bridge_made_ = false;
  }
  if (second_bridge_made_) {
    Status s = run_command({"ip", "link", "del", second_bridge_name(options_.tag)});
    if (!s.is_ok() && first.is_ok()) first = s;
    second_bridge_made_ = false;
  }
  (void)restore_allowed_cc_if_unused(false,
                                     nullptr);  // unless another live cluster still relies on it
  return first;
}

NetnsCluster::NetnsCluster(NetnsOptions options) : options_(std::move(options)) {}

NetnsCluster::~NetnsCluster() {
  (void)teardown();
}  // errors were reported by an explicit teardown()

Status NetnsCluster::enter(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open " + path + ": " + std::strerror(errno));
  int rc = setns(fd, CLONE_NEWNET);
  int e = errno;
  close(fd);
  if (rc != 0) return io_error("setns(" + name + "): " + std::strerror(e));
  return Status::ok();
}

Status NetnsCluster::set_nominal_rate(Rate rate) {
  if (rate.bits_per_second < 1000) return invalid_argument("netns cluster: rate too small");
  if (has_second_link()) {
    options_.second_rate.bits_per_second = std::max<std::int64_t>(
        1000, std::llround(static_cast<double>(options_.second_rate.bits_per_second) *
                           static_cast<double>(rate.bits_per_second) /
                           static_cast<double>(options_.rate.bits_per_second)));
    const TbfParams up = uplink_params(options_, options_.second_rate, options_.second_rate);
    const TbfParams down = downlink_params(options_, options_.second_rate, options_.second_rate);
    for (std::size_t i = 0; i < second_shapers_.size(); ++i) {
      QS_RETURN_IF_ERROR(second_shapers_[i]->set(i % 2 == 0 ? up : down, false));
    }
  }
  options_.rate = rate;
  return set_rate_all(rate);
}

CpuTicks cpu_ticks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  CpuTicks t;
  if (!(in >> cpu) || cpu != "cpu") return t;
  std::uint64_t v[8] = {};
  for (int i = 0; i < 8 && (in >> v[i]); ++i) t.total += v[i];
  t.idle = v[3] + v[4];
  return t;
}

double idle_share(const CpuTicks& before, const CpuTicks& after) {
  if (after.total <= before.total) return -1;
  return static_cast<double>(after.idle - before.idle) /
         static_cast<double>(after.total - before.total);
}

namespace {

constexpr const char* kIperfPort = "7199";

// The bits per second iperf3's JSON says the receiver got.
Result<Rate> received_rate(const std::string& json) {
  const std::string key = "\"sum_received\"";
  auto at = json.find(key);
  if (at != std::string::npos) at = json.find("\"bits_per_second\"", at);
  if (at == std::string::npos) return io_error("iperf3 printed no sum_received.bits_per_second");
  const double bps = std::strtod(json.c_str() + json.find(':', at) + 1, nullptr);
  if (!(bps > 0)) return io_error("iperf3 measured no throughput");
  return Rate{static_cast<std::int64_t>(bps)};
}

// Starts a one-test iperf3 server on `host` (it daemonises and exits after the test) and
// waits until it listens: a client that connected first would be refused.
Status start_iperf_server(const NetnsCluster& cluster, int host) {
  QS_RETURN_IF_ERROR(
      run_command({"ip", "netns", "exec", cluster.namespace_name(host), "iperf3", "-s", "-1", "-D",
                   "-B", cluster.address(host), "-p", kIperfPort}));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string listening;
    QS_RETURN_IF_ERROR(run_command({"ip", "netns", "exec", cluster.namespace_name(host), "ss",
                                    "-Hltn", "sport", "=", ":" + std::string(kIperfPort)},
                                   &listening));
    if (listening.find(kIperfPort) != std::string::npos) return Status::ok();
    usleep(20'000);
  }
  return unavailable("iperf3 on host " + std::to_string(host) + " did not listen within 2s");
}

}  // namespace

Result<ClusterGoodput> measure_cluster_goodput(const NetnsCluster& cluster, const std::string& cc,
                                               int first_host, int seconds) {
  const int hosts = cluster.hosts();
  if (first_host < 0 || hosts - first_host < 2)
    return invalid_argument("fewer than two hosts: no link to load");
  for (int h = first_host; h < hosts; ++h) {
    QS_RETURN_IF_ERROR(start_iperf_server(cluster, h).with_context("iperf3"));
  }
  const CpuTicks before = cpu_ticks();
  std::vector<Child> clients;
  Status started;
  for (int h = first_host; h < hosts && started.is_ok(); ++h) {
    const int to = h + 1 < hosts ? h + 1 : first_host;
    auto c = start_command(
        {"ip", "netns", "exec", cluster.namespace_name(h), "iperf3", "-c", cluster.address(to),
         "-p", kIperfPort, "-t", std::to_string(seconds), "-C", cc, "-J"},
        true);
    if (c) {
      clients.push_back(std::move(*c));
    } else {
      started = c.status();
    }
  }
  ClusterGoodput out;
  Status first = started;
  for (Child& c : clients) {  // every started one is waited for, even past a failure
    std::string json;
    Status s = finish_command(c, &json);
    if (s.is_ok()) {
      auto r = received_rate(json);
      if (r) {
        out.flows.push_back(*r);
      } else {
        s = r.status();
      }
    }
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  out.cpu_idle = idle_share(before, cpu_ticks());
  if (!first.is_ok()) return first.with_context("iperf3 on every link at once");
  std::vector<Rate> sorted = out.flows;
  std::sort(sorted.begin(), sorted.end(),
            [](Rate a, Rate b) { return a.bits_per_second < b.bits_per_second; });
  out.min = sorted.front();
  out.median = sorted[sorted.size() / 2];
  return out;
}

Result<Rate> measure_goodput(const NetnsCluster& cluster, int from, int to, const std::string& cc,
                             int seconds) {
  QS_RETURN_IF_ERROR(start_iperf_server(cluster, to).with_context("iperf3"));
  std::string json;
  QS_RETURN_IF_ERROR(run_command({"ip", "netns", "exec", cluster.namespace_name(from), "iperf3",
                                  "-c", cluster.address(to), "-p", kIperfPort, "-t",
                                  std::to_string(seconds), "-C", cc, "-J"},
                                 &json)
                         .with_context("iperf3"));
  return received_rate(json);
}

StaleCleanup NetnsCluster::cleanup_stale(bool dry_run) {
  MachineLock lock;
  return cleanup_stale_locked(dry_run);
}

StaleCleanup NetnsCluster::cleanup_stale_locked(bool dry_run) {
  StaleCleanup out;
  // `gone`: true once the thing no longer exists however it went (a veth whose peer's
  // namespace the kernel is still tearing down disappears by itself).
  auto act = [&](const std::string& what, const std::vector<std::string>& argv,
                 const std::function<bool()>& gone = nullptr) {
    if (dry_run) {
      out.removed.push_back(what);
      return;
    }
    Status s = run_command(argv);
    if (s.is_ok() || (gone && gone())) {
      out.removed.push_back(what);
    } else {
      out.errors.push_back(what + ": " + s.message());
    }
  };
  std::set<std::string> live_tags;
  // Namespaces first: deleting one deletes the veths inside it and so their peers here.
  // Processes still inside one (a daemonised iperf3: a launcher's children die with it)
  // would keep it alive; they are stopped first.
  for (const std::string& name : cluster_namespaces()) {
    std::smatch m;
    std::regex_match(name, m, kClusterNamespace);
    if (pid_alive(m[1].str())) {
      live_tags.insert("qs" + m[1].str());
      continue;
    }
    std::string pids;
    if (run_command({"ip", "netns", "pids", name}, &pids).is_ok()) {
      std::istringstream in(pids);
      for (long p; in >> p;) {
        if (p > 1) {
          if (!dry_run) kill(static_cast<pid_t>(p), SIGKILL);
          out.removed.push_back("process " + std::to_string(p) + " in namespace " + name);
        }
      }
    }
    act("namespace " + name + " (launcher " + m[1].str() + " is gone)",
        {"ip", "netns", "del", name});
  }
  // Bridges, and veths a launcher killed mid-build left here.
  std::string links;
  if (run_command({"ip", "-o", "link", "show"}, &links).is_ok()) {
    std::istringstream in(links);
    std::vector<std::string> stale_links;
    for (std::string line; std::getline(in, line);) {
      // "12: qs123p0@if11: <BROADCAST,..." -> qs123p0
      const auto colon = line.find(": ");
      if (colon == std::string::npos) continue;
      std::string name = line.substr(colon + 2);
      name = name.substr(0, name.find_first_of("@:"));
      std::smatch m;
      if (!std::regex_match(name, m, kClusterLink)) continue;
      if (pid_alive(m[1].str())) {
        live_tags.insert("qs" + m[1].str());
        continue;
      }
      stale_links.push_back(name);
    }
    // Veths before bridges (a bridge's ports would otherwise outlive it).
    std::stable_sort(stale_links.begin(), stale_links.end(),
                     [](const std::string& a, const std::string& b) {
                       const bool abr = a.ends_with("br") || a.ends_with("bs"),
                                  bbr = b.ends_with("br") || b.ends_with("bs");
                       return abr < bbr;
                     });
    for (const std::string& name : stale_links) {
      if (!dry_run && !std::filesystem::exists("/sys/class/net/" + name))
        continue;  // gone with its peer
      act("link " + name + " (launcher " +
              name.substr(2, name.find_first_not_of("0123456789", 2) - 2) + " is gone)",
          {"ip", "link", "del", name},
          [&] { return !std::filesystem::exists("/sys/class/net/" + name); });
    }
  }
  for (const std::string& tag : live_tags)
    out.live.push_back("cluster " + tag + " (its launcher still runs)");
  std::string kept;
  const std::string restored = restore_allowed_cc_if_unused(dry_run, &kept);
  if (!restored.empty()) out.removed.push_back(restored);
  if (!kept.empty()) out.live.push_back(kept);
  return out;
}

}  // namespace qs::runtime
