// The local launcher (quicksilver/launch/launcher.h): child processes, network
// namespaces and shapers, scaling, the children's reports, the prediction.
#include "quicksilver/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <thread>

#include "quicksilver/launch/job_message.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/netns.h"
#include "quicksilver/runtime/report_codec.h"
#include "quicksilver/sim/auto_planner.h"
#include "quicksilver/sim/simulator.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/socket.h"
#include "rate_shaper.h"
#include "stop_signals.h"

namespace qs {
namespace {

// Set by SIGINT/SIGTERM/SIGHUP while run_cluster runs with catch_signals (a signal handler can
// only reach a global); read by the loops that wait on children.
volatile std::sig_atomic_t g_interrupted = 0;  // see above
void on_signal(int) { g_interrupted = 1; }

struct Child {
  std::string name;
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_text, err_text;
  bool running = false;
  int status = 0;
};

// fork + exec of `exe args`, optionally inside a network namespace.
Result<Child> spawn(const std::string& name, const std::string& exe,
                    const std::vector<std::string>& args, const std::string& netns) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return io_error("pipe failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return io_error("pipe failed");
  }
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return io_error("fork failed");
  }
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
    if (getppid() == 1) _exit(125);    // the launcher died before prctl
    if (!netns.empty()) {
      Status s = runtime::NetnsCluster::enter(netns);
      if (!s.is_ok()) {
        dprintf(2, "%s\n", s.message().c_str());
        _exit(126);
      }
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    dprintf(2, "cannot execute %s\n", exe.c_str());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Child c;
  c.name = name;
  c.pid = pid;
  c.out = out[0];
  c.err = err[0];
  c.running = true;
  return c;
}

void close_pipes(Child& c) {
  if (c.out >= 0) close(c.out);
  if (c.err >= 0) close(c.err);
  c.out = c.err = -1;
}

void kill_all(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.running) kill(c.pid, SIGTERM);
    close_pipes(c);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (Child& c : children) {
    while (c.running) {
      pid_t r = waitpid(c.pid, &c.status, WNOHANG);
      if (r == c.pid) {
        c.running = false;
      } else if (std::chrono::steady_clock::now() > until) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.running = false;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
}

// Reads whatever is available on the children's pipes for up to `ms`.
void pump(std::vector<Child>& children, int ms) {
  std::vector<pollfd> fds;
  std::vector<std::string*> bufs;
  for (Child& c : children) {
    if (c.out >= 0) {
      fds.push_back({c.out, POLLIN, 0});
      bufs.push_back(&c.out_text);
    }
    if (c.err >= 0) {
      fds.push_back({c.err, POLLIN, 0});
      bufs.push_back(&c.err_text);
    }
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return;
  }
  if (poll(fds.data(), fds.size(), ms) <= 0) return;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[4096];
    ssize_t n = read(fds[i].fd, buf, sizeof buf);
    if (n > 0) {
      bufs[i]->append(buf, static_cast<std::size_t>(n));
    } else {
      for (Child& c : children) {
        if (c.out == fds[i].fd) {
          close(c.out);
          c.out = -1;
        }
        if (c.err == fds[i].fd) {
          close(c.err);
          c.err = -1;
        }
      }
    }
  }
}

void reap(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.running && waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.running = false;
  }
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

bool failed(const Child& c) {
  return !c.running && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
}

// The child a failure message says was lost ("... lost worker 2 ..."), or null.
const Child* lost_peer(const std::vector<Child>& children, const Child& c) {
  const std::string msg = last_line(c.err_text);
  const auto p = msg.find("lost ");
  if (p == std::string::npos) return nullptr;
  const std::string_view rest = std::string_view(msg).substr(p + 5);
  for (const Child& o : children) {
    if (&o != &c && rest.starts_with(o.name) &&
        (rest.size() == o.name.size() ||
         !std::isdigit(static_cast<unsigned char>(rest[o.name.size()])))) {
      return &o;
    }
  }
  return nullptr;
}

// The root cause among the failed children: from the first failure, follow each "lost
// <peer>" to that peer while it failed too; where the chain ends is the failure the others
// are consequences of (a process that died, not one that lost a peer). Null: none failed.
// Array order alone would blame whichever victim sits first (issue 15, point 6).
// A failure that only reports a peer's: gloo names the lost peer by address, not by
// worker ("Connection reset by peer [127.0.0.1]:port"), and a watchdog says it heard
// nothing. Such a child is a victim; another failure is the cause.
bool victim(const Child& c) {
  const std::string msg = last_line(c.err_text);
  return msg.find("lost ") != std::string::npos || msg.find("by peer") != std::string::npos ||
         msg.find("nothing from the other workers") != std::string::npos;
}

const Child* root_failure(const std::vector<Child>& children) {
  // The first failed child that is not a victim, else the first failed one.
  const Child* at = nullptr;
  for (const Child& c : children) {
    if (failed(c) && !victim(c)) {
      at = &c;
      break;
    }
  }
  for (const Child& c : children) {
    if (at == nullptr && failed(c)) at = &c;
  }
  // Two ends that lost each other (a stalled connection: each heard nothing from the other)
  // form a cycle: the walk stops where it would come back.
  std::vector<const Child*> seen;
  while (at != nullptr) {
    seen.push_back(at);
    const Child* next = lost_peer(children, *at);
    if (next == nullptr || !failed(*next) ||
        std::find(seen.begin(), seen.end(), next) != seen.end())
      break;
    at = next;
  }
  return at;
}

std::string describe_exit(const Child& c) {
  if (WIFSIGNALED(c.status)) return "killed by signal " + std::to_string(WTERMSIG(c.status));
  return "exit status " + std::to_string(WEXITSTATUS(c.status));
}

// LaunchOptions::log plus the collected messages; called from the shaper thread too.
class Logger {
 public:
  Logger(const std::function<void(std::string_view)>& sink, std::vector<std::string>* out)
      : sink_(sink), out_(out) {}
  void operator()(const std::string& message) {
    std::lock_guard lock(mu_);
    out_->push_back(message);
    if (sink_) sink_(message);
  }

 private:
  std::mutex mu_;
  const std::function<void(std::string_view)>& sink_;
  std::vector<std::string>* out_;  // guarded by mu_
};

// The start-up calibration of the emulated cluster (issue 16, point 3). Two cores emulate
// every link, so what one link alone carries says little: all links are loaded at once
// (measure_cluster_goodput) at a candidate rate per host, from calibration_start() over all
// hosts down by kCalibrationStep, until every flow reaches kCalibrationMinGoodput of the
// rate (one link alone: ~95.5 %, the payload share of an Ethernet frame) with the machine
// at least kCalibrationMinIdle idle, headroom for the runtime's own processes, whose
// framing and summing iperf3 does not do.
//
// The first candidate grows with the cores this process may run on: 1 Gbit/s of all the
// links together per core, and at least 4 Gbit/s (this project's 2-core machine: as
// before). Measured on a 16-core machine (docs/benchmarks.md, "GPU training", stage e):
// - with a fixed 4 Gbit/s, 8 + 8 hosts ran at 250 Mbit/s each, and at that low per-host
//   rate Mercury lost ResNet-50 to wfbp (139-147 ms against 135-139) and was predicted
//   16-21 % too fast, with 85-91 % of the CPU idle;
// - at 1 Gbit/s per host (what 1 Gbit/s per core gives there) Mercury led (117 ms against
//   130) and was predicted within 6.4 %, wfbp within 0.8 %, with 78-82 % idle;
// - at 2 Gbit/s per core (4 + 4 hosts at 4 Gbit/s each, 8 + 8 at 2) the calibration
//   passed with 80 % idle, but Mercury (its 32 KiB packets: 837-1433 a worker each
//   iteration) was predicted 15-18 % too fast, wfbp and ByteScheduler within 3 %.
constexpr double kCalibrationPerCore = 1e9;  // bit/s, all hosts' links together, per core
constexpr double kCalibrationLeast = 4e9;    // the first candidate at least
constexpr double kCalibrationStep = 0.7;
constexpr int kCalibrationProbes = 5;
constexpr double kCalibrationMinGoodput = 0.92;
constexpr double kCalibrationMinIdle = 0.6;

// The calibration's first candidate here, bit/s over all the hosts' links: by the cores
// this process may run on (its affinity mask, as taskset or a container sets it).
double calibration_start() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cores < 1) cores = static_cast<int>(std::thread::hardware_concurrency());
  return calibration_start_rate(cores);
}

struct Calibration {
  double scale = 1;
  double goodput_fraction = 0;  // the median flow's, at the chosen rate
  double cpu_idle = -1;         // the machine's, at the chosen rate
  std::string describe;
};

std::string percent(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * v);
  return b;
}

// `search`: the automatic scale (else one probe at the cluster's rate, for the reference
// goodput). `nominal`: the job's unscaled rate. `first_host`: the hosts from there on carry
// the job's traffic (the all-reduce coordinator's host, 0, carries none).
Result<Calibration> calibrate_cluster(runtime::NetnsCluster& cluster, int first_host,
                                      const std::string& cc, double nominal, bool search,
                                      Logger& log) {
  std::string tried;
  for (int probe = 0;; ++probe) {
    const Rate rate = cluster.nominal_rate();
    auto g = runtime::measure_cluster_goodput(cluster, cc, first_host);
    if (!g) return g.status();
    const double r = static_cast<double>(rate.bits_per_second);
    const double median = static_cast<double>(g->median.bits_per_second) / r;
    const double least = static_cast<double>(g->min.bits_per_second) / r;
    const bool ok = least >= kCalibrationMinGoodput && g->cpu_idle >= kCalibrationMinIdle;
    const std::string seen = format_rate(rate) + ": goodput " + percent(median) + " (least " +
                             percent(least) + "), CPU idle " + percent(std::max(0.0, g->cpu_idle));
    const Rate next{std::llround(r * kCalibrationStep)};
    if (ok || !search || probe + 1 == kCalibrationProbes || next.bits_per_second < 1'000'000 ||
        g_interrupted) {
      Calibration c;
      c.scale = r / nominal;
      c.goodput_fraction = median;
      c.cpu_idle = g->cpu_idle;
      c.describe = std::to_string(g->flows.size()) + " links at once at " + seen +
                   (tried.empty() ? "" : "; tried before: " + tried);
      if (!ok) {
        log("warning: the emulated cluster is short of headroom at " + seen +
            " (wanted every link at " + percent(kCalibrationMinGoodput) + " and the machine " +
            percent(kCalibrationMinIdle) +
            " idle): figures may say as much about this machine as about the policies" +
            (search ? "" : "; try a smaller --scale, or 0 for automatic"));
      }
      return c;
    }
    tried += (tried.empty() ? "" : "; ") + seen;
    QS_RETURN_IF_ERROR(cluster.set_nominal_rate(next));
  }
}

struct PolicyRun {
  ResultRow row;
  std::vector<runtime::WorkerReport> workers;
};

// The (scaled) cluster at the goodput its links really offer: what the prediction
// simulates on the emulated cluster (tc's rate counts Ethernet frames, of which TCP payload
// is about 1448 / 1514; the calibration measures it).
ClusterConfig at_goodput(ClusterConfig c, double goodput) {
  c.bandwidth.bits_per_second =
      std::llround(static_cast<double>(c.bandwidth.bits_per_second) * goodput);
  for (auto* rates : {&c.worker_bandwidth, &c.server_bandwidth}) {
    for (Rate& r : *rates)
      r.bits_per_second = std::llround(static_cast<double>(r.bits_per_second) * goodput);
  }
  if (c.schedule) c.schedule = c.schedule->scaled(goodput);
  return c;
}

// The files a run's children share, in the run's private temporary directory (0700).
struct RunFiles {
  std::string dir;      // the directory: also each child's job message (<child>.job.json)
  std::string profile;  // the (scaled) job profile
  std::string secret;   // the run's cluster secret (0600), new for every run
};

// The message every child of one policy's run shares: the job, its knobs, the transport,
// the secret. Each child adds its own part (start_servers, start_workers).
Result<JobMessage> job_message(const Job& job, const RunFiles& files, const std::string& policy,
                               const LaunchOptions& f) {
  QS_ASSIGN_OR_RETURN(JobMessage m, job_part(job, policy));
  m.model = files.profile;
  // gloo's algorithm: LaunchOptions::gloo_algorithm, else the job's (ring or rhd).
  if (job.cluster.architecture == Architecture::kAllReduce) m.gloo_algorithm = f.gloo_algorithm;
  m.settings = f.settings;
  m.secret_file = files.secret;
  return m;
}

// One policy's run in progress on the local cluster: what its children share, and the
// children: the servers (or the all-reduce job's coordinator) first, on hosts 0..M-1, then
// the workers, on hosts M..M+N-1. Destroyed before the run's end (an error), it kills the
// children still running.
struct PolicyLaunch {
  PolicyLaunch(const Job& the_job, const LaunchOptions& options, runtime::NetnsCluster* netns,
               const RunFiles& run_files, int shared, JobMessage message)
      : job(the_job),
        f(options),
        cluster(netns),
        files(run_files),
        shared_job(shared),
        who(shared >= 0 ? "job " + std::to_string(shared) + " " : ""),
        stem(shared >= 0 ? "job" + std::to_string(shared) + "-" : ""),
        allreduce(the_job.cluster.architecture == Architecture::kAllReduce),
        n(the_job.cluster.workers),
        m(allreduce ? 1 : the_job.cluster.servers),
        base(std::move(message)) {}
  PolicyLaunch(const PolicyLaunch&) = delete;
  PolicyLaunch& operator=(const PolicyLaunch&) = delete;
  ~PolicyLaunch() { kill_all(children); }

  const Job& job;
  const LaunchOptions& f;
  runtime::NetnsCluster* cluster;  // null: loopback
  const RunFiles& files;
  // This policy's job is that one of several sharing the cluster at once
  // (LaunchOptions::shared_jobs): its servers listen on a port of their own, its children
  // and their files are named after it. -1: alone.
  const int shared_job;
  const std::string who;   // "job J " before the children's names, or ""
  const std::string stem;  // "jobJ-" before their files' names, or ""
  const bool allreduce;
  const int n;            // workers
  const int m;            // servers, or 1: the coordinator
  const JobMessage base;  // job_message()
  std::vector<Child> children;
  // The run's end at the latest: LaunchOptions::timeout after the servers' start.
  std::chrono::steady_clock::time_point deadline;
};

// Writes the child's job message into the run's directory and starts `quicksilver ROLE
// --job FILE` in `host`'s namespace (loopback: this one). `name`: the child's, in
// messages ("server 0"); `file`: its message's ("server0").
Status start_child(PolicyLaunch& run, const std::string& name, const std::string& file,
                   const JobMessage& m, int host) {
  const std::string path =
      (std::filesystem::path(run.files.dir) / (run.stem + file + ".job.json")).string();
  QS_RETURN_IF_ERROR(write_job_message(m, path));
  auto c = spawn(run.who + name, run.f.executable, {child_role_name(m.role), "--job", path},
                 run.cluster ? run.cluster->namespace_name(host) : "");
  if (!c) return c.status();
  run.children.push_back(std::move(*c));
  return Status::ok();
}

// Servers (hosts 0..M-1), or the all-reduce job's coordinator (host 0: the gloo
// rendezvous store; it leaves once every worker's contexts are connected).
Status start_servers(PolicyLaunch& run) {
  for (int s = 0; s < run.m; ++s) {
    JobMessage c = run.base;
    const std::string host = run.cluster ? run.cluster->address(s) : "127.0.0.1";
    if (run.allreduce) {
      c.role = ChildRole::kCoordinator;
      c.listen = host + ":0";
      c.timeout = run.f.timeout;
      QS_RETURN_IF_ERROR(start_child(run, "coordinator", "coordinator", c, s));
      continue;
    }
    c.role = ChildRole::kServer;
    c.id = s;
    if (!run.cluster) {
      // Loopback has no shaper: each server paces each of its N connections at B / N,
      // each worker each of its M at B / M (SO_MAX_PACING_RATE), approximating a NIC.
      c.pacing_rate = Rate{run.job.cluster.bandwidth.bits_per_second / run.n};
    }
    c.listen =
        host + (run.cluster ? ":" + std::to_string(7100 + std::max(0, run.shared_job)) : ":0");
    QS_RETURN_IF_ERROR(
        start_child(run, "server " + std::to_string(s), "server" + std::to_string(s), c, s));
  }
  return Status::ok();
}

// Each server's address (the coordinator's), in server order, from its first line
// ("listening HOST:PORT").
Result<std::vector<std::string>> await_addresses(PolicyLaunch& run) {
  std::vector<std::string> addrs;
  for (int s = 0; s < run.m; ++s) {
    const Child& c = run.children[static_cast<std::size_t>(s)];
    while (c.out_text.find('\n') == std::string::npos) {
      pump(run.children, 50);
      reap(run.children);
      if (failed(c) || std::chrono::steady_clock::now() > run.deadline || g_interrupted) {
        std::string why = g_interrupted ? "interrupted"
                          : c.running   ? "no address before the timeout"
                                        : describe_exit(c) + ": " + last_line(c.err_text);
        return unavailable(c.name + ": " + why);
      }
    }
    const std::string& line = c.out_text;
    addrs.push_back(line.substr(std::string("listening ").size(),
                                line.find('\n') - std::string("listening ").size()));
  }
  return addrs;
}

// The workers (hosts M..M+N-1), given the servers' addresses (the coordinator's).
// `announce_start`: each PS worker says when it begins training (the shaper's cue).
Status start_workers(PolicyLaunch& run, const std::vector<std::string>& addrs,
                     bool announce_start) {
  const Job& job = run.job;
  for (int w = 0; w < run.n; ++w) {
    const auto i = static_cast<std::size_t>(w);
    const int host = run.m + w;
    JobMessage c = run.base;
    c.role = ChildRole::kWorker;
    c.id = w;
    c.json = true;
    if (run.allreduce) {
      c.coordinator = addrs.front();
      c.links = {run.cluster ? run.cluster->address(host) : "127.0.0.1"};
      if (job.cluster.second_link_slowdown != 0) {
        // Loopback: a second address of its own (127.0.0.2), through the same kernel.
        c.links.push_back(run.cluster ? run.cluster->second_address(host) : "127.0.0.2");
      }
    } else {
      c.connect = addrs;
      c.announce_start = announce_start;
    }
    c.slowdown = job.cluster.compute_factor.empty() ? 1.0 : job.cluster.compute_factor[i];
    if (run.f.kill_worker >= 0 && run.f.kill_worker == w)
      c.die_at_iteration = run.f.kill_at_iteration;
    if (!run.cluster && !run.allreduce)
      c.pacing_rate = Rate{job.cluster.bandwidth.bits_per_second / run.m};
    c.nic_rate = job.cluster.worker_bandwidth.empty() ? job.cluster.bandwidth
                                                      : job.cluster.worker_bandwidth[i];
    if (job.sim.record_trace) {
      // The worker writes its own Chrome trace there too; the launcher takes the spans
      // from the report line.
      c.trace = (std::filesystem::path(run.files.dir) /
                 (run.stem + "worker" + std::to_string(w) + ".trace.json"))
                    .string();
    }
    QS_RETURN_IF_ERROR(
        start_child(run, "worker " + std::to_string(w), "worker" + std::to_string(w), c, host));
  }
  return Status::ok();
}

// The root cause among the failed children, once the peer it lost had a moment to exit
// and say why (so that the cause is reported rather than its first victim): "NAME failed
// (exit status 1): ...".
std::string failure_message(std::vector<Child>& children) {
  // Under load a child's exit can be reaped before its stderr is read to the end, and
  // its last line decides who is blamed (an empty one names no peer and is no victim: a
  // server that lost worker 2 was blamed with an empty message). Each failed child's
  // stderr is read to its end first, for at most a second (a grandchild may hold it).
  const auto unread = [&] {
    return std::any_of(children.begin(), children.end(),
                       [](const Child& c) { return failed(c) && c.err >= 0; });
  };
  for (int i = 0; i < 20 && unread(); ++i) {
    pump(children, 50);
    reap(children);
  }
  // A victim that does not name its peer (gloo's messages name an address) gets the same
  // moment for the cause to show.
  for (int i = 0; i < 20; ++i) {
    const Child* root = root_failure(children);
    const Child* lost = lost_peer(children, *root);
    if (!victim(*root) || (lost != nullptr && !lost->running)) break;
    pump(children, 50);
    reap(children);
  }
  const Child* first = root_failure(children);
  std::string msg =
      first->name + " failed (" + describe_exit(*first) + "): " + last_line(first->err_text);
  if (const Child* lost = lost_peer(children, *first); lost != nullptr && lost->running) {
    msg += " (" + lost->name + " was still running)";
  }
  return msg;
}

// Waits for every child; the first failure stops the run. Once every worker has finished,
// the servers get a short grace period to leave on their own. `trace_at_training`: the
// shaper starts when the first PS worker says training starts.
Status supervise(PolicyLaunch& run, launch::RateShaper& shaper, bool trace_at_training) {
  std::vector<Child>& children = run.children;
  const auto worker = [&](int w) -> const Child& {
    return children[static_cast<std::size_t>(run.m + w)];
  };
  std::optional<std::chrono::steady_clock::time_point> workers_done;
  while (true) {
    pump(children, 50);
    reap(children);
    if (trace_at_training && shaper.started_at() < 0) {
      for (int w = 0; w < run.n; ++w) {
        if (worker(w).out_text.find("training starts\n") != std::string::npos) {
          shaper.start();
          break;
        }
      }
    }
    bool workers_running = false;
    for (int w = 0; w < run.n; ++w) workers_running |= worker(w).running;
    if (!workers_running && !workers_done) workers_done = std::chrono::steady_clock::now();
    if (workers_done &&
        std::chrono::steady_clock::now() - *workers_done > std::chrono::seconds(10)) {
      std::string hung;
      for (int s = 0; s < run.m; ++s) {
        if (children[static_cast<std::size_t>(s)].running)
          hung += (hung.empty() ? "" : ", ") + std::to_string(s);
      }
      if (!hung.empty()) {
        return unavailable("server(s) " + hung +
                           " did not exit within 10 s after every worker finished");
      }
    }
    if (root_failure(children) != nullptr) return unavailable(failure_message(children));
    bool all_done = true;
    for (const Child& c : children) all_done &= !c.running && c.out < 0 && c.err < 0;
    if (all_done) return Status::ok();
    if (g_interrupted) return unavailable("interrupted");
    if (std::chrono::steady_clock::now() > run.deadline) {
      std::string who;
      for (const Child& c : children)
        if (c.running) who += (who.empty() ? "" : ", ") + c.name;
      return unavailable("timed out after " + format_time(run.f.timeout) + " waiting for " + who);
    }
  }
}

// What TCP repaired, per iteration, summed into `sum`.
void add_repairs(std::vector<std::int64_t>* sum, const std::vector<std::int64_t>& v) {
  if (sum->size() < v.size()) sum->resize(v.size(), 0);
  for (std::size_t k = 0; k < v.size(); ++k) (*sum)[k] += v[k];
}

// Each worker's line in the row's notes.
void add_worker_notes(const PolicyLaunch& run, const std::vector<runtime::WorkerReport>& reports,
                      SimResult* r) {
  for (const runtime::WorkerReport& rep : reports) {
    if (run.allreduce) {
      r->notes.push_back("worker " + std::to_string(rep.worker_id) + ": " +
                         std::to_string(rep.iterations_verified) + " iterations verified exact, " +
                         rep.congestion_control);
      continue;
    }
    r->notes.push_back(
        "worker " + std::to_string(rep.worker_id) + ": " + std::to_string(rep.iterations_verified) +
        " iterations verified exact, uplink " + std::to_string(rep.uplink_gbps).substr(0, 5) +
        " Gbps, urgent-packet delay p50/p99 " + format_time(rep.urgent_delay_p50) + "/" +
        format_time(rep.urgent_delay_p99) + ", acknowledgement round trip p10/p50 " +
        format_time(rep.ack_rtt_p10) + "/" + format_time(rep.ack_rtt_p50) + ", " +
        rep.congestion_control + ", push end by " + rep.push_end);
  }
}

// The finished run's row from the children's last lines: each worker's report (iteration
// k of the cluster ends when its slowest worker's does; the median worker's link
// utilisation), what TCP repaired over every host (each server's last line too: one
// missing or malformed adds nothing), each worker's note. `cpu_before`: at the start.
Result<PolicyRun> collect_reports(const PolicyLaunch& run, const std::string& policy,
                                  const runtime::CpuTicks& cpu_before) {
  PolicyRun out;
  SimResult& r = out.row.result;
  r.policy = policy;
  if (const double idle = runtime::idle_share(cpu_before, runtime::cpu_ticks()); idle >= 0)
    r.cpu_idle = idle;
  std::vector<runtime::WorkerReport>& reports = out.workers;
  for (int w = 0; w < run.n; ++w) {
    const Child& c = run.children[static_cast<std::size_t>(run.m + w)];
    auto rep = runtime::report_from_json(last_line(c.out_text));
    if (!rep) return internal_error(c.name + " printed no report: " + last_line(c.out_text));
    reports.push_back(std::move(*rep));
  }
  for (const runtime::WorkerReport& rep : reports) {
    const auto& times = rep.iteration_times;
    if (r.iteration_times.empty()) r.iteration_times.assign(times.size(), 0);
    for (std::size_t k = 0; k < times.size() && k < r.iteration_times.size(); ++k) {
      r.iteration_times[k] = std::max(r.iteration_times[k], times[k]);
    }
  }
  bool timeouts_known = true;
  for (const runtime::WorkerReport& rep : reports) {
    add_repairs(&r.retransmits, rep.retransmits);
    add_repairs(&r.worker_retransmits, rep.retransmits);
    add_repairs(&r.timeouts, rep.timeouts);
    timeouts_known &= !rep.timeouts.empty();
  }
  for (int s = 0; s < run.m; ++s) {
    try {
      const auto j =
          nlohmann::json::parse(last_line(run.children[static_cast<std::size_t>(s)].out_text));
      add_repairs(&r.retransmits, j.at("retransmits").get<std::vector<std::int64_t>>());
      add_repairs(&r.timeouts, j.at("timeouts").get<std::vector<std::int64_t>>());
    } catch (const std::exception&) {
    }
  }
  if (!timeouts_known) r.timeouts.clear();  // the kernel does not count them
  const runtime::WorkerReport& w0 = reports[0];
  // Every worker's uplink (each one's median over its steady iterations): the median
  // worker, so that one worker's noisy iterations do not decide the figure.
  std::vector<double> util;
  for (const runtime::WorkerReport& rep : reports) util.push_back(rep.uplink_utilisation);
  r.link_utilisation = steady_median(util, 0);
  r.bytes_pushed_per_iteration = w0.bytes_pushed_per_iteration;
  r.messages_per_iteration = w0.units_per_iteration;
  if (run.job.sim.record_trace) {
    for (const runtime::WorkerReport& rep : reports)
      r.trace.insert(r.trace.end(), rep.trace.begin(), rep.trace.end());
  }
  add_worker_notes(run, reports, &r);
  return out;
}

// What the emulated network did, read before and after a run (netns only): what each link
// carried (the bridge side's counters of every worker's veths) and what the shapers'
// queues dropped over every host (link 0: host queues, switch ports).
struct NetworkCounters {
  std::vector<std::uint64_t> link_bytes;  // per link
  std::optional<runtime::NetnsCluster::Drops> drops;
};

NetworkCounters read_network_counters(const PolicyLaunch& run) {
  NetworkCounters out;
  if (!run.cluster) return out;
  const int links = run.cluster->has_second_link() ? 2 : 1;
  for (int l = 0; l < links; ++l) {
    std::uint64_t sum = 0;
    for (int w = 0; w < run.n; ++w) {
      auto b = run.cluster->sent_bytes(run.m + w, l);
      if (b) sum += *b;
    }
    out.link_bytes.push_back(sum);
  }
  runtime::NetnsCluster::Drops sum;
  for (int h = 0; h < run.cluster->hosts(); ++h) {
    auto d = run.cluster->drops(h);
    if (!d) return out;
    sum.host_queue += d->host_queue;
    sum.switch_port += d->switch_port;
  }
  out.drops = sum;
  return out;
}

// The network's notes of the run: what the queues dropped, what each link carried.
void add_network_notes(const PolicyLaunch& run, const NetworkCounters& before, SimResult* r) {
  const NetworkCounters after = read_network_counters(run);
  if (before.drops && after.drops) {
    r->host_queue_drops =
        static_cast<std::int64_t>(after.drops->host_queue - before.drops->host_queue);
    r->switch_drops =
        static_cast<std::int64_t>(after.drops->switch_port - before.drops->switch_port);
    r->notes.push_back("the hosts' own queues dropped " + std::to_string(r->host_queue_drops) +
                       " packets, the switch ports " + std::to_string(r->switch_drops) +
                       (run.shared_job >= 0 ? " (every job's)" : ""));
  }
  for (std::size_t l = 0; l < before.link_bytes.size() && l < after.link_bytes.size(); ++l) {
    const std::uint64_t sent = after.link_bytes[l] - before.link_bytes[l];
    r->notes.push_back("link " + std::to_string(l) + " carried " +
                       format_size(static_cast<Bytes>(sent / run.n)) +
                       " per worker (its veth's byte counter, calibration included" +
                       (run.shared_job >= 0 ? ", every job's" : "") + ")");
  }
}

// The cluster the prediction simulates: the same (scaled) configuration, at the goodput
// the links really offer (iperf3 on the same shaped link; tc's rate counts Ethernet
// frames, of which TCP payload is about 1448 / 1514; loopback pacing counts payload
// already); all-reduce: charged the collectives the runtime measured itself. A trace is
// shifted to the simulator's time 0, the first backward pass (`shaper_start`: the trace's
// start, steady clock; -1: none).
ClusterConfig predicted_cluster(const PolicyLaunch& run, const PolicyRun& measured,
                                double goodput_ratio, TimeNs shaper_start) {
  const runtime::WorkerReport& w0 = measured.workers[0];
  ClusterConfig predicted = run.job.cluster;
  if (run.allreduce && !w0.allreduce_fit.empty()) {
    // With compression, as compressed: the fit has it already, so the model must not again.
    predicted.wire_element_bytes = 4;
    predicted.convert_ns_per_element = 0;
    predicted.allreduce_a = w0.allreduce_fit[0].a;
    predicted.allreduce_b_ns_per_byte = w0.allreduce_fit[0].b_ns_per_byte;
    if (w0.allreduce_fit.size() > 1) {
      predicted.second_link_slowdown =
          std::max(1.0, w0.allreduce_fit[1].b_ns_per_byte / w0.allreduce_fit[0].b_ns_per_byte);
    }
  } else if (run.cluster) {
    predicted = at_goodput(run.job.cluster, goodput_ratio);
  }
  if (predicted.schedule && shaper_start >= 0) {
    // The rate the first worker to start computing met then is the prediction's first rate.
    TimeNs first = 0;
    for (const runtime::WorkerReport& rep : measured.workers) {
      const TimeNs t = rep.first_backward_at;
      if (t > 0 && (first == 0 || t < first)) first = t;
    }
    // The trace may also have started after that (its cue travels through a pipe).
    if (first > shaper_start) {
      predicted.schedule = predicted.schedule->shifted(first - shaper_start);
    } else if (first > 0) {
      predicted.schedule = predicted.schedule->delayed(shaper_start - first);
    }
  }
  return predicted;
}

// The row's end: the all-reduce fit every worker measured at start-up (the same on all)
// and the policy's report as notes, the summary (finish_result), the utilisation relative
// to the goodput, and the simulator's prediction beside it.
Status finish_row(const PolicyLaunch& run, const std::string& policy, double goodput_ratio,
                  TimeNs shaper_start, PolicyRun* out) {
  SimResult& r = out->row.result;
  const runtime::WorkerReport& w0 = out->workers[0];
  if (run.allreduce) {
    for (std::size_t l = 0; l < w0.allreduce_fit.size(); ++l) {
      const AllReduceCost& c = w0.allreduce_fit[l];
      r.notes.push_back("link " + std::to_string(l) + " all-reduce fit: a = " + format_time(c.a) +
                        ", b = " + std::to_string(c.b_ns_per_byte).substr(0, 7) + " ns/B (" +
                        std::to_string(8.0 / c.b_ns_per_byte).substr(0, 5) + " Gbit/s)");
    }
  }
  r.notes.insert(r.notes.end(), w0.notes.begin(), w0.notes.end());  // the policy's report
  if (r.iteration_times.empty()) return internal_error("the workers reported no iteration");
  const Job& job = run.job;
  finish_result(job.profile, job.cluster, job.sim, &r);
  if (run.cluster) r.link_utilisation /= goodput_ratio;
  const ClusterConfig predicted = predicted_cluster(run, *out, goodput_ratio, shaper_start);
  auto pred = simulate(job.profile, policy, job.policy_options, predicted, job.sim);
  if (pred) out->row.predicted = std::move(*pred);
  return Status::ok();
}

// Runs one policy on the local cluster; returns the measured row (with the prediction).
// `shared_job`: this policy's job is that one of several sharing the cluster at once
// (PolicyLaunch::shared_job); -1 alone.
Result<PolicyRun> run_policy(const Job& job, const std::string& policy, const LaunchOptions& f,
                             runtime::NetnsCluster* cluster, double goodput_ratio,
                             const RunFiles& files, Logger& log, int shared_job = -1) {
  QS_ASSIGN_OR_RETURN(JobMessage base, job_message(job, files, policy, f));
  PolicyLaunch run(job, f, cluster, files, shared_job, std::move(base));
  const runtime::CpuTicks cpu_before = runtime::cpu_ticks();
  const NetworkCounters before = read_network_counters(run);
  QS_RETURN_IF_ERROR(start_servers(run));
  run.deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(f.timeout);
  QS_ASSIGN_OR_RETURN(std::vector<std::string> addrs, await_addresses(run));
  // A time-varying trace starts when the first PS worker begins training (it says so on
  // its output), so that every run, and every policy, meets the trace at the same point of
  // its training whatever the rendezvous took; the all-reduce workers' trace starts when
  // they are started (their rendezvous, tens of milliseconds, comes first). The prediction
  // is shifted by the difference to the first backward pass (predicted_cluster).
  const bool dynamic = cluster && job.cluster.schedule && !job.cluster.schedule->is_constant();
  const bool trace_at_training = dynamic && !run.allreduce;
  QS_RETURN_IF_ERROR(start_workers(run, addrs, trace_at_training));
  // Dynamic scenarios: the schedule's rates over time, the first set here (rate_shaper.h).
  launch::RateShaper shaper(cluster, dynamic ? &*job.cluster.schedule : nullptr,
                            [&log](const std::string& m) { log(m); });
  if (dynamic) {
    Status st = cluster->set_rate_all(job.cluster.schedule->segments()[0].rate);
    if (!st.is_ok()) return st.with_context("setting the trace's first rate");
    if (!trace_at_training) shaper.start();
  }
  QS_RETURN_IF_ERROR(supervise(run, shaper, trace_at_training));
  QS_ASSIGN_OR_RETURN(PolicyRun out, collect_reports(run, policy, cpu_before));
  add_network_notes(run, before, &out.row.result);
  QS_RETURN_IF_ERROR(finish_row(run, policy, goodput_ratio, shaper.started_at(), &out));
  return out;
}

// Several jobs at once on the emulated cluster (Mercury Fig. 20, LaunchOptions::shared_jobs):
// each job its own servers and workers on the same hosts, so the jobs share every NIC as
// their TCP connections do, and each its own emulated GPUs (the simulator's
// --separate-gpus). `jobs`: scaled like `job`. A job predicted to finish its iterations
// sooner runs more of them (up to 10 times), so that every job's iterations run while the
// others still compete, as the simulator's do; its row is over all of them. The
// prediction is simulate_shared's, links shared fairly.
Status run_shared_jobs(const Job& job, const std::vector<SharedJob>& jobs, const LaunchOptions& f,
                       runtime::NetnsCluster& cluster, double goodput,
                       const std::filesystem::path& dir, const RunFiles& files, Logger& log,
                       ClusterRunResult* out) {
  const ClusterConfig predicted_cluster = at_goodput(job.cluster, goodput);
  QS_ASSIGN_OR_RETURN(
      std::vector<SimResult> predicted,
      simulate_shared(jobs, predicted_cluster, job.sim, SharingOptions{JobSharing::kFair, false}));
  TimeNs slowest = 0;
  for (const SimResult& p : predicted) slowest = std::max(slowest, p.iteration_time);
  std::vector<Job> each;
  std::vector<RunFiles> owns;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    Job one = job;
    one.profile = jobs[j].profile;
    one.policy_options = jobs[j].policy_options;
    one.policies = {jobs[j].policy};
    const TimeNs t = std::max<TimeNs>(1, predicted[j].iteration_time);
    const double more = std::min(10.0, static_cast<double>(slowest) / static_cast<double>(t));
    one.sim.iterations =
        std::max(job.sim.iterations, static_cast<int>(std::ceil(job.sim.iterations * more)));
    owns.push_back(files);
    owns.back().profile = (dir / ("profile" + std::to_string(j) + ".json")).string();
    QS_RETURN_IF_ERROR(save_profile(one.profile, owns.back().profile));
    each.push_back(std::move(one));
  }
  std::vector<std::optional<Result<PolicyRun>>> runs(jobs.size());
  std::vector<std::thread> threads;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    threads.emplace_back([&, j] {
      runs[j] = run_policy(each[j], jobs[j].policy, f, &cluster, goodput, owns[j], log,
                           static_cast<int>(j));
    });
  }
  for (std::thread& t : threads) t.join();
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const std::string name =
        "job " + std::to_string(j) + " (" + jobs[j].profile.name + ":" + jobs[j].policy + ")";
    Result<PolicyRun>& run = *runs[j];
    if (!run) {
      log(name + ": " + run.status().message());
      out->failures.emplace_back(name, run.status());
      continue;
    }
    run->row.result.policy = std::to_string(j) + ":" + jobs[j].profile.name + ":" + jobs[j].policy;
    run->row.result.notes.insert(run->row.result.notes.begin(),
                                 std::to_string(each[j].sim.iterations) + " iterations, batch " +
                                     std::to_string(jobs[j].profile.batch_size) +
                                     "; predicted with the other jobs");
    run->row.predicted = std::move(predicted[j]);
    out->rows.push_back(std::move(run->row));
    out->workers.push_back(std::move(run->workers));
  }
  return Status::ok();
}

// run_cluster's checks of the job, before anything forks, creates namespaces or files:
// the build, the executable, the cluster's size, the tensors, the policies.
Status check_cluster_job(const Job& job, const LaunchOptions& f) {
  const bool allreduce = job.cluster.architecture == Architecture::kAllReduce;
  if (allreduce && !runtime::have_gloo()) {
    return invalid_argument(
        "--architecture allreduce: this quicksilver was built without gloo (libgloo-dev)");
  }
  if (f.executable.empty())
    return invalid_argument("LaunchOptions::executable: no quicksilver executable given");
  // Everything below forks, creates namespaces or files: bound the job first.
  QS_RETURN_IF_ERROR(runtime::check_job_size(job.cluster.workers, job.cluster.servers));
  if (job.cluster.workers + job.cluster.servers > kMaxLocalProcesses) {
    return invalid_argument("--workers " + std::to_string(job.cluster.workers) + " and --servers " +
                            std::to_string(job.cluster.servers) +
                            ": a local cluster runs at most " + std::to_string(kMaxLocalProcesses) +
                            " processes (workers + servers)");
  }
  if (allreduce) {
    for (const LayerSpec& l : job.profile.layers) {
      for (const TensorSpec& t : l.tensors) {
        if (t.bytes_per_element != 4) {
          return invalid_argument("layer '" + l.name + "' tensor '" + t.name +
                                  "': the runtime sums float32, bytes_per_element must be 4");
        }
      }
    }
  }
  if (allreduce && f.gloo_algorithm.empty() && job.cluster.allreduce != AllReduceAlgorithm::kRing &&
      job.cluster.allreduce != AllReduceAlgorithm::kRecursiveHalvingDoubling) {
    return invalid_argument(std::string("--allreduce ") +
                            allreduce_algorithm_name(job.cluster.allreduce) +
                            ": gloo has no such algorithm; use ring or rhd, or --gloo-algorithm");
  }
  for (std::string p : job.policies) {
    if (p == "auto") {  // run_auto: the phases start with the architecture's start policy
      if (job.policies.size() > 1) return invalid_argument("--policy auto runs alone");
      if (!f.shared_jobs.empty()) return invalid_argument("--policy auto cannot run with --job");
      if (job.cluster.schedule && !job.cluster.schedule->is_constant()) {
        return invalid_argument(
            "--policy auto with --bandwidth-trace: each phase of the run starts the trace "
            "again; a script's DistributedOptimizer(policy=\"auto\") follows one trace "
            "(run --script S --policy auto --netns --bandwidth-trace T)");
      }
      if (f.auto_replan_every < 1) return invalid_argument("--replan-every must be >= 1");
      p = auto_start_policy(job.cluster.architecture);
    }
    if (allreduce) {
      const auto names = allreduce_policy_names();
      if (std::find(names.begin(), names.end(), p) == names.end()) {
        return invalid_argument("--policy: '" + p + "' is not an all-reduce policy");
      }
    }
    QS_RETURN_IF_ERROR(check_unit_budget(job.profile, p, job.cluster.architecture,
                                         job.policy_options, job.cluster.workers,
                                         job.cluster.servers)
                           .with_context(p));
  }
  return Status::ok();
}

// run_cluster's checks of LaunchOptions::shared_jobs (none: nothing to check).
Status check_shared_jobs(const Job& job, const LaunchOptions& f) {
  if (f.shared_jobs.empty()) return Status::ok();
  if (static_cast<int>(f.shared_jobs.size()) > kMaxSharedJobs) {
    return invalid_argument("--job: at most " + std::to_string(kMaxSharedJobs) + " jobs");
  }
  if (!f.netns) {
    return invalid_argument(
        "--job needs --netns (on loopback each job would pace its own links: nothing is shared)");
  }
  if (job.cluster.architecture == Architecture::kAllReduce)
    return invalid_argument("--job needs --architecture ps");
  if (job.cluster.schedule && !job.cluster.schedule->is_constant()) {
    return invalid_argument("--job cannot be combined with a time-varying --bandwidth-trace");
  }
  const std::size_t processes =
      f.shared_jobs.size() * static_cast<std::size_t>(job.cluster.workers + job.cluster.servers);
  if (processes > static_cast<std::size_t>(kMaxLocalProcesses)) {
    return invalid_argument("--job: " + std::to_string(f.shared_jobs.size()) + " jobs of " +
                            std::to_string(job.cluster.workers + job.cluster.servers) +
                            " processes each; a local " + "cluster runs at most " +
                            std::to_string(kMaxLocalProcesses));
  }
  for (std::size_t j = 0; j < f.shared_jobs.size(); ++j) {
    const SharedJob& s = f.shared_jobs[j];
    if (!policy_registry().communicates(s.policy)) {
      return invalid_argument("--job " + std::to_string(j) + ": " + s.policy + " moves no byte");
    }
    QS_RETURN_IF_ERROR(check_unit_budget(s.profile, s.policy, job.cluster.architecture,
                                         s.policy_options, job.cluster.workers, job.cluster.servers)
                           .with_context("--job " + std::to_string(j)));
  }
  return Status::ok();
}

// run_cluster's checks of what the emulated network can do: per-host rates, the scale, the
// transport's settings, routes and queues that need --netns, the bandwidth trace.
Status check_network_options(const Job& job, const LaunchOptions& f) {
  if (!job.cluster.server_shares.empty()) {
    return invalid_argument(
        "--server-shares is the simulator's: every runtime process builds the balanced placement "
        "from the job");
  }
  if ((!job.cluster.worker_bandwidth.empty() || !job.cluster.server_bandwidth.empty()) &&
      !f.netns) {
    return invalid_argument(
        "--worker-bandwidths and --server-bandwidths need --netns (on loopback every host is paced "
        "at --bandwidth)");
  }
  // Written so that NaN fails too.
  if (!(f.scale >= 0 && f.scale <= 1))
    return invalid_argument("--scale must be in (0, 1] (or 0 for automatic)");
  QS_RETURN_IF_ERROR(runtime::check_settings(f.settings));
  QS_RETURN_IF_ERROR(runtime::check_link_shaping(f.shaping, f.netns));
  if (!f.netns && job.cluster.schedule && !job.cluster.schedule->is_constant()) {
    return invalid_argument("--bandwidth-trace needs --netns (loopback has no shaper to change)");
  }
  if (job.cluster.latency > 0) {
    return invalid_argument("--latency: no delay emulation (this kernel has no netem); use 0");
  }
  if (job.cluster.schedule) {
    const auto& segs = job.cluster.schedule->segments();
    for (std::size_t i = 1; i < segs.size(); ++i) {
      // Each change reaches every shaper in microseconds (netlink), but the shapers hold
      // 1 ms of burst and 2 ms of queue: a rate held for less than a few of those is not one.
      if (segs[i].start - segs[i - 1].start < 10 * kNsPerMs) {
        return invalid_argument(
            "--bandwidth-trace: rate changes less than 10 ms apart are finer than the "
            "shapers' 1 ms burst and 2 ms queue can follow");
      }
    }
  }
  if (job.cluster.bandwidth.bits_per_second < 1'000'000) {
    return invalid_argument("--bandwidth " + format_rate(job.cluster.bandwidth) +
                            ": a link needs at least 1Mbps");
  }
  for (const auto* rates : {&job.cluster.worker_bandwidth, &job.cluster.server_bandwidth}) {
    for (Rate r : *rates) {
      if (r.bits_per_second < 1'000'000) {
        return invalid_argument(std::string(rates == &job.cluster.worker_bandwidth
                                                ? "--worker-bandwidths"
                                                : "--server-bandwidths") +
                                ": " + format_rate(r) + ": a link needs at least 1Mbps");
      }
    }
  }
  if (f.scale > 0 && static_cast<double>(job.cluster.bandwidth.bits_per_second) * f.scale < 1e6) {
    return invalid_argument(
        "--scale " + std::to_string(f.scale) + " leaves the links " +
        format_rate(Rate{std::llround(job.cluster.bandwidth.bits_per_second * f.scale)}) +
        "; a scaled link needs at least 1Mbps");
  }
  return Status::ok();
}

// The run's private temporary directory, qs-run-<pid>-XXXXXX (the pid says whose it is,
// for cleanup_stale_runs()), removed with everything in it when this goes.
class RunDirectory {
 public:
  RunDirectory() = default;
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  ~RunDirectory() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }

  // Creates it (0700) and writes the run's cluster secret into it: every child
  // authenticates its peers with it, so that a process outside this run that reaches a
  // server's port (another user's, on loopback) cannot join.
  Status create() {
    std::string tmpl = (std::filesystem::temp_directory_path() /
                        ("qs-run-" + std::to_string(getpid()) + "-XXXXXX"))
                           .string();
    if (mkdtemp(tmpl.data()) == nullptr) return io_error("cannot create a temporary directory");
    path_ = tmpl;
    return transport::Secret::generate().write_file(files().secret);
  }
  const std::filesystem::path& path() const { return path_; }
  RunFiles files() const {
    return RunFiles{path_.string(), (path_ / "profile.json").string(), (path_ / "secret").string()};
  }

 private:
  std::filesystem::path path_;
};

// The network a run's children use and the factor its bandwidth and sizes are scaled by.
struct Emulation {
  std::unique_ptr<runtime::NetnsCluster> cluster;  // --netns; null: loopback
  double scale = 1;
  // The links' TCP goodput as a fraction of the nominal rate (netns: calibrated).
  double goodput_ratio = 1448.0 / 1514.0;
};

// Chooses the scale and, with --netns, builds the namespaces and calibrates them (the
// calibration in `out`). Hosts of their own rate (Mercury Fig. 21): the cluster is
// calibrated at the fastest, and every rate is scaled with the same factor.
Status build_network(const Job& job, const LaunchOptions& f, Logger& log, Emulation* net,
                     ClusterRunResult* out) {
  const bool allreduce = job.cluster.architecture == Architecture::kAllReduce;
  double fastest = static_cast<double>(job.cluster.bandwidth.bits_per_second);
  for (const auto* rates : {&job.cluster.worker_bandwidth, &job.cluster.server_bandwidth}) {
    for (Rate r : *rates) fastest = std::max(fastest, static_cast<double>(r.bits_per_second));
  }
  const double nominal = fastest;
  // Loopback, automatic: two cores move about 4 Gbit/s of paced loopback traffic in total.
  net->scale =
      f.scale > 0
          ? f.scale
          : std::min(1.0,
                     4e9 / (job.cluster.workers + (allreduce ? 0 : job.cluster.servers)) / nominal);
  if (!f.netns) return Status::ok();
  runtime::NetnsOptions no;
  no.hosts = job.cluster.workers + (allreduce ? 1 : job.cluster.servers);
  // Automatic: the calibration's first candidate (below).
  if (f.scale == 0)
    net->scale = std::min(1.0, calibration_start() / (no.hosts - (allreduce ? 1 : 0)) / nominal);
  no.rate = Rate{std::llround(nominal * net->scale)};
  no.congestion = f.settings.congestion;
  static_cast<runtime::LinkShaping&>(no) = f.shaping;
  // A PS job's switch ports take a burst from every worker (toward a server) or every
  // server (toward a worker) at once; an all-reduce host hears one peer at a time.
  no.fan_in = allreduce ? 0 : std::max(job.cluster.workers, job.cluster.servers);
  if (allreduce && job.cluster.second_link_slowdown != 0) {
    // DeFT's second link: a veth of its own per host, `second_link_slowdown` times slower.
    no.second_rate.bits_per_second = std::llround(static_cast<double>(no.rate.bits_per_second) /
                                                  job.cluster.second_link_slowdown);
  }
  auto c = runtime::NetnsCluster::create(no);
  if (!c) return c.status().with_context("--netns");
  net->cluster = std::move(*c);
  if (f.progress) f.progress("calibrating the emulated cluster");
  auto calibrated = calibrate_cluster(*net->cluster, allreduce ? 1 : 0, f.settings.congestion,
                                      nominal, f.scale == 0, log);
  if (calibrated) {
    net->scale = calibrated->scale;
    net->goodput_ratio = calibrated->goodput_fraction;
    out->calibration = calibrated->describe;
    out->calibration_cpu_idle = calibrated->cpu_idle;
  } else {
    log("no whole-cluster calibration (" + calibrated.status().message() +
        "); assuming 1448/1514 of the rate");
  }
  out->goodput_fraction = net->goodput_ratio;
  return Status::ok();
}

// Scales bandwidth and sizes together: every communication/compute ratio is kept, and so
// are the counts of user-level units (partitions, slices, blocks: each pays its startup
// time) and the placement. Mercury's packet size is a transport parameter and is kept as
// it is (a 1.6 KB packet would measure per-packet overhead, not scheduling). With hosts of
// their own rate, sets each host's.
Status scale_job(Job* job, const Emulation& net) {
  const double scale = net.scale;
  job->profile = scale_profile(job->profile, scale);
  scale_policy_options(&job->policy_options, scale);
  job->cluster.bandwidth.bits_per_second =
      std::llround(static_cast<double>(job->cluster.bandwidth.bits_per_second) * scale);
  if (job->cluster.schedule) job->cluster.schedule = job->cluster.schedule->scaled(scale);
  ClusterConfig& cc = job->cluster;
  if (!net.cluster || (cc.worker_bandwidth.empty() && cc.server_bandwidth.empty()))
    return Status::ok();
  // Calibrated at the fastest rate; now each host at its own. Servers are hosts 0..M-1,
  // workers M..M+N-1 (a host not named keeps --bandwidth).
  const int m = cc.architecture == Architecture::kAllReduce ? 1 : cc.servers;
  for (int h = 0; h < net.cluster->hosts(); ++h) {
    const bool worker = h >= m;
    std::vector<Rate>& own = worker ? cc.worker_bandwidth : cc.server_bandwidth;
    Rate& r = own.empty() ? cc.bandwidth : own[static_cast<std::size_t>(worker ? h - m : h)];
    if (&r != &cc.bandwidth)
      r.bits_per_second = std::llround(static_cast<double>(r.bits_per_second) * scale);
    QS_RETURN_IF_ERROR(
        net.cluster->set_rate(h, r).with_context("--netns: host " + std::to_string(h)));
  }
  return Status::ok();
}

// LaunchOptions::shared_jobs, scaled as the job, at once (run_shared_jobs); then `job`
// describes them (its own policies are not run).
void run_scaled_shared_jobs(Job* job, const LaunchOptions& f, const Emulation& net,
                            const RunDirectory& dir, Logger& log, ClusterRunResult* out) {
  std::vector<SharedJob> shared = f.shared_jobs;
  for (SharedJob& s : shared) {
    s.profile = scale_profile(s.profile, net.scale);
    scale_policy_options(&s.policy_options, net.scale);
  }
  Status st = run_shared_jobs(*job, shared, f, *net.cluster, net.goodput_ratio, dir.path(),
                              dir.files(), log, out);
  if (!st.is_ok()) {
    log("the jobs: " + st.message());
    out->failures.emplace_back("the jobs", st);
  }
  job->policies.clear();
  std::string names;
  for (const SharedJob& s : shared) {
    names += (names.empty() ? "" : " + ") + s.profile.name + " batch " +
             std::to_string(s.profile.batch_size);
  }
  job->profile.name = std::to_string(shared.size()) + " jobs sharing the cluster (" + names + ")";
  job->profile.batch_size = 0;  // each job its own (config_line)
}

// `run --policy auto` (LaunchOptions::auto_replan_every): what the phases have decided.
class AutoPhases {
 public:
  static constexpr int kWarmup = 2, kFirstWindow = 8, kTrialIterations = 8;

  AutoPhases(const Job& job, const LaunchOptions& f)
      : job_(job),
        f_(f),
        policy_(auto_start_policy(job.cluster.architecture)),
        options_(job.policy_options),
        next_(kWarmup + std::min(kFirstWindow, f.auto_replan_every)) {
    all_.policy = "auto";
  }
  const std::string& policy() const { return policy_; }
  // The next phase's job: the running policy and knobs for its iterations (of those left).
  Job phase_job() const {
    Job p = job_;
    p.policies = {policy_};
    p.policy_options = options_;
    p.sim.iterations = std::min(next_, left());
    p.sim.warmup = std::min(kWarmup, p.sim.iterations - 1);
    return p;
  }
  int left() const { return job_.sim.iterations - static_cast<int>(all_.iteration_times.size()); }

  // A phase ran: its iterations join the row; what it took beyond them is logged (restart_);
  // and, iterations left, the next decision (logged). A phase that fails ends the run (a
  // candidate the runtime refuses is not skipped: the failure is the run's, with its reason).
  Status ran(const Job& phase, const PolicyRun& run, TimeNs wall, Logger& log) {
    const std::vector<TimeNs>& t = run.row.result.iteration_times;
    TimeNs sum = 0;
    for (const TimeNs x : t) sum += x;
    restart_ = std::max<TimeNs>(0, wall - sum);
    const int first = static_cast<int>(all_.iteration_times.size()) + 1;
    all_.iteration_times.insert(all_.iteration_times.end(), t.begin(), t.end());
    // The prediction: each phase's policy's for each of its iterations.
    if (run.row.predicted)
      predicted_.insert(predicted_.end(), t.size(), run.row.predicted->iteration_time);
    const std::string what = "iterations " + std::to_string(first) + ".." +
                             std::to_string(all_.iteration_times.size()) + ": " +
                             name(policy_, options_);
    all_.notes.push_back(what);
    last_ = run.row;
    if (t.empty()) return internal_error("auto: a phase reported no iteration");
    if (left() <= 0) return Status::ok();
    const TimeNs measured = steady_median(t, phase.sim.warmup);
    std::string reason;
    if (in_trial_) {
      reason = trial_step(measured);
    } else {
      // The planner's simulations: `simulate`'s default run (a warm-up and four
      // iterations), not the phase's hundreds.
      Job planning = phase;
      planning.sim.iterations = SimOptions{}.iterations;
      planning.sim.warmup = SimOptions{}.warmup;
      QS_ASSIGN_OR_RETURN(const AutoDecision d,
                          decide_auto(planning, policy_, options_, measured, 0,
                                      f_.auto_replan_every, f_.auto_allow_stale, trialled_));
      reason = d.reason;
      if (!d.trial.empty()) {
        in_trial_ = true;
        trial_network_ = d.network;
        trial_results_ = {{name(policy_, options_), {policy_, options_, measured}}};
        trial_queue_ = d.trial;
        reason += "; " + next_in_trial();
      } else if (d.change) {
        policy_ = d.next.policy;
        options_ = d.next.options;
      }
      if (!in_trial_) next_ = f_.auto_replan_every;
    }
    log("auto, after " + what + ": " + reason + " (the phase's start and end took " +
        format_time(restart_) + ")");
    all_.notes.push_back("decided: " + reason);
    return Status::ok();
  }

  // The row of every phase's iterations, summarised as the job's (its warm-up, its
  // statistic); the prediction and the figures of the last phase's policy.
  ResultRow row() const {
    ResultRow r = last_;
    r.result.policy = "auto";
    r.result.iteration_times = all_.iteration_times;
    r.result.notes = all_.notes;
    r.result.notes.insert(r.result.notes.end(), last_.result.notes.begin(),
                          last_.result.notes.end());
    finish_result(job_.profile, job_.cluster, job_.sim, &r.result);
    if (r.predicted && predicted_.size() == all_.iteration_times.size()) {
      r.predicted->policy = "auto";
      r.predicted->iteration_times = predicted_;
      finish_result(job_.profile, job_.cluster, job_.sim, &*r.predicted);
    } else {
      r.predicted.reset();  // a phase without a prediction: none for the row
    }
    return r;
  }

 private:
  struct Measured {
    std::string policy;
    PolicyOptions options;
    TimeNs time;
  };
  std::string name(const std::string& policy, const PolicyOptions& o) const {
    return auto_candidate(policy, o, job_.cluster.architecture);
  }
  // The next candidate of the trial, which runs kWarmup + kTrialIterations iterations.
  std::string next_in_trial() {
    const AdvisedPolicy a = trial_queue_.front();
    trial_queue_.erase(trial_queue_.begin());
    policy_ = a.policy;
    options_ = a.options;
    next_ = kWarmup + kTrialIterations;
    return "measuring " + name(policy_, options_);
  }
  // A trial's phase ran: its measurement in; the next candidate, or the fastest measured.
  std::string trial_step(TimeNs measured) {
    trial_results_.emplace(name(policy_, options_), Measured{policy_, options_, measured});
    std::string all;
    for (const auto& [n, m] : trial_results_)
      all += (all.empty() ? "" : ", ") + n + " " + format_time(m.time);
    if (!trial_queue_.empty()) return "trial: measured " + all + "; " + next_in_trial();
    auto best = trial_results_.begin();
    trialled_ = {{}, trial_network_, "", 0};
    for (auto it = trial_results_.begin(); it != trial_results_.end(); ++it) {
      if (it->second.time < best->second.time) best = it;
      trialled_.candidates.push_back(it->first);
      trialled_.measured.push_back(it->second.time);
    }
    trialled_.pick = best->first;
    trialled_.pick_measured = best->second.time;
    policy_ = best->second.policy;
    options_ = best->second.options;
    in_trial_ = false;
    next_ = f_.auto_replan_every;
    return "trial: measured " + all + ": " + best->first + " kept";
  }

  const Job& job_;
  const LaunchOptions& f_;
  std::string policy_;
  PolicyOptions options_;
  int next_;  // the next phase's iterations
  // What the last phase took beyond its iterations (its processes' start and end). Every
  // phase pays it, switching or not, so a switch costs nothing more: the planner is told 0
  // (a training script's switch, in place, has a cost of its own).
  TimeNs restart_ = 0;
  bool in_trial_ = false;
  std::vector<AdvisedPolicy> trial_queue_;
  std::map<std::string, Measured> trial_results_;
  Rate trial_network_{0};  // the effective rate of the decision that began the trial
  AutoTrialled trialled_;
  SimResult all_;
  std::vector<TimeNs> predicted_;  // per iteration of all_
  ResultRow last_;
};

// `run --policy auto`: the phases of AutoPhases, one after another, into one row.
void run_auto(const Job& job, const LaunchOptions& f, const Emulation& net, const RunFiles& files,
              Logger& log, ClusterRunResult* out) {
  AutoPhases phases(job, f);
  std::vector<runtime::WorkerReport> workers;
  for (int phase = 1; phases.left() > 0 && !g_interrupted; ++phase) {
    const Job p = phases.phase_job();
    if (f.progress) {
      f.progress("auto: phase " + std::to_string(phase) + ", " + phases.policy() + ", " +
                 std::to_string(p.sim.iterations) + " iterations (" +
                 std::to_string(phases.left()) + " left)");
    }
    const auto start = std::chrono::steady_clock::now();
    auto run = run_policy(p, phases.policy(), f, net.cluster.get(), net.goodput_ratio, files, log);
    const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    Status st = run ? phases.ran(p, *run, wall, log) : run.status();
    if (!st.is_ok()) {
      log("auto (" + phases.policy() + "): " + st.message());
      out->failures.emplace_back("auto", st);
      return;
    }
    workers = std::move(run->workers);
  }
  if (g_interrupted) return;
  out->rows.push_back(phases.row());
  out->workers.push_back(std::move(workers));
}

// Every policy of the (scaled) job, one after another, into `out`; the first failure
// stops them unless LaunchOptions::keep_going, a signal always.
void run_policies(const Job& job, const LaunchOptions& f, const Emulation& net,
                  const RunFiles& files, Logger& log, ClusterRunResult* out) {
  if (job.policies == std::vector<std::string>{"auto"})
    return run_auto(job, f, net, files, log, out);
  for (std::size_t i = 0; i < job.policies.size(); ++i) {
    const std::string& p = job.policies[i];
    if (g_interrupted) break;
    if (f.progress) {
      f.progress(p + " (policy " + std::to_string(i + 1) + " of " +
                 std::to_string(job.policies.size()) + ")");
    }
    auto run = run_policy(job, p, f, net.cluster.get(), net.goodput_ratio, files, log);
    if (!run) {
      log(p + ": " + run.status().message());
      out->failures.emplace_back(p, run.status());
      if (!f.keep_going || g_interrupted) break;
      continue;
    }
    out->rows.push_back(std::move(run->row));
    out->workers.push_back(std::move(run->workers));
  }
}
}  // namespace

double calibration_start_rate(int cores) {
  return std::max(kCalibrationLeast, kCalibrationPerCore * std::max(1, cores));
}

Profile scale_profile(const Profile& p, double scale) {
  Profile q = p;
  for (LayerSpec& l : q.layers) {
    for (TensorSpec& t : l.tensors) {
      t.elements = std::max<std::int64_t>(1, std::llround(static_cast<double>(t.elements) * scale));
    }
  }
  return q;
}

void scale_policy_options(PolicyOptions* o, double scale) {
  for (const Knob* k : policy_registry().knobs()) {
    if (!k->scales) continue;
    const Bytes b = k->get_int(*o);
    k->set_int(o, std::max<Bytes>(4, std::llround(static_cast<double>(b) * scale) / 4 * 4));
  }
}

std::string ClusterRunResult::describe() const {
  return std::string("measured (") +
         (goodput_fraction
              ? "network namespaces, tc-shaped links, goodput " +
                    std::to_string(*goodput_fraction * 100).substr(0, 4) + "% of the rate" +
                    (calibration.empty() ? "" : " with every link loaded at once")
              : std::string(job.cluster.architecture == Architecture::kAllReduce
                                ? "loopback, gloo unpaced: the all-reduce fit is this machine's"
                                : "loopback, paced")) +
         (rto_min > 0 ? "; route rto_min " + format_time(rto_min) : std::string()) +
         (quickack ? "; route quickack" : "") +
         (switch_buffer > 0 && switch_buffer != 2 * kNsPerMs
              ? "; switch buffer " + format_time(switch_buffer)
              : std::string()) +
         (host_queue > 0 && host_queue != runtime::LinkShaping{}.host_queue
              ? "; host queue " + format_time(host_queue)
              : std::string()) +
         (host_queue > 0 && gso_max != runtime::LinkShaping{}.gso_max
              ? "; host GSO " + (gso_max > 0 ? format_size(gso_max) : std::string("the kernel's"))
              : std::string()) +
         "; bandwidth and tensor sizes scaled by " + std::to_string(scale).substr(0, 6) +
         ", communication/compute ratios kept)";
}

StaleCleanup cleanup_stale_run_dirs(bool dry_run) {
  StaleCleanup out;
  std::error_code ec;
  const std::regex name("^qs-run-([0-9]+)-[A-Za-z0-9]{6}$");
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) return out;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    std::smatch m;
    const std::string base = e.path().filename().string();
    if (!std::regex_match(base, m, name) || !e.is_directory(ec) || e.is_symlink(ec)) continue;
    const std::string digits = m[1].str();
    const pid_t pid = digits.size() <= 9 ? static_cast<pid_t>(std::stol(digits)) : 0;
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) {
      out.live.push_back("directory " + e.path().string() + " (launcher " + digits +
                         " still runs)");
      continue;
    }
    const std::string what =
        "directory " + e.path().string() + " (launcher " + digits + " is gone)";
    std::error_code rm;
    if (!dry_run) std::filesystem::remove_all(e.path(), rm);
    if (rm) {
      out.errors.push_back(what + ": " + rm.message());
    } else {
      out.removed.push_back(what);
    }
  }
  return out;
}

StaleCleanup cleanup_stale_runs(bool dry_run) {
  StaleCleanup out = cleanup_stale_run_dirs(dry_run);
  if (runtime::NetnsCluster::available().is_ok()) {
    const StaleCleanup n = runtime::NetnsCluster::cleanup_stale(dry_run);
    out.removed.insert(out.removed.end(), n.removed.begin(), n.removed.end());
    out.errors.insert(out.errors.end(), n.errors.begin(), n.errors.end());
    out.live.insert(out.live.end(), n.live.begin(), n.live.end());
  }
  return out;
}

Result<ClusterRunResult> run_cluster(Job job, const LaunchOptions& f) {
  QS_RETURN_IF_ERROR(check_cluster_job(job, f));
  QS_RETURN_IF_ERROR(check_shared_jobs(job, f));
  QS_RETURN_IF_ERROR(check_network_options(job, f));
  ClusterRunResult out;
  Logger log(f.log, &out.messages);
  out.rto_min = f.netns ? f.shaping.rto_min : 0;
  out.quickack = f.netns && f.shaping.quickack;
  out.switch_buffer = f.netns ? f.shaping.switch_buffer : 0;
  out.host_queue = f.netns ? f.shaping.host_queue : 0;
  out.gso_max = f.netns ? f.shaping.gso_max : 0;
  // What launchers killed outright (SIGKILL) left in the temporary directory. (Their
  // namespaces go when a cluster is next built: NetnsCluster::create.)
  (void)cleanup_stale_run_dirs(false);
  RunDirectory dir;
  QS_RETURN_IF_ERROR(dir.create());
  const RunFiles files = dir.files();
  g_interrupted = 0;
  // SIGINT, SIGTERM and SIGHUP (a closed terminal) stop the run: children killed,
  // namespaces, bridge and temporary directory removed, the allowed congestion controls
  // put back. Only SIGKILL leaves them, for the next run or `quicksilver cleanup`.
  const runtime::StopSignals stop_signals(f.catch_signals, on_signal);
  Emulation net;
  QS_RETURN_IF_ERROR(build_network(job, f, log, &net, &out));
  if (net.cluster && g_interrupted) {
    out.interrupted = true;
    (void)net.cluster->teardown();
    out.job = std::move(job);
    return out;
  }
  QS_RETURN_IF_ERROR(scale_job(&job, net));
  out.scale = net.scale;
  QS_RETURN_IF_ERROR(save_profile(job.profile, files.profile));
  if (!f.shared_jobs.empty()) run_scaled_shared_jobs(&job, f, net, dir, log, &out);
  run_policies(job, f, net, files, log, &out);
  out.interrupted = g_interrupted != 0;
  if (net.cluster) {
    Status down = net.cluster->teardown();
    if (!down.is_ok()) log("removing the namespaces: " + down.message());
  }
  out.job = std::move(job);
  return out;
}

}  // namespace qs
