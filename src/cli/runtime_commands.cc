// `quicksilver server`, `quicksilver worker` and the local launcher `quicksilver run`.
#include "runtime_commands.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "quicksilver/runtime/netns.h"
#include "quicksilver/runtime/rendezvous.h"
#include "quicksilver/runtime/runtime.h"

namespace qs::cli {
namespace {

using nlohmann::json;

void add_commit_window_flag(CLI::App* app, std::string* window) {
  app->add_option("--commit-window", *window,
                  "Bytes a connection may commit past the sending buffer, as a time at --bandwidth "
                  "(TCP_NOTSENT_LOWAT; 0 = 128 KiB fixed)")
      ->capture_default_str();
}

void add_role_common(CLI::App* app, RoleFlags* f) {
  add_sim_flags(app, &f->sim);
  app->add_option("--congestion", f->congestion, "TCP congestion control (TCP_CONGESTION)")->capture_default_str();
  app->add_option("--connect-timeout", f->connect_timeout, "Rendezvous deadline")->capture_default_str();
  app->add_option("--peer-timeout", f->peer_timeout, "Longest silence from a peer before failing")->capture_default_str();
  app->add_option("--pacing-rate", f->pacing_rate, "SO_MAX_PACING_RATE per connection, e.g. 2Gbps");
  add_commit_window_flag(app, &f->commit_window);
}

Result<runtime::Endpoint> parse_endpoint(const std::string& text, const char* flag) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalid_argument(std::string(flag) + ": '" + text + "' is not HOST:PORT");
  }
  runtime::Endpoint e;
  e.host = text.substr(0, colon);
  try {
    std::size_t used = 0;
    e.port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1 || e.port < 0 || e.port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return invalid_argument(std::string(flag) + ": bad port in '" + text + "'");
  }
  return e;
}

Result<runtime::JobOptions> make_job_options(const RoleFlags& f) {
  QS_ASSIGN_OR_RETURN(Job job, make_job(f.sim));
  if (job.policies.size() != 1 || f.sim.policy == "all") {
    return invalid_argument("--policy: a server or worker runs exactly one policy");
  }
  if (job.cluster.architecture != Architecture::kPs) {
    return invalid_argument("--architecture: the runtime runs the parameter-server architecture");
  }
  runtime::JobOptions o;
  o.profile = std::move(job.profile);
  o.policy = job.policies[0];
  o.policy_options = job.policy_options;
  o.workers = job.cluster.workers;
  o.servers = job.cluster.servers;
  o.iterations = job.sim.iterations;
  o.bandwidth = job.cluster.bandwidth;
  o.socket.congestion = f.congestion;
  QS_RETURN_IF_ERROR(transport::check_congestion_available(f.congestion).with_context("--congestion"));
  auto ct = parse_time(f.connect_timeout);
  if (!ct) return ct.status().with_context("--connect-timeout");
  o.connect_timeout = *ct;
  auto pt = parse_time(f.peer_timeout);
  if (!pt) return pt.status().with_context("--peer-timeout");
  o.peer_timeout = *pt;
  auto cw = parse_time(f.commit_window);
  if (!cw) return cw.status().with_context("--commit-window");  // parse_time refuses < 0
  o.commit_window = *cw;
  if (!f.pacing_rate.empty()) {
    auto r = parse_rate(f.pacing_rate);
    if (!r) return r.status().with_context("--pacing-rate");
    o.socket.max_pacing_rate = static_cast<std::int64_t>(r->bytes_per_second());
  }
  return o;
}

// The rendezvous deadline of a role (--connect-timeout), defaulting on a bad value (the
// job's own validation reports it).
TimeNs o_timeout(const RoleFlags& f) {
  auto t = parse_time(f.connect_timeout);
  return t ? *t : 20 * kNsPerSec;
}

// Spans as compact [track, start_ns, end_ns, name] rows (the worker's report line).
json trace_json(const std::vector<TraceSpan>& spans) {
  json a = json::array();
  for (const TraceSpan& s : spans) a.push_back({s.track, s.start, s.end, s.name});
  return a;
}

json report_json(const runtime::WorkerReport& r) {
  json it = json::array();
  for (TimeNs t : r.iteration_times) it.push_back(t);
  return {{"worker", r.worker_id},
          {"policy", r.policy},
          {"congestion_control", r.congestion_control},
          {"iteration_times_ns", it},
          {"median_iteration_ns", r.median_iteration},
          {"bytes_pushed_per_iteration", r.bytes_pushed_per_iteration},
          {"units_per_iteration", r.units_per_iteration},
          {"uplink_gbps", r.uplink_gbps},
          {"uplink_utilisation", r.uplink_utilisation},
          {"push_end", r.push_end},
          {"queue_delay_ns", {r.queue_delay_p50, r.queue_delay_p99, r.queue_delay_max}},
          {"urgent_delay_ns", {r.urgent_delay_p50, r.urgent_delay_p99, r.urgent_delay_max}},
          {"iterations_verified", r.iterations_verified},
          {"first_backward_ns", r.first_backward_at},
          {"trace", trace_json(r.trace)}};
}

// The spans of a worker's report, as host `host`.
std::vector<TraceSpan> trace_from_json(const json& a, int host) {
  std::vector<TraceSpan> out;
  for (const json& e : a) {
    out.push_back(TraceSpan{host, e.at(0).get<int>(), e.at(1).get<TimeNs>(), e.at(2).get<TimeNs>(),
                            e.at(3).get<std::string>()});
  }
  return out;
}

}  // namespace

void add_coordinator_flags(CLI::App* app, CoordinatorFlags* f) {
  app->add_option("--listen", f->listen, "HOST:PORT to listen on")->capture_default_str();
  app->add_option("--workers", f->workers, "Number of workers of the job")->capture_default_str();
  app->add_option("--servers", f->servers, "Number of servers of the job")->capture_default_str();
  app->add_option("--timeout", f->timeout, "Give up after this long")->capture_default_str();
}

int run_coordinator(const CoordinatorFlags& f) {
  auto ep = parse_endpoint(f.listen, "--listen");
  auto timeout = parse_time(f.timeout);
  if (!ep || !timeout) {
    std::cerr << "quicksilver coordinator: " << (!ep ? ep.status() : timeout.status().with_context("--timeout")).message()
              << "\n";
    return 2;
  }
  runtime::CoordinatorOptions o{*ep, f.workers, f.servers, *timeout};
  auto c = runtime::Coordinator::create(o);
  if (!c) {
    std::cerr << "quicksilver coordinator: " << c.status().message() << "\n";
    return 2;
  }
  std::cout << "listening " << ep->host << ":" << (*c)->port() << std::endl;
  Status s = (*c)->run();
  if (!s.is_ok()) {
    std::cerr << "quicksilver " << s.message() << "\n";
    return 1;
  }
  return 0;
}

void add_server_flags(CLI::App* app, RoleFlags* f) {
  add_role_common(app, f);
  app->add_option("--server-id", f->id, "This server's index, 0..M-1")->required();
  app->add_option("--listen", f->listen, "HOST:PORT to listen on (port 0: ephemeral)")->capture_default_str();
  app->add_option("--coordinator", f->coordinator, "HOST:PORT of the job's coordinator to register with");
}

void add_worker_flags(CLI::App* app, RoleFlags* f) {
  add_role_common(app, f);
  app->add_option("--worker-id", f->id, "This worker's index, 0..N-1")->required();
  auto* connect = app->add_option("--connect", f->servers, "Server addresses HOST:PORT,... in server-id order");
  app->add_option("--coordinator", f->coordinator, "HOST:PORT of the job's coordinator (instead of --connect)")
      ->excludes(connect);
  app->add_option("--slowdown", f->compute_factor, "Compute slowdown of this worker (1 = profile times)");
  app->add_option("--nic-rate", f->nic_rate, "This host's NIC rate, for the utilisation figure");
  app->add_option("--die-at-iteration", f->die_at_iteration, "Testing: exit abruptly at this iteration")->group("");
}

int run_server_role(const RoleFlags& f) {
  auto job = make_job_options(f);
  if (!job) {
    std::cerr << "quicksilver server: " << job.status().message() << "\n";
    return 2;
  }
  auto ep = parse_endpoint(f.listen, "--listen");
  if (!ep) {
    std::cerr << "quicksilver server: " << ep.status().message() << "\n";
    return 2;
  }
  runtime::ServerOptions o;
  o.job = std::move(*job);
  o.server_id = f.id;
  o.listen = *ep;
  if (!f.sim.trace.empty()) {
    std::cerr << "quicksilver server: --trace: a server records no timeline (give --trace to the workers)\n";
    return 2;
  }
  auto server = runtime::Server::create(std::move(o));
  if (!server) {
    std::cerr << "quicksilver server: " << server.status().message() << "\n";
    return 2;
  }
  // The launcher reads this line to learn an ephemeral port.
  std::cout << "listening " << ep->host << ":" << (*server)->port() << std::endl;
  if (!f.coordinator.empty()) {
    auto coord = parse_endpoint(f.coordinator, "--coordinator");
    Status reg = coord ? runtime::register_server(*coord, f.id, (*server)->port(), o_timeout(f))
                       : coord.status();
    if (!reg.is_ok()) {
      std::cerr << "quicksilver server " << f.id << ": " << reg.message() << "\n";
      return 2;
    }
  }
  Status s = (*server)->run();
  if (!s.is_ok()) {
    std::cerr << "quicksilver server " << f.id << ": " << s.message() << "\n";
    return 1;
  }
  return 0;
}

int run_worker_role(const RoleFlags& f) {
  auto job = make_job_options(f);
  if (!job) {
    std::cerr << "quicksilver worker: " << job.status().message() << "\n";
    return 2;
  }
  runtime::WorkerOptions o;
  o.job = std::move(*job);
  o.worker_id = f.id;
  o.compute_factor = f.compute_factor;
  o.warmup = f.sim.warmup;
  o.die_at_iteration = f.die_at_iteration;
  o.record_trace = !f.sim.trace.empty();
  if (f.servers.empty() && f.coordinator.empty()) {
    std::cerr << "quicksilver worker: give --connect HOST:PORT,... or --coordinator HOST:PORT\n";
    return 2;
  }
  if (!f.coordinator.empty()) {
    auto coord = parse_endpoint(f.coordinator, "--coordinator");
    auto list = coord ? runtime::lookup_servers(*coord, f.id, o_timeout(f)) : Result<std::vector<runtime::Endpoint>>(coord.status());
    if (!list) {
      std::cerr << "quicksilver worker " << f.id << ": " << list.status().message() << "\n";
      return 2;
    }
    o.servers = *list;
  }
  std::stringstream ss(f.servers);
  for (std::string item; std::getline(ss, item, ',');) {
    auto ep = parse_endpoint(item, "--connect");
    if (!ep) {
      std::cerr << "quicksilver worker: " << ep.status().message() << "\n";
      return 2;
    }
    o.servers.push_back(*ep);
  }
  if (!f.nic_rate.empty()) {
    auto r = parse_rate(f.nic_rate);
    if (!r) {
      std::cerr << "quicksilver worker: --nic-rate: " << r.status().message() << "\n";
      return 2;
    }
    o.nic_rate = *r;
  }
  auto report = runtime::run_worker(o);
  if (!report) {
    std::cerr << "quicksilver worker " << f.id << ": " << report.status().message() << "\n";
    return 1;
  }
  if (!f.sim.trace.empty()) {
    SimResult measured;
    measured.policy = report->policy + " measured";
    measured.trace = report->trace;
    Status s = write_chrome_trace({measured}, f.sim.trace);
    if (!s.is_ok()) {
      std::cerr << "quicksilver worker " << f.id << ": --trace: " << s.message() << "\n";
      return 1;
    }
  }
  if (f.sim.json) {
    std::cout << report_json(*report).dump() << std::endl;
  } else {
    std::cout << report->to_string() << std::endl;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// The launcher.

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
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
Result<Child> spawn(const std::string& name, const std::string& exe, const std::vector<std::string>& args,
                    const std::string& netns) {
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
    if (getppid() == 1) _exit(125);     // the launcher died before prctl
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
    if (c.out >= 0) { fds.push_back({c.out, POLLIN, 0}); bufs.push_back(&c.out_text); }
    if (c.err >= 0) { fds.push_back({c.err, POLLIN, 0}); bufs.push_back(&c.err_text); }
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
        if (c.out == fds[i].fd) { close(c.out); c.out = -1; }
        if (c.err == fds[i].fd) { close(c.err); c.err = -1; }
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

bool failed(const Child& c) { return !c.running && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0); }

std::string describe_exit(const Child& c) {
  if (WIFSIGNALED(c.status)) return "killed by signal " + std::to_string(WTERMSIG(c.status));
  return "exit status " + std::to_string(WEXITSTATUS(c.status));
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

std::vector<std::string> job_args(const Job& job, const std::string& profile_path, const std::string& policy,
                                  const RunFlags& f) {
  const PolicyOptions& o = job.policy_options;
  std::vector<std::string> args = {"--model", profile_path, "--policy", policy, "--workers", std::to_string(job.cluster.workers),
          "--servers", std::to_string(job.cluster.servers), "--iterations", std::to_string(job.sim.iterations),
          "--warmup", std::to_string(job.sim.warmup), "--packet-size", std::to_string(o.packet_size) + "B",
          "--partition-size", std::to_string(o.partition_size) + "B", "--credit-size",
          std::to_string(o.credit_size) + "B", "--slice-size", std::to_string(o.slice_size) + "B",
          "--startup-time", std::to_string(o.startup_time) + "ns", "--split-threshold",
          std::to_string(o.split_threshold) + "B", "--bandwidth", std::to_string(job.cluster.bandwidth.bits_per_second) + "bps",
          "--prophet-partition-size", std::to_string(o.prophet_partition_size) + "B",
          "--seed", std::to_string(job.sim.seed), "--congestion", f.congestion,
          "--commit-window", f.commit_window};
  if (o.prophet_allow_overrun) args.push_back("--prophet-overrun");
  return args;
}

// Runs one policy on the local cluster; returns the measured row (with the prediction).
Result<Row> run_policy(const Job& job, const std::string& policy, const RunFlags& f, const std::string& exe,
                       runtime::NetnsCluster* cluster, double goodput_ratio, const std::string& profile_path,
                       TimeNs timeout) {
  const int n = job.cluster.workers, m = job.cluster.servers;
  std::vector<std::string> base = job_args(job, profile_path, policy, f);
  std::vector<Child> children;
  auto cleanup = [&] { kill_all(children); };
  // Servers: hosts 0..M-1.
  std::vector<std::string> addrs;
  for (int s = 0; s < m; ++s) {
    std::vector<std::string> a = {"server", "--server-id", std::to_string(s)};
    a.insert(a.end(), base.begin(), base.end());
    if (!cluster) {
      // Loopback has no shaper: each server paces each of its N connections at B / N,
      // each worker each of its M at B / M (SO_MAX_PACING_RATE), approximating a NIC.
      a.push_back("--pacing-rate");
      a.push_back(std::to_string(job.cluster.bandwidth.bits_per_second / n) + "bps");
    }
    const std::string host = cluster ? cluster->address(s) : "127.0.0.1";
    a.push_back("--listen");
    a.push_back(host + (cluster ? ":7100" : ":0"));
    auto c = spawn("server " + std::to_string(s), exe, a, cluster ? cluster->namespace_name(s) : "");
    if (!c) {
      cleanup();
      return c.status();
    }
    children.push_back(std::move(*c));
  }
  // Learn each server's address from its first line.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::nanoseconds(timeout);
  for (int s = 0; s < m; ++s) {
    while (children[static_cast<std::size_t>(s)].out_text.find('\n') == std::string::npos) {
      pump(children, 50);
      reap(children);
      if (failed(children[static_cast<std::size_t>(s)]) || std::chrono::steady_clock::now() > deadline || g_interrupted) {
        const Child& c = children[static_cast<std::size_t>(s)];
        std::string why = g_interrupted ? "interrupted" : c.running ? "no address before the timeout" : describe_exit(c) + ": " + last_line(c.err_text);
        cleanup();
        return unavailable("server " + std::to_string(s) + ": " + why);
      }
    }
    const std::string& line = children[static_cast<std::size_t>(s)].out_text;
    addrs.push_back(line.substr(std::string("listening ").size(), line.find('\n') - std::string("listening ").size()));
  }
  std::string connect;
  for (const auto& a : addrs) connect += (connect.empty() ? "" : ",") + a;
  for (int w = 0; w < n; ++w) {
    std::vector<std::string> a = {"worker", "--worker-id", std::to_string(w), "--connect", connect, "--json"};
    a.insert(a.end(), base.begin(), base.end());
    const double factor = job.cluster.compute_factor.empty() ? 1.0 : job.cluster.compute_factor[static_cast<std::size_t>(w)];
    if (f.kill_worker >= 0 && f.kill_worker == w) {
      a.push_back("--die-at-iteration");
      a.push_back(std::to_string(f.kill_at_iteration));
    }
    a.push_back("--slowdown");
    a.push_back(std::to_string(factor));
    if (!cluster) {
      a.push_back("--pacing-rate");
      a.push_back(std::to_string(job.cluster.bandwidth.bits_per_second / m) + "bps");
    }
    a.push_back("--nic-rate");
    a.push_back(std::to_string(job.cluster.bandwidth.bits_per_second) + "bps");
    if (job.sim.record_trace) {
      // The worker writes its own Chrome trace there too; the launcher takes the spans
      // from the report line.
      a.push_back("--trace");
      a.push_back((std::filesystem::path(profile_path).parent_path() / ("worker" + std::to_string(w) + ".trace.json")).string());
    }
    auto c = spawn("worker " + std::to_string(w), exe, a, cluster ? cluster->namespace_name(m + w) : "");
    if (!c) {
      cleanup();
      return c.status();
    }
    children.push_back(std::move(*c));
  }
  // Dynamic scenarios: apply the bandwidth schedule to every host's shaper over time,
  // from its first rate. Time 0 is when the workers start, not their first backward
  // pass (the rendezvous, tens of milliseconds, comes first); the prediction is shifted
  // by the difference (below).
  std::mutex shaper_mu;
  std::condition_variable shaper_cv;
  bool stop_shaper = false;  // guarded by shaper_mu
  std::thread shaper;
  TimeNs shaper_start = -1;  // steady clock (CLOCK_MONOTONIC), as the workers' reports
  if (cluster && job.cluster.schedule && !job.cluster.schedule->is_constant()) {
    Status st = cluster->set_rate_all(job.cluster.schedule->segments()[0].rate);
    if (!st.is_ok()) {
      cleanup();
      return st.with_context("setting the trace's first rate");
    }
    const auto t_start = std::chrono::steady_clock::now();
    shaper_start = std::chrono::duration_cast<std::chrono::nanoseconds>(t_start.time_since_epoch()).count();
    shaper = std::thread([&, t0 = t_start] {
      const auto& segs = job.cluster.schedule->segments();
      std::unique_lock lock(shaper_mu);
      for (std::size_t i = 1; i < segs.size(); ++i) {
        // Wakes at the segment's start (or at once when the run ends).
        if (shaper_cv.wait_until(lock, t0 + std::chrono::nanoseconds(segs[i].start), [&] { return stop_shaper; })) break;
        Status c = cluster->set_rate_all(segs[i].rate);
        if (!c.is_ok()) std::cerr << "quicksilver run: changing the rate: " << c.message() << "\n";
      }
    });
  }
  struct JoinShaper {
    std::mutex* mu;
    std::condition_variable* cv;
    bool* stop;
    std::thread* t;
    ~JoinShaper() {
      {
        std::lock_guard lock(*mu);
        *stop = true;
      }
      cv->notify_all();
      if (t->joinable()) t->join();
    }
  } join_shaper{&shaper_mu, &shaper_cv, &stop_shaper, &shaper};
  // Wait for every process; the first failure stops the run. Once every worker has
  // finished, the servers get a short grace period to leave on their own.
  std::optional<std::chrono::steady_clock::time_point> workers_done;
  while (true) {
    pump(children, 50);
    reap(children);
    bool workers_running = false;
    for (int w = 0; w < n; ++w) workers_running |= children[static_cast<std::size_t>(m + w)].running;
    if (!workers_running && !workers_done) workers_done = std::chrono::steady_clock::now();
    if (workers_done && std::chrono::steady_clock::now() - *workers_done > std::chrono::seconds(10)) {
      std::string hung;
      for (int s = 0; s < m; ++s) {
        if (children[static_cast<std::size_t>(s)].running) hung += (hung.empty() ? "" : ", ") + std::to_string(s);
      }
      if (!hung.empty()) {
        cleanup();
        return unavailable("server(s) " + hung + " did not exit within 10 s after every worker finished");
      }
    }
    for (const Child& c : children) {
      if (failed(c)) {
        std::string msg = c.name + " failed (" + describe_exit(c) + "): " + last_line(c.err_text);
        cleanup();
        return unavailable(msg);
      }
    }
    bool all_done = true;
    for (const Child& c : children) all_done &= !c.running && c.out < 0 && c.err < 0;
    if (all_done) break;
    if (g_interrupted) {
      cleanup();
      return unavailable("interrupted");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string who;
      for (const Child& c : children) if (c.running) who += (who.empty() ? "" : ", ") + c.name;
      cleanup();
      return unavailable("timed out after " + format_time(timeout) + " waiting for " + who);
    }
  }
  // Collect the workers' reports.
  Row row;
  SimResult& r = row.result;
  r.policy = policy;
  std::vector<json> reports;
  for (int w = 0; w < n; ++w) {
    const Child& c = children[static_cast<std::size_t>(m + w)];
    try {
      reports.push_back(json::parse(last_line(c.out_text)));
    } catch (const std::exception& e) {
      return internal_error(c.name + " printed no report: " + last_line(c.out_text));
    }
  }
  try {
    // Iteration k of the cluster ends when its slowest worker's does.
    for (const json& rep : reports) {
      const auto& times = rep.at("iteration_times_ns");
      if (r.iteration_times.empty()) r.iteration_times.assign(times.size(), 0);
      for (std::size_t k = 0; k < times.size() && k < r.iteration_times.size(); ++k) {
        r.iteration_times[k] = std::max(r.iteration_times[k], times[k].get<TimeNs>());
      }
    }
    const json& w0 = reports[0];
    // Every worker's uplink (each one's median over its steady iterations): the median
    // worker, so that one worker's noisy iterations do not decide the figure.
    std::vector<double> util;
    for (const json& rep : reports) util.push_back(rep.value("uplink_utilisation", 0.0));
    std::sort(util.begin(), util.end());
    const std::size_t mid = util.size() / 2;
    r.link_utilisation = util.size() % 2 == 1 ? util[mid] : (util[mid - 1] + util[mid]) / 2;
    r.bytes_pushed_per_iteration = w0.value("bytes_pushed_per_iteration", Bytes{0});
    r.messages_per_iteration = w0.value("units_per_iteration", std::int64_t{0});
    if (job.sim.record_trace) {
      for (const json& rep : reports) {
        auto spans = trace_from_json(rep.at("trace"), rep.value("worker", 0));
        r.trace.insert(r.trace.end(), spans.begin(), spans.end());
      }
    }
    for (const json& rep : reports) {
      const auto& u = rep.at("urgent_delay_ns");
      r.notes.push_back("worker " + std::to_string(rep.value("worker", 0)) + ": " +
                        std::to_string(rep.value("iterations_verified", 0)) + " iterations verified exact, uplink " +
                        std::to_string(rep.value("uplink_gbps", 0.0)).substr(0, 5) +
                        " Gbps, urgent-packet delay p50/p99 " + format_time(u.at(0).get<TimeNs>()) + "/" +
                        format_time(u.at(1).get<TimeNs>()) + ", " +
                        rep.value("congestion_control", std::string("?")) + ", push end by " +
                        rep.value("push_end", std::string("?")));
    }
  } catch (const std::exception& e) {
    return internal_error("a worker's report is malformed: " + std::string(e.what()));
  }
  if (r.iteration_times.empty()) return internal_error("the workers reported no iteration");
  finish_result(job.profile, job.cluster, job.sim, &r);
  // The prediction: the simulator on the same (scaled) configuration, at the goodput the
  // links really offer (iperf3 on the same shaped link; tc's rate counts Ethernet frames,
  // of which TCP payload is about 1448 / 1514). Loopback pacing counts payload already.
  // The utilisation is likewise relative to that goodput.
  if (cluster) r.link_utilisation /= goodput_ratio;
  ClusterConfig predicted_cluster = job.cluster;
  if (cluster) {
    const double goodput = goodput_ratio;
    predicted_cluster.bandwidth.bits_per_second = std::llround(job.cluster.bandwidth.bits_per_second * goodput);
    if (predicted_cluster.schedule) predicted_cluster.schedule = predicted_cluster.schedule->scaled(goodput);
  }
  if (predicted_cluster.schedule && shaper_start >= 0) {
    // The simulator's time 0 is the first backward pass: the rate the first worker to
    // start computing met then is the prediction's first rate.
    TimeNs first = 0;
    for (const json& rep : reports) {
      const TimeNs t = rep.value("first_backward_ns", TimeNs{0});
      if (t > 0 && (first == 0 || t < first)) first = t;
    }
    if (first > shaper_start) predicted_cluster.schedule = predicted_cluster.schedule->shifted(first - shaper_start);
  }
  auto pred = simulate(job.profile, policy, job.policy_options, predicted_cluster, job.sim);
  if (pred) row.predicted = std::move(*pred);
  return row;
}

}  // namespace

void add_run_flags(CLI::App* app, RunFlags* f) {
  add_sim_flags(app, &f->sim);
  app->add_flag("--netns", f->netns, "One network namespace per host, links shaped with tc (needs root)");
  app->add_option("--scale", f->scale,
                  "Scale bandwidth and tensor sizes by this factor (0: automatic, hosts at most 4 Gbps / (N + M))");
  app->add_option("--congestion", f->congestion, "TCP congestion control")->capture_default_str();
  add_commit_window_flag(app, &f->commit_window);
  app->add_option("--timeout", f->timeout, "Give up on a policy's run after this long")->capture_default_str();
  app->add_flag("--keep-going", f->keep_going, "Continue with the next policy when one fails");
  app->add_option("--kill-worker", f->kill_worker, "Testing: this worker dies abruptly...")->group("");
  app->add_option("--kill-at-iteration", f->kill_at_iteration, "...at this iteration")->group("");
}

int run_cluster(const RunFlags& f, const std::string& exe) {
  auto job = make_job(f.sim);
  if (!job) {
    std::cerr << "quicksilver: " << job.status().message() << "\n";
    return 2;
  }
  if (job->cluster.architecture != Architecture::kPs) {
    std::cerr << "quicksilver run: --architecture: the runtime runs the parameter-server architecture\n";
    return 2;
  }
  if (f.sim.policy == "all") {
    // The oracle moves no byte: there is nothing to run (its figure is the simulator's).
    std::erase(job->policies, std::string("oracle"));
  }
  auto timeout = parse_time(f.timeout);
  if (!timeout) {
    std::cerr << "quicksilver: --timeout: " << timeout.status().message() << "\n";
    return 2;
  }
  if (auto cw = parse_time(f.commit_window); !cw) {  // as the workers will parse it
    std::cerr << "quicksilver: --commit-window: " << cw.status().message() << "\n";
    return 2;
  }
  if (!f.netns && job->cluster.schedule && !job->cluster.schedule->is_constant()) {
    std::cerr << "quicksilver run: --bandwidth-trace needs --netns (loopback has no shaper to change)\n";
    return 2;
  }
  if (job->cluster.latency > 0) {
    std::cerr << "quicksilver run: --latency: no delay emulation (this kernel has no netem); use 0\n";
    return 2;
  }
  if (Status cc = transport::check_congestion_available(f.congestion); !cc.is_ok()) {
    std::cerr << "quicksilver run: --congestion: " << cc.message() << "\n";
    return 2;
  }
  if (job->cluster.schedule) {
    const auto& segs = job->cluster.schedule->segments();
    for (std::size_t i = 1; i < segs.size(); ++i) {
      // Each change reaches every shaper in microseconds (netlink), but the shapers hold
      // 1 ms of burst and 2 ms of queue: a rate held for less than a few of those is not one.
      if (segs[i].start - segs[i - 1].start < 10 * kNsPerMs) {
        std::cerr << "quicksilver run: --bandwidth-trace: rate changes less than 10 ms apart are finer than the "
                     "shapers' 1 ms burst and 2 ms queue can follow\n";
        return 2;
      }
    }
  }
  if (f.scale < 0 || f.scale > 1) {
    std::cerr << "quicksilver: --scale must be in (0, 1] (or 0 for automatic)\n";
    return 2;
  }
  double scale = f.scale;
  if (scale == 0) {
    // Two cores move about 4 Gbit/s of shaped veth traffic in total (measured: errors
    // against the simulator grow past that), so hosts get 4 Gbit/s / (N + M) each, at most.
    const double per_host = 4e9 / (job->cluster.workers + job->cluster.servers);
    scale = std::min(1.0, per_host / static_cast<double>(job->cluster.bandwidth.bits_per_second));
  }
  // Scale bandwidth and sizes together: every communication/compute ratio is kept, and
  // so are the counts of user-level units (partitions, slices, blocks: each pays its
  // startup time) and the placement. Mercury's packet size is a transport parameter and
  // is kept as it is (a 1.6 KB packet would measure per-packet overhead, not scheduling).
  job->profile = scale_profile(job->profile, scale);
  {
    PolicyOptions& o = job->policy_options;
    auto sc = [scale](Bytes b) { return std::max<Bytes>(4, std::llround(static_cast<double>(b) * scale) / 4 * 4); };
    o.partition_size = sc(o.partition_size);
    o.credit_size = sc(o.credit_size);
    o.slice_size = sc(o.slice_size);
    o.prophet_partition_size = sc(o.prophet_partition_size);
    o.split_threshold = sc(o.split_threshold);
  }
  job->cluster.bandwidth.bits_per_second = std::llround(job->cluster.bandwidth.bits_per_second * scale);
  if (job->cluster.schedule) job->cluster.schedule = job->cluster.schedule->scaled(scale);
  std::string tmpl = (std::filesystem::temp_directory_path() / "qs-run-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::cerr << "quicksilver run: cannot create a temporary directory\n";
    return 2;
  }
  const std::filesystem::path tmp = tmpl;
  const std::string profile_path = (tmp / "profile.json").string();
  Status saved = save_profile(job->profile, profile_path);
  if (!saved.is_ok()) {
    std::cerr << "quicksilver: " << saved.message() << "\n";
    std::filesystem::remove_all(tmp);
    return 2;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::unique_ptr<runtime::NetnsCluster> cluster;
  double goodput_ratio = 1448.0 / 1514.0;
  if (f.netns) {
    runtime::NetnsOptions no;
    no.hosts = job->cluster.workers + job->cluster.servers;
    no.rate = job->cluster.bandwidth;
    no.congestion = f.congestion;
    auto c = runtime::NetnsCluster::create(no);
    if (!c) {
      std::cerr << "quicksilver run --netns: " << c.status().message() << "\n";
      std::filesystem::remove_all(tmp);
      return 2;
    }
    cluster = std::move(*c);
    auto g = runtime::measure_goodput(*cluster, job->cluster.servers, 0, f.congestion);
    if (g) {
      goodput_ratio = static_cast<double>(g->bits_per_second) / static_cast<double>(job->cluster.bandwidth.bits_per_second);
    } else {
      std::cerr << "quicksilver run: no iperf3 goodput (" << g.status().message() << "); assuming 1448/1514 of the rate\n";
    }
  }
  std::vector<Row> rows;
  int rc = 0;
  for (const std::string& p : job->policies) {
    auto row = run_policy(*job, p, f, exe, cluster.get(), goodput_ratio, profile_path, *timeout);
    if (!row) {
      std::cerr << "quicksilver run: " << p << ": " << row.status().message() << "\n";
      rc = 1;
      if (!f.keep_going || g_interrupted) break;
      continue;
    }
    rows.push_back(std::move(*row));
  }
  if (cluster) {
    Status down = cluster->teardown();
    if (!down.is_ok()) std::cerr << "quicksilver run: removing the namespaces: " << down.message() << "\n";
  }
  std::filesystem::remove_all(tmp);
  if (!f.sim.trace.empty() && !rows.empty()) {
    // Measured and predicted timelines one above the other, per policy.
    std::vector<SimResult> traced;
    for (const Row& row : rows) {
      traced.push_back(row.result);
      traced.back().policy += " measured";
      if (row.predicted) {
        traced.push_back(*row.predicted);
        traced.back().policy += " predicted";
      }
    }
    Status s = write_chrome_trace(traced, f.sim.trace);
    if (!s.is_ok()) {
      std::cerr << "quicksilver run: --trace: " << s.message() << "\n";
      rc = 1;
    }
  }
  if (!rows.empty()) {
    std::string title = std::string("measured (") +
                        (f.netns ? "network namespaces, tc-shaped links, iperf3 goodput " +
                                       std::to_string(goodput_ratio * 100).substr(0, 4) + "% of the rate"
                                 : std::string("loopback, paced")) +
                        "; bandwidth and tensor sizes scaled by " + std::to_string(scale).substr(0, 6) +
                        ", communication/compute ratios kept)";
    if (f.sim.json) {
      print_json(*job, rows, f.netns ? std::optional<double>(goodput_ratio) : std::nullopt);
    } else {
      print_table(*job, rows, title);
    }
  }
  return rc;
}

}  // namespace qs::cli
