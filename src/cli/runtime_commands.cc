// `quicksilver coordinator`, `server`, `worker` and `run`: flags in, a library call
// (quicksilver/runtime/runtime.h, rendezvous.h, launcher.h), output out.
#include "runtime_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "quicksilver/launch/launcher.h"
#include "quicksilver/launch/script.h"
#include "quicksilver/runtime/rendezvous.h"
#include "quicksilver/runtime/report_codec.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/transport/socket.h"

namespace qs::cli {
namespace {

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
  QS_RETURN_IF_ERROR(runtime::validate_job(o));  // bad input is exit 2, before any socket
  return o;
}

// The rendezvous deadline of a role (--connect-timeout), defaulting on a bad value (the
// job's own validation reports it).
TimeNs o_timeout(const RoleFlags& f) {
  auto t = parse_time(f.connect_timeout);
  return t ? *t : 20 * kNsPerSec;
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
  if (!ep) return fail("quicksilver coordinator", ep.status());
  if (!timeout) return fail("quicksilver coordinator", timeout.status().with_context("--timeout"));
  runtime::CoordinatorOptions o{*ep, f.workers, f.servers, *timeout};
  auto c = runtime::Coordinator::create(o);
  if (!c) return fail("quicksilver coordinator", c.status());
  std::cout << "listening " << ep->host << ":" << (*c)->port() << std::endl;
  Status s = (*c)->run();
  // The coordinator's messages begin with "coordinator".
  if (!s.is_ok()) return fail("quicksilver", s, 1);
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
  if (!job) return fail("quicksilver server", job.status());
  auto ep = parse_endpoint(f.listen, "--listen");
  if (!ep) return fail("quicksilver server", ep.status());
  runtime::ServerOptions o;
  o.job = std::move(*job);
  o.server_id = f.id;
  o.listen = *ep;
  if (!f.sim.trace.empty()) {
    return fail("quicksilver server", "--trace: a server records no timeline (give --trace to the workers)");
  }
  auto server = runtime::Server::create(std::move(o));
  if (!server) return fail("quicksilver server", server.status());
  // The launcher reads this line to learn an ephemeral port.
  std::cout << "listening " << ep->host << ":" << (*server)->port() << std::endl;
  if (!f.coordinator.empty()) {
    auto coord = parse_endpoint(f.coordinator, "--coordinator");
    Status reg = coord ? runtime::register_server(*coord, f.id, (*server)->port(), o_timeout(f))
                       : coord.status();
    if (!reg.is_ok()) return fail("quicksilver server " + std::to_string(f.id), reg);
  }
  Status s = (*server)->run();
  if (!s.is_ok()) return fail("quicksilver server " + std::to_string(f.id), s, 1);
  // The launcher reads this last line: what TCP repaired on this server's connections.
  const runtime::Server::Repairs& rep = (*server)->repairs();
  std::cout << nlohmann::json{{"server", f.id}, {"retransmits", rep.retransmits}, {"timeouts", rep.timeouts}}.dump()
            << std::endl;
  return 0;
}

int run_worker_role(const RoleFlags& f) {
  auto job = make_job_options(f);
  if (!job) return fail("quicksilver worker", job.status());
  runtime::WorkerOptions o;
  o.job = std::move(*job);
  o.worker_id = f.id;
  o.compute_factor = f.compute_factor;
  o.warmup = f.sim.warmup;
  o.die_at_iteration = f.die_at_iteration;
  o.record_trace = !f.sim.trace.empty();
  if (f.servers.empty() && f.coordinator.empty()) {
    return fail("quicksilver worker", "give --connect HOST:PORT,... or --coordinator HOST:PORT");
  }
  if (!f.coordinator.empty()) {
    auto coord = parse_endpoint(f.coordinator, "--coordinator");
    auto list = coord ? runtime::lookup_servers(*coord, f.id, o_timeout(f)) : Result<std::vector<runtime::Endpoint>>(coord.status());
    if (!list) return fail("quicksilver worker " + std::to_string(f.id), list.status());
    o.servers = *list;
  }
  std::stringstream ss(f.servers);
  for (std::string item; std::getline(ss, item, ',');) {
    auto ep = parse_endpoint(item, "--connect");
    if (!ep) return fail("quicksilver worker", ep.status());
    o.servers.push_back(*ep);
  }
  if (!f.nic_rate.empty()) {
    auto r = parse_rate(f.nic_rate);
    if (!r) return fail("quicksilver worker", r.status().with_context("--nic-rate"));
    o.nic_rate = *r;
  }
  auto report = runtime::run_worker(o);
  if (!report) return fail("quicksilver worker " + std::to_string(f.id), report.status(), 1);
  if (!f.sim.trace.empty()) {
    SimResult measured;
    measured.policy = report->policy + " measured";
    measured.trace = report->trace;
    Status s = write_chrome_trace({measured}, f.sim.trace);
    if (!s.is_ok()) return fail("quicksilver worker " + std::to_string(f.id), s.with_context("--trace"), 1);
  }
  if (f.sim.json) {
    std::cout << runtime::report_to_json(*report) << std::endl;
  } else {
    std::cout << report->to_string() << std::endl;
  }
  return 0;
}

void add_run_flags(CLI::App* app, RunFlags* f) {
  add_sim_flags(app, &f->sim);
  app->add_flag("--netns", f->netns, "One network namespace per host, links shaped with tc (needs root)");
  app->add_option("--scale", f->scale,
                  "Scale bandwidth and tensor sizes by this factor (0: automatic, hosts at most 4 Gbps / (N + M))");
  app->add_option("--congestion", f->congestion, "TCP congestion control")->capture_default_str();
  add_commit_window_flag(app, &f->commit_window);
  app->add_option("--rto-min", f->rto_min,
                  "--netns: every host route's minimum TCP retransmission timeout, e.g. 5ms as datacenters "
                  "configure it (0ms: the kernel's 200 ms)")
      ->capture_default_str();
  app->add_flag("--quickack", f->quickack,
                "--netns: every host route acknowledges each segment at once (no delayed acknowledgements)");
  app->add_option("--timeout", f->timeout, "Give up on a policy's run after this long")->capture_default_str();
  app->add_flag("--keep-going", f->keep_going, "Continue with the next policy when one fails");
  app->add_option("--script", f->script,
                  "Run this PyTorch training script (quicksilver.torch) as --workers processes with torchrun's "
                  "environment; every argument after it is the script's")
      ->group("PyTorch");
  app->add_option("--python", f->python, "--script: the Python interpreter")->capture_default_str()->group("PyTorch");
  app->add_option("--kill-worker", f->kill_worker, "Testing: this worker dies abruptly...")->group("");
  app->add_option("--kill-at-iteration", f->kill_at_iteration, "...at this iteration")->group("");
}

namespace {

// The quicksilver Python package built beside this executable (build/python), or "".
std::string package_dir(const std::string& exe) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink(exe, ec);
  if (ec) return {};
  const auto pkg = self.parent_path() / "python";
  return std::filesystem::exists(pkg / "quicksilver", ec) ? pkg.string() : std::string();
}

// `run --script`: the workers are the script's processes; quicksilver.torch inside them
// hosts the servers. The package is found beside this executable (build/python).
int run_script_command(const RunFlags& f, const std::string& exe) {
  ScriptLaunchOptions o;
  o.python = f.python;
  o.script = f.script;
  o.args = f.script_args;
  o.workers = f.sim.workers;
  o.python_path = package_dir(exe);
  o.netns = f.netns;
  o.congestion = f.congestion;
  if (f.netns) {
    auto rate = parse_rate(f.sim.bandwidth);
    if (!rate) return fail("quicksilver", rate.status().with_context("--bandwidth"));
    o.bandwidth = *rate;
  }
  auto timeout = parse_time(f.timeout);
  if (!timeout) return fail("quicksilver", timeout.status().with_context("--timeout"));
  // --timeout bounds a policy's run (300 s by default); a script trains as long as it
  // likes unless the flag is given.
  o.timeout = f.timeout == "300s" ? 0 : *timeout;
  o.log = [](std::string_view m) { std::cerr << "quicksilver run: " << m << "\n"; };
  auto r = run_script(o);
  if (!r) return fail("quicksilver run", r.status());
  if (r->ok()) return 0;
  if (r->timed_out) std::cerr << "quicksilver run: timed out\n";
  return r->first_failed >= 0 ? std::max(1, r->exit_codes[static_cast<std::size_t>(r->first_failed)]) : 1;
}

}  // namespace

int run_profile(const std::vector<std::string>& args, const std::string& exe) {
  const std::string pkg = package_dir(exe);
  if (pkg.empty()) {
    return fail("quicksilver profile",
                "no quicksilver Python package beside this executable: build with QS_WITH_TORCH=ON "
                "(scripts/build.sh does when /usr/bin/python3 imports torch)");
  }
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = pkg + (old != nullptr && *old != '\0' ? ":" + std::string(old) : "");
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> argv_s{"/usr/bin/python3", "-m", "quicksilver.profile"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv_s[0].c_str(), argv.data());
  return fail("quicksilver profile", "cannot execute /usr/bin/python3", 3);
}

int run_cluster(const RunFlags& f, const std::string& exe) {
  if (!f.script.empty()) return run_script_command(f, exe);
  auto job = make_job(f.sim);
  if (!job) return fail("quicksilver", job.status());
  if (f.sim.policy == "all") {
    // The oracle moves no byte: there is nothing to run (its figure is the simulator's).
    std::erase(job->policies, std::string("oracle"));
  }
  LaunchOptions o;
  o.executable = exe;
  o.netns = f.netns;
  o.scale = f.scale;
  o.congestion = f.congestion;
  o.keep_going = f.keep_going;
  o.kill_worker = f.kill_worker;
  o.kill_at_iteration = f.kill_at_iteration;
  auto timeout = parse_time(f.timeout);
  if (!timeout) return fail("quicksilver", timeout.status().with_context("--timeout"));
  o.timeout = *timeout;
  auto cw = parse_time(f.commit_window);  // refuses < 0
  if (!cw) return fail("quicksilver", cw.status().with_context("--commit-window"));
  o.commit_window = *cw;
  auto rto = parse_time(f.rto_min);
  if (!rto) return fail("quicksilver", rto.status().with_context("--rto-min"));
  o.rto_min = *rto;
  o.quickack = f.quickack;
  o.log = [](std::string_view m) { std::cerr << "quicksilver run: " << m << "\n"; };
  auto run = qs::run_cluster(std::move(*job), o);
  if (!run) return fail("quicksilver run", run.status());
  int rc = run->failures.empty() ? 0 : 1;
  if (!f.sim.trace.empty() && !run->rows.empty()) {
    // Measured and predicted timelines one above the other, per policy.
    std::vector<SimResult> traced;
    for (const Row& row : run->rows) {
      traced.push_back(row.result);
      traced.back().policy += " measured";
      if (row.predicted) {
        traced.push_back(*row.predicted);
        traced.back().policy += " predicted";
      }
    }
    Status s = write_chrome_trace(traced, f.sim.trace);
    if (!s.is_ok()) rc = fail("quicksilver run", s.with_context("--trace"), 1);
  }
  if (!run->rows.empty()) {
    if (f.sim.json) {
      print_json(run->job, run->rows, run->goodput_fraction);
    } else {
      print_table(run->job, run->rows, run->describe());
    }
  }
  return rc;
}

}  // namespace qs::cli
