#include "quicksilver/runtime/netns.h"

#include "tbf_netlink.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace qs::runtime {
namespace {

constexpr const char* kAllowedCc = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
// The allowed list as it was before the first cluster changed it. Shared by every
// cluster on the machine: the last one to go (or the next run's cleanup of a crashed one)
// puts the list back.
constexpr const char* kSavedCc = "/run/quicksilver-allowed-cc";
const std::regex kClusterNamespace("^qs([0-9]+)h[0-9]+$");


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

// Restores the allowed list when no cluster namespace is left.
void restore_allowed_cc_if_unused() {
  std::error_code ec;
  if (!std::filesystem::exists(kSavedCc, ec)) return;
  for (const auto& e : std::filesystem::directory_iterator("/var/run/netns", ec)) {
    if (std::regex_match(e.path().filename().string(), kClusterNamespace)) return;
  }
  std::ifstream in(kSavedCc);
  std::string original;
  std::getline(in, original);
  if (!original.empty() && write_file(kAllowedCc, original)) std::filesystem::remove(kSavedCc, ec);
}

std::string bridge_name(const std::string& tag) { return tag + "br"; }
std::string second_bridge_name(const std::string& tag) { return tag + "bs"; }
std::string second_veth_host(const std::string& tag, int h) { return tag + "w" + std::to_string(h); }
std::string second_veth_bridge(const std::string& tag, int h) { return tag + "q" + std::to_string(h); }
std::string veth_host(const std::string& tag, int h) { return tag + "v" + std::to_string(h); }
std::string veth_bridge(const std::string& tag, int h) { return tag + "p" + std::to_string(h); }

// tbf parameters: a burst of about 1 ms of the nominal rate (MACHINE-NOTES: less loses
// rate) and a queue of 2 ms at the nominal rate, short enough that the shaper does not
// hide a sender's priorities behind a long FIFO. Both are byte counts fixed by the
// nominal rate, as a switch port's buffer is; a dynamic scenario changes only the rate:
//  * the queue: 2 ms at 1/10 of the rate held 8 packets, and TCP lost whole windows to
//    retransmission timeouts;
//  * the burst: it is also tbf's largest packet. A GSO packet of up to 64 KiB queued
//    under the old burst and larger than a new, smaller one can never be sent, and
//    stalled the link until the rate rose again (every connection through it then hit
//    retransmission timeouts with exponential backoff: iterations of seconds).
TbfParams tbf_params(Rate rate, Rate nominal) {
  const std::int64_t burst = std::max<std::int64_t>(32 * 1024, nominal.bits_per_second / 8 / 1000);
  const std::int64_t queue = std::max<std::int64_t>(32 * 1024, 2 * (nominal.bits_per_second / 8 / 1000));
  return TbfParams{rate, burst, queue + burst};
}

}  // namespace

Status run_command(const std::vector<std::string>& argv, std::string* out) {
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return io_error(std::string("pipe: ") + std::strerror(errno));
  // stdout goes to a temporary file when captured (no second pipe to drain concurrently).
  FILE* out_file = out ? std::tmpfile() : nullptr;
  pid_t pid = fork();
  if (pid < 0) return io_error(std::string("fork: ") + std::strerror(errno));
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
  std::string err;
  char buf[512];
  for (ssize_t n; (n = read(err_pipe[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  close(err_pipe[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out_file) {
    std::rewind(out_file);
    out->clear();
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, out_file)) > 0;) out->append(buf, n);
    std::fclose(out_file);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok();
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  return io_error("'" + cmd + "' failed: " + (err.empty() ? "exit status " + std::to_string(WEXITSTATUS(status)) : err));
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
  if (options.hosts < 1 || options.hosts > 250) return invalid_argument("netns cluster: hosts must be in 1..250");
  if (options.rate.bits_per_second < 1000) return invalid_argument("netns cluster: rate too small");
  NetnsOptions o = options;
  if (o.tag.empty()) o.tag = "qs" + std::to_string(getpid());
  if (o.tag.size() > 9) return invalid_argument("netns cluster: tag '" + o.tag + "' longer than 9 characters");
  cleanup_stale();
  std::unique_ptr<NetnsCluster> c(new NetnsCluster(std::move(o)));
  Status s = c->build();
  if (!s.is_ok()) {
    (void)c->teardown();  // best effort; the build error is the one to report
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
  const std::string dev = link == 0 ? veth_bridge(options_.tag, host) : second_veth_bridge(options_.tag, host);
  std::ifstream in("/sys/class/net/" + dev + "/statistics/rx_bytes");
  std::uint64_t v = 0;
  if (!(in >> v)) return io_error("cannot read the byte counter of " + dev);
  return v;
}

Status NetnsCluster::shape(const std::string& ns, const std::string& dev, Rate rate,
                           std::vector<std::unique_ptr<TbfLink>>* into) {
  auto link = TbfLink::open(ns, dev);
  if (!link.is_ok()) return link.status();
  QS_RETURN_IF_ERROR(link->set(tbf_params(rate, rate), true));
  into->push_back(std::make_unique<TbfLink>(std::move(*link)));
  return Status::ok();
}

// One host's link: a veth pair from its namespace to `bridge`, `address` on it, the
// route metrics, a shaper on each side.
Status NetnsCluster::add_link(int h, const std::string& bridge, const std::string& vh, const std::string& vb,
                              const std::string& address, const std::string& subnet, Rate rate,
                              std::vector<std::unique_ptr<TbfLink>>* shapers) {
  const std::string ns = namespace_name(h);
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "add", vh, "type", "veth", "peer", "name", vb}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vh, "netns", ns}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vb, "master", bridge}));
  QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", vb, "up"}));
  QS_RETURN_IF_ERROR(run_command({"ip", "-n", ns, "addr", "add", address + "/16", "dev", vh}));
  QS_RETURN_IF_ERROR(run_command({"ip", "-n", ns, "link", "set", vh, "up"}));
  if (options_.rto_min > 0 || options_.quickack) {
    // The connected route again, with the metrics (ip prints and takes rto_min in ms).
    std::vector<std::string> argv = {"ip", "-n", ns, "route", "replace", subnet, "dev", vh, "proto",
                                     "kernel", "scope", "link", "src", address};
    if (options_.rto_min > 0) {
      argv.push_back("rto_min");
      argv.push_back(std::to_string(std::max<TimeNs>(1, (options_.rto_min + kNsPerMs - 1) / kNsPerMs)) + "ms");
    }
    if (options_.quickack) {
      argv.push_back("quickack");
      argv.push_back("1");
    }
    QS_RETURN_IF_ERROR(run_command(argv));
  }
  QS_RETURN_IF_ERROR(shape(ns, vh, rate, shapers));  // uplink: [2h]
  return shape("", vb, rate, shapers);               // downlink: [2h + 1]
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
    QS_RETURN_IF_ERROR(add_link(h, bridge_name(tag), veth_host(tag, h), veth_bridge(tag, h), address(h),
                                "10.213.0.0/16", options_.rate, &shapers_));
    if (has_second_link()) {
      if (!second_bridge_made_) {
        QS_RETURN_IF_ERROR(run_command({"ip", "link", "add", second_bridge_name(tag), "type", "bridge"}));
        second_bridge_made_ = true;
        QS_RETURN_IF_ERROR(run_command({"ip", "link", "set", second_bridge_name(tag), "up"}));
      }
      QS_RETURN_IF_ERROR(add_link(h, second_bridge_name(tag), second_veth_host(tag, h), second_veth_bridge(tag, h),
                                  second_address(h), "10.214.0.0/16", options_.second_rate, &second_shapers_));
    }
  }
  return Status::ok();
}

Status NetnsCluster::set_rate(int host, Rate rate) {
  if (host < 0 || host >= options_.hosts) return invalid_argument("no host " + std::to_string(host));
  const TbfParams p = tbf_params(rate, options_.rate);
  QS_RETURN_IF_ERROR(shapers_[2 * static_cast<std::size_t>(host)]->set(p, false));
  return shapers_[2 * static_cast<std::size_t>(host) + 1]->set(p, false);
}

Status NetnsCluster::set_rate_all(Rate rate) {
  const TbfParams p = tbf_params(rate, options_.rate);
  Status first;
  for (auto& s : shapers_) {  // on, even past a failure: the others should still follow
    Status st = s->set(p, false);
    if (!st.is_ok() && first.is_ok()) first = st;
  }
  return first;
}

Status NetnsCluster::teardown() {
  if (torn_down_) return Status::ok();
  torn_down_ = true;
  shapers_.clear();  // their sockets pin the namespaces
  second_shapers_.clear();
  Status first;
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
  restore_allowed_cc_if_unused();  // unless another live cluster still relies on it
  return first;
}

NetnsCluster::NetnsCluster(NetnsOptions options) : options_(std::move(options)) {}

NetnsCluster::~NetnsCluster() { (void)teardown(); }  // errors were reported by an explicit teardown()

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

Result<Rate> measure_goodput(const NetnsCluster& cluster, int from, int to, const std::string& cc,
                             int seconds) {
  const std::string port = "7199";
  // The server runs in the background for one test (-1) and exits by itself.
  QS_RETURN_IF_ERROR(run_command({"ip", "netns", "exec", cluster.namespace_name(to), "iperf3", "-s", "-1",
                                  "-D", "-B", cluster.address(to), "-p", port}));
  std::string json;
  Status s;
  for (int attempt = 0; attempt < 20; ++attempt) {  // until the daemon listens
    s = run_command({"ip", "netns", "exec", cluster.namespace_name(from), "iperf3", "-c", cluster.address(to),
                     "-p", port, "-t", std::to_string(seconds), "-C", cc, "-J"},
                    &json);
    if (s.is_ok()) break;
    usleep(50'000);
  }
  if (!s.is_ok()) return s.with_context("iperf3");
  const std::string key = "\"sum_received\"";
  auto at = json.find(key);
  if (at != std::string::npos) at = json.find("\"bits_per_second\"", at);
  if (at == std::string::npos) return io_error("iperf3 printed no sum_received.bits_per_second");
  const double bps = std::strtod(json.c_str() + json.find(':', at) + 1, nullptr);
  if (!(bps > 0)) return io_error("iperf3 measured no throughput");
  return Rate{static_cast<std::int64_t>(bps)};
}

int NetnsCluster::cleanup_stale() {
  const std::regex& kName = kClusterNamespace;
  int removed = 0;
  std::error_code ec;
  std::vector<std::string> dead_tags;
  for (const auto& e : std::filesystem::directory_iterator("/var/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kName)) continue;
    if (m[1].length() > 9) continue;  // not a pid of ours
    const pid_t pid = static_cast<pid_t>(std::stol(m[1].str()));
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running (or not ours to judge)
    if (run_command({"ip", "netns", "del", name}).is_ok()) ++removed;
    dead_tags.push_back("qs" + m[1].str());
  }
  std::sort(dead_tags.begin(), dead_tags.end());
  dead_tags.erase(std::unique(dead_tags.begin(), dead_tags.end()), dead_tags.end());
  for (const auto& tag : dead_tags) {
    (void)run_command({"ip", "link", "del", bridge_name(tag)});
    (void)run_command({"ip", "link", "del", second_bridge_name(tag)});  // absent unless it had a second link
  }
  restore_allowed_cc_if_unused();  // a crashed run may have left the list changed
  return removed;
}

}  // namespace qs::runtime
