// `quicksilver coordinator`, `server`, `worker` and `run`: flags in, a library call
// (quicksilver/runtime/runtime.h, rendezvous.h, launcher.h), output out.
#include "runtime_commands.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "progress.h"
#include "quicksilver/launch/job_message.h"
#include "quicksilver/launch/launcher.h"
#include "quicksilver/launch/python.h"
#include "quicksilver/launch/script.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/rendezvous.h"
#include "quicksilver/runtime/report_codec.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/runtime/store.h"
#include "quicksilver/sim/auto_planner.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/socket.h"

namespace qs::cli {
namespace {

// One flag per runtime setting (runtime/settings.h), its default and help from the table.
void add_settings_flags(CLI::App* app, SettingsFlags* f) {
  const auto table = runtime::runtime_settings();
  const runtime::RuntimeSettings defaults;
  f->texts.assign(table.size(), "");
  for (std::size_t i = 0; i < table.size(); ++i) {
    const runtime::RuntimeSetting& s = table[i];
    std::string* text = &f->texts[i];
    if (s.kind == runtime::SettingKind::kSwitch) {  // its flag turns it off
      app->add_flag_callback(
          std::string(s.flag), [text] { *text = "false"; }, std::string(s.help));
    } else {
      app->add_option(std::string(s.flag), *text, std::string(s.help))
          ->default_str(runtime::format_setting(defaults, s));
    }
  }
}

// The settings the flags give, each checked (errors name the flag).
Result<runtime::RuntimeSettings> settings_from_flags(const SettingsFlags& f) {
  const auto table = runtime::runtime_settings();
  runtime::RuntimeSettings settings;
  for (std::size_t i = 0; i < table.size() && i < f.texts.size(); ++i) {
    if (!f.texts[i].empty())
      QS_RETURN_IF_ERROR(runtime::set_setting(settings, table[i], f.texts[i]));
  }
  return settings;
}

void add_job_file_flag(CLI::App* app, std::string* file) {
  app->add_option("--job", *file,
                  "The whole job as one file, the message `quicksilver run` writes for each of its "
                  "children (include/launch/quicksilver/launch/job_message.h), instead of the job "
                  "flags");
}

void add_secret_flags(CLI::App* app, std::string* file, bool* insecure) {
  auto* secret = app->add_option(
      "--secret-file", *file,
      "The cluster secret: FILE's whole content (16..4096 bytes), the same on every "
      "node; default $QUICKSILVER_SECRET_FILE");
  app->add_flag("--insecure", *insecure,
                "Run without a secret: any peer that can reach this node may join (a trusted "
                "network only)")
      ->excludes(secret);
}

// The cluster secret of a role: --secret-file, else $QUICKSILVER_SECRET_FILE (the only place
// that variable is read); none only with --insecure.
Result<std::shared_ptr<const transport::Secret>> load_secret(const std::string& file,
                                                             bool insecure) {
  std::string path = file;
  std::string from = "--secret-file";
  if (path.empty()) {
    const char* env = std::getenv("QUICKSILVER_SECRET_FILE");
    if (env != nullptr && *env != '\0') {
      path = env;
      from = "QUICKSILVER_SECRET_FILE";
    }
  }
  if (path.empty()) {
    if (insecure) return std::shared_ptr<const transport::Secret>();
    return invalid_argument(
        "no cluster secret: give --secret-file FILE or set QUICKSILVER_SECRET_FILE (the file's "
        "whole content, 16 to "
        "4096 bytes, is the secret: e.g. head -c 32 /dev/urandom > FILE; chmod 600 FILE), or "
        "--insecure on a network "
        "where every host is trusted");
  }
  if (insecure)
    return invalid_argument(
        "--insecure: QUICKSILVER_SECRET_FILE is set; unset it to run without a secret");
  auto secret = transport::Secret::from_file(path);
  if (!secret) return secret.status().with_context(from);
  return std::make_shared<const transport::Secret>(std::move(*secret));
}

// Log lines of a node (refused peers, paused accepts) on stderr.
std::function<void(std::string_view)> stderr_log() {
  return [](std::string_view line) { std::cerr << "quicksilver " << line << std::endl; };
}

void add_role_common(CLI::App* app, RoleFlags* f) {
  f->app = app;
  add_job_file_flag(app, &f->job_file);
  add_sim_flags(app, &f->sim);
  add_secret_flags(app, &f->secret_file, &f->insecure);
  add_settings_flags(app, &f->settings);
  app->add_option("--pacing-rate", f->pacing_rate, "SO_MAX_PACING_RATE per connection, e.g. 2Gbps");
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
    if (used != text.size() - colon - 1 || e.port < 0 || e.port > 65535)
      throw std::out_of_range("port");
  } catch (const std::exception&) {
    return invalid_argument(std::string(flag) + ": bad port in '" + text + "'");
  }
  return e;
}

bool given(const CLI::App* app, const char* flag) {
  return app != nullptr && app->get_option_no_throw(flag) != nullptr &&
         app->get_option(flag)->count() > 0;
}

// `--job FILE` of a role's command: the message a launcher wrote for `role`. Every other
// flag of the command is refused beside it (the file carries the whole job: two sources
// of one setting would disagree sooner or later).
Result<JobMessage> job_file_message(const CLI::App* app, const std::string& file, ChildRole role) {
  std::string others;
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames()[0];
    if (name != "--job") others += (others.empty() ? "" : ", ") + name;
  }
  if (!others.empty()) return invalid_argument("--job carries the whole job; drop " + others);
  auto m = read_job_message(file);
  if (!m) return m.status().with_context("--job");
  if (m->role != role) {
    return invalid_argument(std::string("--job ") + file + ": the job of a " +
                            child_role_name(m->role) + " (run it with `quicksilver " +
                            child_role_name(m->role) + " --job FILE`)");
  }
  return m;
}

Result<TimeNs> time_flag(const std::string& text, const char* flag) {
  auto t = parse_time(text);  // refuses < 0
  if (!t) return t.status().with_context(flag);
  return *t;
}

Result<Rate> rate_flag(const std::string& text, const char* flag) {
  if (text.empty()) return Rate{0};
  auto r = parse_rate(text);
  if (!r) return r.status().with_context(flag);
  return *r;
}

// The flags of `server` or `worker` as the message a launcher would write for it: the job
// flags checked as `simulate` checks them (make_job), then what the role adds. The
// message's mapping (job_options, run_server_job, run_worker_job) does the rest.
Result<JobMessage> role_message(const RoleFlags& f, ChildRole role) {
  const char* id_flag = role == ChildRole::kServer ? "--server-id" : "--worker-id";
  if (!given(f.app, id_flag)) return invalid_argument(std::string(id_flag) + " is required");
  QS_ASSIGN_OR_RETURN(Job job, make_job(f.sim));
  if (job.policies.size() != 1 || f.sim.policy == "all") {
    return invalid_argument("--policy: a server or worker runs exactly one policy");
  }
  if (!job.cluster.worker_bandwidth.empty() || !job.cluster.server_bandwidth.empty() ||
      !job.cluster.server_shares.empty()) {
    return invalid_argument(
        "--worker-bandwidths, --server-bandwidths and --server-shares are the simulator's");
  }
  QS_ASSIGN_OR_RETURN(JobMessage m, job_part(job, job.policies[0]));
  m.role = role;
  m.model = f.sim.model;
  m.device = f.sim.device;
  m.batch_size = f.sim.batch_size;
  m.gloo_algorithm = f.gloo_algorithm;
  QS_ASSIGN_OR_RETURN(m.settings, settings_from_flags(f.settings));
  m.secret_file = f.secret_file;
  m.insecure = f.insecure;
  m.id = f.id;
  m.listen = f.listen;
  m.coordinator = f.coordinator;
  std::stringstream ss(f.servers);
  for (std::string item; std::getline(ss, item, ',');) m.connect.push_back(item);
  m.links = f.links;
  QS_ASSIGN_OR_RETURN(m.pacing_rate, rate_flag(f.pacing_rate, "--pacing-rate"));
  QS_ASSIGN_OR_RETURN(m.nic_rate, rate_flag(f.nic_rate, "--nic-rate"));
  m.slowdown = f.compute_factor;
  m.die_at_iteration = f.die_at_iteration;
  m.announce_start = f.announce_start;
  m.verify = !f.no_verify;
  m.gloo_via = f.gloo_via;
  m.trace = f.sim.trace;
  m.trace_detail = f.sim.trace_detail;
  m.json = f.sim.json;
  return m;
}

// A role's message: --job's file, else its flags.
Result<JobMessage> role_job(const RoleFlags& f, ChildRole role) {
  return f.job_file.empty() ? role_message(f, role) : job_file_message(f.app, f.job_file, role);
}

Result<JobMessage> coordinator_message(const CoordinatorFlags& f) {
  if (!f.job_file.empty()) return job_file_message(f.app, f.job_file, ChildRole::kCoordinator);
  JobMessage m;
  m.role = ChildRole::kCoordinator;
  if (f.architecture != "ps" && f.architecture != "allreduce") {
    return invalid_argument("--architecture must be ps or allreduce");
  }
  QS_ASSIGN_OR_RETURN(m.architecture, parse_architecture(f.architecture));
  m.listen = f.listen;
  m.workers = f.workers;
  m.servers = f.servers;
  QS_ASSIGN_OR_RETURN(m.timeout, time_flag(f.timeout, "--timeout"));
  m.secret_file = f.secret_file;
  m.insecure = f.insecure;
  return m;
}

int run_coordinator_job(const JobMessage& m) {
  auto ep = parse_endpoint(m.listen, "--listen");
  if (!ep) return fail("quicksilver coordinator", ep.status());
  Status size = runtime::check_job_size(m.workers, m.servers);  // bad input first, the secret after
  if (!size.is_ok()) return fail("quicksilver coordinator", size);
  auto secret = load_secret(m.secret_file, m.insecure);
  if (!secret) return fail("quicksilver coordinator", secret.status());
  if (m.architecture == Architecture::kAllReduce) {
    auto store = runtime::StoreServer::create(*ep, m.workers, m.timeout, *secret);
    if (!store) return fail("quicksilver coordinator", store.status());
    std::cout << "listening " << ep->host << ":" << (*store)->port() << std::endl;
    Status s = (*store)->run();
    if (!s.is_ok()) return fail("quicksilver", s, 1);
    return 0;
  }
  runtime::CoordinatorOptions o{*ep, m.workers, m.servers, m.timeout};
  o.secret = *secret;
  o.log = stderr_log();
  auto c = runtime::Coordinator::create(o);
  if (!c) return fail("quicksilver coordinator", c.status());
  std::cout << "listening " << ep->host << ":" << (*c)->port() << std::endl;
  Status s = (*c)->run();
  // The coordinator's messages begin with "coordinator".
  if (!s.is_ok()) return fail("quicksilver", s, 1);
  return 0;
}

}  // namespace

void add_coordinator_flags(CLI::App* app, CoordinatorFlags* f) {
  f->app = app;
  add_job_file_flag(app, &f->job_file);
  app->add_option(
         "--architecture", f->architecture,
         "ps (servers register, workers look them up) or allreduce (the gloo rendezvous store)")
      ->capture_default_str();
  app->add_option("--listen", f->listen,
                  "HOST:PORT to listen on (loopback by default; 0.0.0.0 for every interface)")
      ->capture_default_str();
  add_secret_flags(app, &f->secret_file, &f->insecure);
  app->add_option("--workers", f->workers, "Number of workers of the job")->capture_default_str();
  app->add_option("--servers", f->servers, "Number of servers of the job")->capture_default_str();
  app->add_option("--timeout", f->timeout, "Give up after this long")->capture_default_str();
}

int run_coordinator(const CoordinatorFlags& f) {
  auto m = coordinator_message(f);
  if (!m) return fail("quicksilver coordinator", m.status());
  return run_coordinator_job(*m);
}

void add_server_flags(CLI::App* app, RoleFlags* f) {
  add_role_common(app, f);
  app->add_option("--server-id", f->id, "This server's index, 0..M-1 (required unless --job)");
  app->add_option("--listen", f->listen,
                  "HOST:PORT to listen on (port 0: ephemeral; loopback by default, 0.0.0.0 for "
                  "every interface)")
      ->capture_default_str();
  app->add_option("--coordinator", f->coordinator,
                  "HOST:PORT of the job's coordinator to register with");
}

void add_worker_flags(CLI::App* app, RoleFlags* f) {
  add_role_common(app, f);
  app->add_option("--worker-id", f->id, "This worker's index, 0..N-1 (required unless --job)");
  auto* connect =
      app->add_option("--connect", f->servers, "Server addresses HOST:PORT,... in server-id order");
  app->add_option("--coordinator", f->coordinator,
                  "HOST:PORT of the job's coordinator (instead of --connect)")
      ->excludes(connect);
  app->add_option("--slowdown", f->compute_factor,
                  "Compute slowdown of this worker (1 = profile times)");
  app->add_option("--nic-rate", f->nic_rate, "This host's NIC rate, for the utilisation figure");
  app->add_option("--die-at-iteration", f->die_at_iteration,
                  "Testing: exit abruptly at this iteration")
      ->group("");
  app->add_flag("--announce-start", f->announce_start,
                "Print a line 'training starts' when training begins (before the report)")
      ->group("");
  app->add_option("--gloo-via", f->gloo_via,
                  "Testing: RANK=HOST:PORT, reach that worker's link-0 gloo device through "
                  "HOST:PORT (a fault proxy)")
      ->group("");
  app->add_flag("--no-verify", f->no_verify,
                "Skip the exact check of every summed element (benchmarks: the check costs a pass "
                "over the sums)");
  app->add_option(
      "--link", f->links,
      "--architecture allreduce: this host's address on a link (repeat for DeFT's second link; "
      "default 127.0.0.1, and 127.0.0.2 with --second-link)");
  app->add_option(
      "--gloo-algorithm", f->gloo_algorithm,
      "--architecture allreduce: gloo's algorithm: ring, ring-chunked, halving-doubling, bcube "
      "(default: from --allreduce, ring or rhd)");
}

namespace {

// gloo's algorithm for a worker: --gloo-algorithm, else the simulator's --allreduce where
// gloo has it.
Result<runtime::GlooAlgorithm> gloo_algorithm(const JobMessage& m) {
  if (!m.gloo_algorithm.empty()) return runtime::parse_gloo_algorithm(m.gloo_algorithm);
  if (m.allreduce == AllReduceAlgorithm::kRing) return runtime::GlooAlgorithm::kRing;
  if (m.allreduce == AllReduceAlgorithm::kRecursiveHalvingDoubling)
    return runtime::GlooAlgorithm::kHalvingDoubling;
  return invalid_argument(std::string("--allreduce ") + allreduce_algorithm_name(m.allreduce) +
                          ": gloo has no such algorithm; use ring or rhd, or --gloo-algorithm");
}

// A worker's ending, either architecture: its measured timeline to --trace, its report
// (--json: one line; else the text, then an all-reduce worker's fits and notes).
int print_worker_report(const JobMessage& m, const runtime::WorkerReport& report) {
  if (!m.trace.empty()) {
    SimResult measured;
    measured.policy = report.policy + " measured";
    measured.trace = report.trace;
    SimFlags trace;
    trace.trace = m.trace;
    trace.trace_detail = m.trace_detail;
    Status s = write_trace({measured}, trace);
    if (!s.is_ok()) return fail("quicksilver worker " + std::to_string(m.id), s, 1);
  }
  if (m.json) {
    std::cout << runtime::report_to_json(report) << std::endl;
    return 0;
  }
  std::cout << report.to_string() << std::endl;
  for (std::size_t l = 0; l < report.allreduce_fit.size(); ++l) {
    const AllReduceCost& c = report.allreduce_fit[l];
    std::cout << "link " << l << " all-reduce fit: a = " << format_time(c.a)
              << ", b = " << c.b_ns_per_byte << " ns/B (" << 8.0 / c.b_ns_per_byte << " Gbit/s)"
              << std::endl;
  }
  for (const std::string& n : report.notes) std::cout << n << std::endl;
  return 0;
}

// What a worker of either runtime takes from its message beside the job: the compute
// slowdown, the warm-up, the fault injection, the checks and the trace.
template <typename Options>
void set_worker_part(Options& o, runtime::JobOptions job, const JobMessage& m) {
  o.job = std::move(job);
  o.compute_factor = m.slowdown;
  o.warmup = m.warmup;
  o.die_at_iteration = m.die_at_iteration;
  o.verify = m.verify;
  o.record_trace = !m.trace.empty();
}

int run_collective_job(const JobMessage& m, runtime::JobOptions job,
                       std::shared_ptr<const transport::Secret> secret) {
  const std::string who = "quicksilver worker " + std::to_string(m.id);
  runtime::CollectiveOptions o;
  set_worker_part(o, std::move(job), m);
  o.rank = m.id;
  auto algo = gloo_algorithm(m);
  if (!algo) return fail("quicksilver worker", algo.status());
  o.algorithm = *algo;
  if (m.coordinator.empty())
    return fail("quicksilver worker", "--architecture allreduce needs --coordinator HOST:PORT");
  if (!m.connect.empty())
    return fail("quicksilver worker", "--connect: an all-reduce job has no servers");
  auto coord = parse_endpoint(m.coordinator, "--coordinator");
  if (!coord) return fail("quicksilver worker", coord.status());
  o.store = *coord;
  o.secret = std::move(secret);
  const bool second = m.second_link != 0;
  if (m.links.empty()) {
    o.links = {"127.0.0.1"};
    if (second) o.links.push_back("127.0.0.2");
  } else {
    o.links = m.links;
  }
  for (const std::string& a : o.links) {
    in_addr v4{};
    in6_addr v6{};
    if (inet_pton(AF_INET, a.c_str(), &v4) != 1 && inet_pton(AF_INET6, a.c_str(), &v6) != 1) {
      return fail("quicksilver worker",
                  invalid_argument("--link: '" + a + "' is not an IP address of this host"));
    }
  }
  if (o.links.size() != (second ? 2u : 1u)) {
    return fail(
        "quicksilver worker",
        invalid_argument("--link: give " +
                         std::string(second ? "two addresses (--second-link)" : "one address")));
  }
  if (!m.gloo_via.empty()) {
    const auto eq = m.gloo_via.find('=');
    auto via =
        parse_endpoint(eq == std::string::npos ? "" : m.gloo_via.substr(eq + 1), "--gloo-via");
    if (!via) return fail("quicksilver worker", via.status());
    try {
      o.via_rank = std::stoi(m.gloo_via.substr(0, eq));
    } catch (const std::exception&) {
      return fail("quicksilver worker",
                  invalid_argument("--gloo-via: '" + m.gloo_via + "' is not RANK=HOST:PORT"));
    }
    o.via = *via;
  }
  o.log = [](const std::string& line) { std::cerr << "quicksilver " << line << std::endl; };
  if (!runtime::have_gloo())
    return fail("quicksilver worker", invalid_argument("this quicksilver was built without gloo"));
  auto report = runtime::run_collective_worker(o);
  if (!report) return fail(who, report.status(), 1);
  return print_worker_report(m, *report);
}

int run_server_job(const JobMessage& m) {
  if (m.architecture != Architecture::kPs) {
    return fail("quicksilver server",
                invalid_argument("--architecture: servers exist in the ps architecture only"));
  }
  auto job = job_options(m);
  if (!job) return fail("quicksilver server", job.status());
  auto ep = parse_endpoint(m.listen, "--listen");
  if (!ep) return fail("quicksilver server", ep.status());
  if (!m.trace.empty()) {
    return fail("quicksilver server",
                "--trace: a server records no timeline (give --trace to the workers)");
  }
  auto secret = load_secret(m.secret_file, m.insecure);
  if (!secret) return fail("quicksilver server", secret.status());
  runtime::ServerOptions o;
  o.job = std::move(*job);
  o.server_id = m.id;
  o.listen = *ep;
  o.secret = *secret;
  o.log = stderr_log();
  auto server = runtime::Server::create(std::move(o));
  if (!server) return fail("quicksilver server", server.status());
  // The launcher reads this line to learn an ephemeral port.
  std::cout << "listening " << ep->host << ":" << (*server)->port() << std::endl;
  if (!m.coordinator.empty()) {
    auto coord = parse_endpoint(m.coordinator, "--coordinator");
    Status reg = coord ? runtime::register_server(*coord, m.id, (*server)->port(),
                                                  m.settings.connect_timeout, secret->get())
                       : coord.status();
    if (!reg.is_ok()) return fail("quicksilver server " + std::to_string(m.id), reg);
  }
  Status s = (*server)->run();
  if (!s.is_ok()) return fail("quicksilver server " + std::to_string(m.id), s, 1);
  // The launcher reads this last line: what TCP repaired on this server's connections.
  const runtime::Server::Repairs& rep = (*server)->repairs();
  std::cout << nlohmann::json{{"server", m.id},
                              {"retransmits", rep.retransmits},
                              {"timeouts", rep.timeouts}}
                   .dump()
            << std::endl;
  return 0;
}

int run_worker_job(const JobMessage& m) {
  auto job = job_options(m);
  if (!job) return fail("quicksilver worker", job.status());
  auto secret = load_secret(m.secret_file, m.insecure);
  if (!secret) return fail("quicksilver worker", secret.status());
  if (m.architecture == Architecture::kAllReduce)
    return run_collective_job(m, std::move(*job), *secret);
  runtime::WorkerOptions o;
  set_worker_part(o, std::move(*job), m);
  o.secret = *secret;
  o.worker_id = m.id;
  if (m.announce_start) o.on_training_start = [] { std::cout << "training starts" << std::endl; };
  if (m.connect.empty() && m.coordinator.empty()) {
    return fail("quicksilver worker", "give --connect HOST:PORT,... or --coordinator HOST:PORT");
  }
  if (!m.coordinator.empty()) {
    auto coord = parse_endpoint(m.coordinator, "--coordinator");
    auto list =
        coord ? runtime::lookup_servers(*coord, m.id, m.settings.connect_timeout, secret->get())
              : Result<std::vector<runtime::Endpoint>>(coord.status());
    if (!list) return fail("quicksilver worker " + std::to_string(m.id), list.status());
    o.servers = *list;
  }
  for (const std::string& item : m.connect) {
    auto ep = parse_endpoint(item, "--connect");
    if (!ep) return fail("quicksilver worker", ep.status());
    o.servers.push_back(*ep);
  }
  o.nic_rate = m.nic_rate;
  auto report = runtime::run_worker(o);
  if (!report) return fail("quicksilver worker " + std::to_string(m.id), report.status(), 1);
  return print_worker_report(m, *report);
}

}  // namespace

int run_server_role(const RoleFlags& f) {
  auto m = role_job(f, ChildRole::kServer);
  if (!m) return fail("quicksilver server", m.status());
  return run_server_job(*m);
}

int run_worker_role(const RoleFlags& f) {
  auto m = role_job(f, ChildRole::kWorker);
  if (!m) return fail("quicksilver worker", m.status());
  return run_worker_job(*m);
}
void add_run_flags(CLI::App* app, RunFlags* f) {
  f->app = app;
  add_sim_flags(app, &f->sim);
  add_shared_job_flags(app, &f->sim);  // --job: several jobs at once on the emulated cluster
  app->add_flag("--netns", f->netns,
                "One network namespace per host, links shaped with tc (needs root)");
  app->add_option(
      "--scale", f->scale,
      "Scale bandwidth and tensor sizes by this factor (0: automatic; --netns: calibrated with "
      "every link loaded at once)");
  add_settings_flags(app, &f->settings);
  app->add_option(
      "--rto-min", f->rto_min,
      "--netns: every host route's minimum TCP retransmission timeout (default 5ms, as datacenters "
      "configure it; 0ms: the kernel's 200 ms)");
  app->add_option("--switch-buffer", f->switch_buffer,
                  "--netns: each switch port's buffer (the queue toward a host, where incast "
                  "overflows), as time "
                  "at the link's rate")
      ->capture_default_str();
  app->add_option("--host-queue", f->host_queue,
                  "--netns: each host's own queue (its NIC's, toward the switch), as time at the "
                  "link's rate; "
                  "deep enough that TCP never overflows it, as on a real host (docs/runtime.md)")
      ->capture_default_str();
  app->add_option("--host-gso", f->host_gso,
                  "--netns: the largest packet a host's TCP hands its link (segmentation offload; "
                  "64KiB: the "
                  "kernel's)")
      ->capture_default_str();
  app->add_flag(
      "--quickack", f->quickack,
      "--netns: every host route acknowledges each segment at once (no delayed acknowledgements)");
  f->timeout_option =
      app->add_option("--timeout", f->timeout,
                      "Give up on a policy's run after this long; a --script run is bounded "
                      "only when this is given")
          ->capture_default_str();
  app->add_option(
      "--gloo-algorithm", f->gloo_algorithm,
      "--architecture allreduce: gloo's algorithm: ring, ring-chunked, halving-doubling, bcube "
      "(default: from --allreduce, ring or rhd)");
  app->add_flag("--keep-going", f->keep_going, "Continue with the next policy when one fails");
  app->add_option("--replan-every", f->replan_every,
                  "--policy auto: iterations between decisions (each phase starts the processes "
                  "again)")
      ->capture_default_str();
  app->add_flag("--allow-stale", f->allow_stale,
                "--policy auto: rank DeFT too (its delayed updates change the optimisation)");
  app->add_option("--script", f->script,
                  "Run this PyTorch training script (quicksilver.torch) as --workers processes "
                  "with torchrun's "
                  "environment; every argument after it is the script's")
      ->group("PyTorch");
  app->add_option("--python", f->python,
                  "--script: the Python interpreter (default: the one the build was made for, else "
                  "python3 on "
                  "PATH or /usr/bin/python3, the first that imports torch)")
      ->group("PyTorch");
  app->add_option("--kill-worker", f->kill_worker, "Testing: this worker dies abruptly...")
      ->group("");
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

// The interpreter for Python code: `given` (--python), else choose_python's rule over the
// build's interpreter (QS_BUILD_PYTHON, set by CMake with QS_WITH_TORCH) and $PATH.
Result<std::string> python_interpreter(const std::string& given) {
  PythonSearch search;
  search.given = given;
#ifdef QS_BUILD_PYTHON
  search.build = QS_BUILD_PYTHON;
#endif
  const char* path = std::getenv("PATH");
  search.path = path != nullptr ? path : "";
  return choose_python(search);
}

// --rto-min (default: 5ms with --netns, else none), --switch-buffer, --host-queue,
// --host-gso and --quickack.
Status parse_network_flags(const RunFlags& f, runtime::LinkShaping* s) {
  if (f.rto_min.empty()) {
    s->rto_min = f.netns ? kDefaultRtoMin : 0;
  } else {
    QS_ASSIGN_OR_RETURN(s->rto_min, time_flag(f.rto_min, "--rto-min"));
  }
  QS_ASSIGN_OR_RETURN(s->switch_buffer, time_flag(f.switch_buffer, "--switch-buffer"));
  QS_ASSIGN_OR_RETURN(s->host_queue, time_flag(f.host_queue, "--host-queue"));
  auto gso = parse_size(f.host_gso);
  if (!gso) return gso.status().with_context("--host-gso");
  s->gso_max = *gso;
  s->quickack = f.quickack;
  return Status::ok();
}

// Whether `name` ("--policy") was given on the command line of `run`.
bool flag_given(const RunFlags& f, const char* name) {
  return f.app != nullptr && f.app->get_option_no_throw(name) != nullptr &&
         f.app->get_option(name)->count() > 0;
}

// `run --script`: the workers are the script's processes; quicksilver.torch inside them
// hosts the servers. The package is found beside this executable (build/python).
// The flags a --script run uses: the launch (processes, interpreter, the emulated
// cluster's network, a time bound) and the scheduler it hands the script's
// DistributedOptimizer: --policy, --architecture, --compression and the policy knobs,
// through the environment (QS_POLICY, QS_ARCHITECTURE, QS_COMPRESSION, QS_KNOBS), which
// quicksilver.torch honours, or refuses naming both when the script names another itself.
// Every other flag of `run` is refused (the script builds its model, runs its iterations).
Status script_flags(const RunFlags& f, std::vector<std::pair<std::string, std::string>>* env) {
  static const std::set<std::string> kLaunch = {
      "script",        "python",       "workers",     "netns",    "congestion",     "rto-min",
      "switch-buffer", "host-queue",   "host-gso",    "quickack", "timeout",        "bandwidth",
      "policy",        "architecture", "compression", "help",     "bandwidth-trace"};
  std::set<std::string> knob_flags;
  for (const Knob* k : policy_registry().knobs()) knob_flags.insert(k->flag.substr(2));
  if (f.app != nullptr) {
    for (const CLI::Option* opt : f.app->get_options()) {
      if (opt->count() == 0 || opt->get_lnames().empty()) continue;
      const std::string& name = opt->get_lnames()[0];
      if (kLaunch.count(name) == 0 && knob_flags.count(name) == 0) {
        return invalid_argument(
            "--" + name +
            " does not apply to run --script: the script builds its model and "
            "runs its own loop (run --script takes --workers, --python, --netns and its network "
            "flags, --timeout, and --policy, --architecture, --compression and the policy knobs, "
            "which it hands to the script's DistributedOptimizer)");
      }
      if ((name == "bandwidth" || name == "bandwidth-trace") && !f.netns) {
        return invalid_argument("--" + name +
                                " with --script needs --netns: on loopback the script's traffic "
                                "is not shaped");
      }
    }
  }
  const auto given = [&f](const char* name) { return flag_given(f, name); };
  if (given("--policy")) {
    if (f.sim.policy.find(',') != std::string::npos || f.sim.policy == "all") {
      return invalid_argument("--policy '" + f.sim.policy + "': a script trains with one policy");
    }
    // auto: the script's DistributedOptimizer picks and re-plans (quicksilver/auto.py).
    if (f.sim.policy != "auto" && !policy_registry().is_known(f.sim.policy)) {
      return invalid_argument("--policy: unknown policy '" + f.sim.policy + "'");
    }
    env->emplace_back("QS_POLICY", f.sim.policy);
  }
  if (given("--architecture")) env->emplace_back("QS_ARCHITECTURE", f.sim.architecture);
  // --netns's link rate (the nominal rate the policies plan with) and congestion control.
  if (given("--bandwidth")) env->emplace_back("QS_BANDWIDTH", f.sim.bandwidth);
  if (given("--congestion")) {
    QS_ASSIGN_OR_RETURN(const runtime::RuntimeSettings settings, settings_from_flags(f.settings));
    env->emplace_back("QS_CONGESTION", settings.congestion);
  }
  if (given("--compression")) {
    auto wire = transport::parse_wire_dtype(f.sim.compression);
    if (!wire) return wire.status().with_context("--compression");
    env->emplace_back("QS_COMPRESSION", *wire == transport::WireDType::kFloat32
                                            ? "none"
                                            : transport::wire_dtype_name(*wire));
  }
  std::string knobs;
  PolicyOptions checked;  // each given value must parse as the script's session will parse it
  for (const auto& [name, text] :
       f.sim.knobs) {  // every knob has an entry: the given ones are not empty
    if (text.empty()) continue;
    const Knob* k = policy_registry().find_knob(name);
    QS_RETURN_IF_ERROR(k->parse_bare(text, &checked).with_context(k->flag));
    knobs += (knobs.empty() ? "" : ";") + name + "=" + text;
  }
  for (const auto& [name, on] : f.sim.switches) {
    if (on) knobs += (knobs.empty() ? "" : ";") + name + "=true";
  }
  if (!knobs.empty() && given("--policy") && f.sim.policy == "auto") {
    return invalid_argument("--policy auto tunes the knobs itself: drop " +
                            knobs.substr(0, knobs.find('=')) + " (or give a fixed policy)");
  }
  if (!knobs.empty()) env->emplace_back("QS_KNOBS", knobs);
  return Status::ok();
}

int run_script_command(const RunFlags& f, const std::string& exe) {
  ScriptLaunchOptions o;
  if (Status s = script_flags(f, &o.env); !s.is_ok()) return fail("quicksilver run", s);
  if (runs_under_python(f.script)) {
    auto python = python_interpreter(f.python);
    if (!python) return fail("quicksilver run", python.status());
    o.python = *python;
  }
  o.script = f.script;
  o.args = f.script_args;
  o.workers = f.sim.workers;
  o.python_path = package_dir(exe);
  o.netns = f.netns;
  auto settings = settings_from_flags(f.settings);
  if (!settings) return fail("quicksilver run", settings.status());
  o.congestion = settings->congestion;
  if (Status s = parse_network_flags(f, &o.shaping); !s.is_ok()) return fail("quicksilver", s);
  if (f.netns) {
    auto rate = parse_rate(f.sim.bandwidth);
    if (!rate) return fail("quicksilver", rate.status().with_context("--bandwidth"));
    o.bandwidth = *rate;
    if (!f.sim.bandwidth_trace.empty()) {  // the links' rate over time (a trace, a spec)
      auto sched = BandwidthSchedule::from_spec(f.sim.bandwidth_trace, f.sim.seed);
      if (!sched) return fail("quicksilver", sched.status().with_context("--bandwidth-trace"));
      o.schedule = std::move(*sched);
    }
  }
  auto timeout = parse_time(f.timeout);
  if (!timeout) return fail("quicksilver", timeout.status().with_context("--timeout"));
  // --timeout bounds a policy's run (300 s by default); a script trains as long as it
  // likes unless the flag is given (any value, the default's included).
  const bool timeout_given = f.timeout_option != nullptr && f.timeout_option->count() > 0;
  o.timeout = timeout_given ? *timeout : 0;
  o.log = [](std::string_view m) { std::cerr << "quicksilver run: " << m << "\n"; };
  auto r = run_script(o);
  if (!r) return fail("quicksilver run", r.status());
  if (r->ok()) return 0;
  if (r->timed_out) std::cerr << "quicksilver run: timed out\n";
  if (r->interrupted) std::cerr << "quicksilver run: interrupted\n";
  return r->first_failed >= 0
             ? std::max(1, r->exit_codes[static_cast<std::size_t>(r->first_failed)])
             : 1;
}

}  // namespace

int run_profile(const std::vector<std::string>& args, const std::string& python,
                const std::string& exe) {
  // A build tree has the package beside the executable (build/python); a pip install has
  // it in the interpreter's own site-packages, where the bootstrap below finds it or says
  // what to do.
  const std::string pkg = package_dir(exe);
  auto interpreter = python_interpreter(python);
  if (!interpreter) return fail("quicksilver profile", interpreter.status());
  if (!pkg.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = pkg + (old != nullptr && *old != '\0' ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  const std::string bootstrap =
      "import importlib.util, runpy, sys\n"
      "try:\n"
      "    if importlib.util.find_spec('quicksilver.profile') is None:\n"
      "        raise ImportError('no quicksilver.profile')\n"
      "except ImportError as e:\n"
      "    sys.exit('quicksilver profile: ' + sys.executable + ' cannot import the quicksilver "
      "package (' + str(e) +\n"
      "             '): install it into that interpreter with `pip install .` from the source "
      "tree, or build with '\n"
      "             'scripts/build.sh and run build/quicksilver (it finds build/python), or name "
      "another with --python')\n"
      "sys.argv[0] = 'quicksilver profile'\n"
      "runpy.run_module('quicksilver.profile', run_name='__main__', alter_sys=True)\n";
  std::vector<std::string> argv_s{*interpreter, "-m", "quicksilver.profile"};
  if (pkg.empty()) argv_s = {*interpreter, "-c", bootstrap};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv_s[0].c_str(), argv.data());
  return fail("quicksilver profile",
              "cannot execute " + *interpreter + ": " + std::strerror(errno));
}

int run_cleanup(bool dry_run) {
  const StaleCleanup c = cleanup_stale_runs(dry_run);
  const char* verb = dry_run ? "would remove " : "removed ";
  for (const std::string& r : c.removed) std::cout << verb << r << "\n";
  for (const std::string& l : c.live) std::cout << "kept " << l << "\n";
  for (const std::string& e : c.errors)
    std::cerr << "quicksilver cleanup: cannot remove " << e << "\n";
  if (c.removed.empty() && c.errors.empty()) std::cout << "nothing to clean up\n";
  if (Status s = runtime::NetnsCluster::available(); !s.is_ok()) {
    std::cout << "(only temporary directories were looked at: " << s.message()
              << "; namespaces, bridges and the allowed congestion controls need it)\n";
  }
  return c.errors.empty() ? 0 : 1;
}

namespace {

// `run --policy auto` without --script: the job's flags as the start policy's (make_job
// refuses "auto", which names no policy of the registry), then the policies {"auto"}.
// Knob flags are refused (auto tunes them), as are --replan-every and --allow-stale without it.
Result<Job> make_run_job(const RunFlags& f) {
  const bool given_auto = f.sim.policy == "auto";
  const auto given = [&f](const char* name) { return flag_given(f, name); };
  if (!given_auto && (given("--replan-every") || given("--allow-stale"))) {
    return invalid_argument(
        std::string(given("--replan-every") ? "--replan-every" : "--allow-stale") +
        " applies to --policy auto only");
  }
  if (!given_auto && ("," + f.sim.policy + ",").find(",auto,") != std::string::npos) {
    return invalid_argument("--policy auto runs alone (it chooses among the policies itself)");
  }
  if (!given_auto) return make_job(f.sim);
  for (const char* flag : {"--trace", "--keep-going"}) {
    if (given(flag)) {
      return invalid_argument(std::string(flag) +
                              " does not apply to --policy auto: its phases are runs of their "
                              "own (give a fixed policy, or several)");
    }
  }
  std::vector<std::string> knobs_given;  // value knobs given a value, switches turned on
  for (const auto& [name, text] : f.sim.knobs) {
    if (!text.empty()) knobs_given.push_back(name);
  }
  for (const auto& [name, on] : f.sim.switches) {
    if (on) knobs_given.push_back(name);
  }
  if (!knobs_given.empty()) {
    return invalid_argument("--policy auto tunes the knobs itself: drop " +
                            policy_registry().find_knob(knobs_given.front())->flag +
                            " (or give a fixed policy)");
  }
  SimFlags start = f.sim;
  QS_ASSIGN_OR_RETURN(const Architecture arch, parse_architecture(f.sim.architecture));
  start.policy = auto_start_policy(arch);
  QS_ASSIGN_OR_RETURN(Job job, make_job(start));
  job.policies = {"auto"};
  return job;
}

}  // namespace

int run_cluster(const RunFlags& f, const std::string& exe) {
  if (!f.script.empty()) return run_script_command(f, exe);
  auto job = make_run_job(f);
  if (!job) return fail("quicksilver", job.status());
  if (f.sim.policy == "all") {
    // The oracle moves no byte: there is nothing to run (its figure is the simulator's).
    std::erase_if(job->policies,
                  [](const std::string& p) { return !policy_registry().communicates(p); });
  }
  LaunchOptions o;
  if (!f.sim.jobs.empty()) {
    // Their TCP connections share the links; each job's workers compute on their own.
    if (f.sim.job_sharing != "fair") {
      return fail("quicksilver",
                  invalid_argument("--job-sharing " + f.sim.job_sharing +
                                   ": the runtime's jobs share the links as their TCP connections "
                                   "do (fair); the other sharings are the simulator's"));
    }
    auto jobs = parse_shared_jobs(f.sim, *job);
    if (!jobs) return fail("quicksilver", jobs.status());
    o.shared_jobs = std::move(*jobs);
  } else if (f.sim.job_sharing != "fair" || f.sim.separate_gpus) {
    return fail("quicksilver", invalid_argument("--job-sharing and --separate-gpus need --job"));
  }
  o.executable = exe;
  o.auto_replan_every = f.replan_every;
  o.auto_allow_stale = f.allow_stale;
  o.netns = f.netns;
  o.scale = f.scale;
  o.keep_going = f.keep_going;
  o.kill_worker = f.kill_worker;
  o.kill_at_iteration = f.kill_at_iteration;
  auto timeout = parse_time(f.timeout);
  if (!timeout) return fail("quicksilver", timeout.status().with_context("--timeout"));
  o.timeout = *timeout;
  auto settings = settings_from_flags(f.settings);
  if (!settings) return fail("quicksilver", settings.status());
  o.settings = *settings;
  if (Status s = parse_network_flags(f, &o.shaping); !s.is_ok()) return fail("quicksilver", s);
  if (!f.gloo_algorithm.empty()) {
    auto a = runtime::parse_gloo_algorithm(f.gloo_algorithm);
    if (!a) return fail("quicksilver", a.status());
  } else if (job->cluster.architecture == Architecture::kAllReduce && f.sim.allreduce != "ring" &&
             f.sim.allreduce != "rhd") {
    // Refused here, before any process starts (each worker would refuse it too).
    return fail(
        "quicksilver",
        invalid_argument("--allreduce " + f.sim.allreduce +
                         ": gloo has no such algorithm; use ring or rhd, or --gloo-algorithm"));
  }
  o.gloo_algorithm = f.gloo_algorithm;
  o.log = [](std::string_view m) {
    std::cerr << ("quicksilver run: " + std::string(m) + "\n") << std::flush;
  };
  auto run = [&] {
    Progress progress("quicksilver run", f.sim.json);  // stops before the table is printed
    progress.set("starting");
    o.progress = [&progress](std::string_view what) { progress.set(std::string(what)); };
    return qs::run_cluster(std::move(*job), o);
  }();
  if (!run) return fail("quicksilver run", run.status());
  int rc = run->failures.empty() ? 0 : 1;
  if (run->interrupted) {
    std::cerr << "quicksilver run: interrupted (the cluster's processes, namespaces and files are "
                 "removed)\n";
    rc = 1;
  }
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
    Status s = write_trace(traced, f.sim);
    if (!s.is_ok()) rc = fail("quicksilver run", s, 1);
  }
  if (!run->rows.empty()) {
    if (f.sim.json) {
      const MeasuredConfig m{run->goodput_fraction, run->calibration,   run->calibration_cpu_idle,
                             run->rto_min,          run->switch_buffer, run->host_queue,
                             run->gso_max,          run->scale};
      print_json(run->job, run->rows, &m);
    } else {
      print_table(run->job, run->rows, run->describe());
      if (!run->calibration.empty()) std::printf("  calibration: %s\n", run->calibration.c_str());
    }
  }
  return rc;
}

}  // namespace qs::cli
