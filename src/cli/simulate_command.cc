#include <algorithm>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "progress.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/transport/wire.h"

namespace qs::cli {
namespace {

// Who reads a knob, for its help: the architecture when every communicating policy of it
// does ("ps"), else the policies ("bytescheduler/usbyte").
std::string knob_scope(const Knob& k) {
  const PolicyRegistry& reg = policy_registry();
  const std::vector<std::string> users = reg.policies_using(k.name);
  for (Architecture a : {Architecture::kPs, Architecture::kAllReduce}) {
    bool all = true;
    for (const std::string& n : reg.names(a)) {
      const auto& knobs = reg.find(n, a)->knobs;
      all &= !reg.find(n, a)->communicates ||
             std::find(knobs.begin(), knobs.end(), k.name) != knobs.end();
    }
    if (all) return architecture_name(a);
  }
  std::string s;
  for (const std::string& n : users) s += (s.empty() ? "" : "/") + n;
  return s;
}

// One flag per registered knob (include/policy/quicksilver/policy/registry.h), in table order.
void add_knob_flags(CLI::App* app, SimFlags* f) {
  const PolicyOptions defaults;
  for (const Knob* k : policy_registry().knobs()) {
    const std::string help =
        knob_scope(*k) + ": " + k->help + " (default " + k->display(defaults) + ")";
    if (k->type == KnobType::kBool) {
      app->add_flag(k->flag, f->switches[k->name], help);
    } else {
      app->add_option(k->flag, f->knobs[k->name], help);
    }
  }
}

}  // namespace

void add_sim_flags(CLI::App* app, SimFlags* f) {
  app->add_option("--model", f->model,
                  "Built-in model name (see `quicksilver models`) or a profile JSON file")
      ->capture_default_str();
  app->add_option("--device", f->device,
                  "Device model for built-in profiles: k80, gtx1080ti, v100, rtx3090, a100")
      ->capture_default_str();
  app->add_option("--batch-size", f->batch_size, "Per-worker batch size (0 = the model's default)");
  app->add_option("--policy", f->policy,
                  "Policies, comma-separated, or 'all' (every policy of the architecture)")
      ->capture_default_str();
  app->add_option("--workers", f->workers, "Number of workers")->capture_default_str();
  app->add_option("--servers", f->servers, "Number of parameter servers (ps)")
      ->capture_default_str();
  app->add_option("--architecture", f->architecture, "ps or allreduce")->capture_default_str();
  app->add_option("--bandwidth", f->bandwidth, "Each host's NIC rate per direction, e.g. 10Gbps")
      ->capture_default_str();
  app->add_option("--latency", f->latency,
                  "One-way per-message latency (all-reduce: alpha), e.g. 50us")
      ->capture_default_str();
  app->add_option("--allreduce", f->allreduce, "All-reduce algorithm: ring, tree, rd, rhd")
      ->capture_default_str();
  add_knob_flags(app, f);
  app->add_option(
      "--bandwidth-trace", f->bandwidth_trace,
      "Time-varying bandwidth: a trace file of 'TIME RATE' lines, or random:MIN:MAX:PERIOD[:SEED]");
  app->add_option(
      "--compute-factor", f->compute_factor,
      "Per-worker compute slowdown: a comma list of N factors, or W=F pairs (e.g. 3=2.0)");
  app->add_option(
      "--worker-bandwidths", f->worker_bandwidths,
      "ps simulator: each worker's NIC rate, a comma list of N rates or W=RATE pairs (others at "
      "--bandwidth), e.g. 3=5Gbps");
  app->add_option("--server-bandwidths", f->server_bandwidths,
                  "ps simulator: each server's NIC rate, a comma list of M rates or S=RATE pairs, "
                  "e.g. 0=2.5Gbps");
  app->add_option(
      "--server-shares", f->server_shares,
      "ps simulator: the share of the parameters each server holds, a comma list of M weights or "
      "S=W pairs (others 1), e.g. 2,1,1,1 (default: equal, the balanced placement)");
  app->add_option("--reduction-rate", f->reduction_rate,
                  "All-reduce: reduction rate (gamma = 1/rate), e.g. 80GB/s");
  app->add_option("--allreduce-a", f->allreduce_a, "All-reduce: a of T=a+bM directly (a time)");
  app->add_option("--allreduce-b", f->allreduce_b,
                  "All-reduce: b of T=a+bM directly, as a rate (M/b per byte)");
  app->add_option("--allreduce-fit", f->allreduce_fit,
                  "All-reduce: fit a and b to a file of 'SIZE TIME' lines");
  app->add_option("--compression", f->compression,
                  "Gradient elements on the wire: none (float32), bf16 or fp16 (half the bytes; "
                  "sums in float32)")
      ->capture_default_str();
  app->add_option(
      "--second-link", f->second_link,
      "all-reduce: add a second link this many times slower than the first (DeFT III-C; 0 = none)");
  app->add_flag("--overlapping-pulls", f->overlapping_pulls,
                "ps simulator: pulls overlap each other as in the Mercury paper's eq. 7, instead "
                "of queuing on "
                "the server's uplink and the worker's downlink");
  app->add_option(
      "--frame-header", f->frame_header,
      "ps simulator: header bytes each frame (packet, partition, slice) adds on the wire, e.g. 24B "
      "(default 0B)");
  app->add_option("--frame-cpu", f->frame_cpu,
                  "ps simulator: time each frame holds a link beyond its bytes (the transport's "
                  "CPU per frame), "
                  "e.g. 1us (default 0)");
  app->add_option(
      "--link-burst", f->link_burst,
      "ps simulator: every link is a token bucket this deep, as tbf shapes the emulated cluster: a "
      "frame leaves at once for the bytes it holds (refilled at the rate while idle), e.g. 68KiB "
      "(default 0: none; the links --link-sharing fair shares as flows have none)");
  app->add_option(
      "--ack-queue", f->ack_queue,
      "ps simulator: acknowledgements wait behind pulls queued on the server's uplink and the "
      "worker's downlink, up to this long, e.g. 2ms (default 0: latency only)");
  app->add_option(
      "--link-sharing", f->link_sharing,
      "ps simulator: how the messages in flight share a link: fair (as TCP connections: each "
      "host sends to every peer at once, max-min fair over uplinks and downlinks) or fifo (one "
      "message after another per link); Mercury's packets, stop-and-wait p3 and several jobs "
      "(but --job-sharing flows) keep fifo (default fifo)");
  app->add_option("--iterations", f->iterations, "Iterations to simulate (warm-up included)")
      ->capture_default_str();
  app->add_option("--warmup", f->warmup, "Leading iterations left out of the summary")
      ->capture_default_str();
  app->add_option(
         "--statistic", f->statistic,
         "How the iterations after the warm-up are summarised: median (steady state) or mean "
         "(throughput over the run; for a time-varying --bandwidth-trace)")
      ->capture_default_str();
  app->add_option("--seed", f->seed, "Random seed")->capture_default_str();
  app->add_flag("--json", f->json, "Print one JSON object instead of the table");
  app->add_option("--trace", f->trace, "Write a Chrome trace (open in Perfetto) to this file");
  app->add_option("--trace-detail", f->trace_detail,
                  "--trace: fine (every packet), coarse (a tensor's consecutive packets as one "
                  "span), or auto: "
                  "coarse when the fine trace would exceed 10 MB")
      ->capture_default_str();
}

void add_shared_job_flags(CLI::App* app, SimFlags* f) {
  app->add_option(
      "--job", f->jobs,
      "ps: one of several jobs sharing the cluster, MODEL[:POLICY[:BATCH]] (repeat it; the policy "
      "defaults to --policy when that names one; knobs apply to every job; run: with --netns, at "
      "once "
      "on the same hosts)");
  app->add_option("--job-sharing", f->job_sharing,
                  "with --job: how a link serves the jobs' queues: fair (round robin, each job's "
                  "own scheduler), "
                  "strict (job order), deadline (the unit whose layer's next forward comes "
                  "soonest, across jobs), flows (the "
                  "jobs' messages in flight at once, sharing each link max-min fairly, as TCP "
                  "connections); run: fair")
      ->capture_default_str();
  app->add_flag("--separate-gpus", f->separate_gpus,
                "with --job: each job has GPUs of its own (default: shared; run: always its own)");
}

namespace {

// A value per host: a comma list of `hosts` values, or I=VALUE pairs (the others at
// `fallback`). `parse` reads one value. Errors name the flag. The count of a plain list is
// checked by ClusterConfig::validate().
template <typename T, typename Parse>
Status parse_host_list(const std::string& text, int hosts, const char* flag, const char* host,
                       T fallback, Parse parse, std::vector<T>* out) {
  if (text.empty()) return Status::ok();
  if (text.size() > 1'000'000)
    return invalid_argument(std::string(flag) + ": longer than 1000000 characters");
  std::vector<std::string> items;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) items.push_back(item);
  const bool pairs = text.find('=') != std::string::npos;
  if (pairs) out->assign(static_cast<std::size_t>(hosts), fallback);
  for (const std::string& item : items) {
    std::string value = item;
    int index = -1;
    if (pairs) {
      const auto eq = item.find('=');
      std::size_t used = 0;
      try {
        if (eq == std::string::npos) throw std::invalid_argument(item);
        index = std::stoi(item.substr(0, eq), &used);
      } catch (const std::exception&) {
        return invalid_argument(std::string(flag) + ": cannot read '" + item + "'");
      }
      if (used != eq) return invalid_argument(std::string(flag) + ": cannot read '" + item + "'");
      if (index < 0 || index >= hosts) {
        return invalid_argument(std::string(flag) + ": " + host + " " + std::to_string(index) +
                                " does not exist");
      }
      value = item.substr(eq + 1);
    }
    Result<T> v = parse(value);
    if (!v)
      return invalid_argument(std::string(flag) + ": cannot read '" + item +
                              "': " + v.status().message());
    if (pairs) {
      (*out)[static_cast<std::size_t>(index)] = *v;
    } else {
      out->push_back(*v);
    }
  }
  return Status::ok();
}

Result<double> parse_number(const std::string& text) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return invalid_argument("not a number");
}

}  // namespace

Result<Job> make_job(const SimFlags& f) {
  Job job;
  auto profile = load_model(f.model, f.device, f.batch_size);
  if (!profile) return profile.status().with_context("--model");
  job.profile = std::move(*profile);
  if (f.batch_size < 0) return invalid_argument("--batch-size must be >= 0");

  QS_ASSIGN_OR_RETURN(job.cluster.architecture, parse_architecture(f.architecture));
  job.cluster.workers = f.workers;
  job.cluster.servers = f.servers;
  auto bw = parse_rate(f.bandwidth);
  if (!bw) return bw.status().with_context("--bandwidth");
  job.cluster.bandwidth = *bw;
  auto lat = parse_time(f.latency);
  if (!lat) return lat.status().with_context("--latency");
  job.cluster.latency = *lat;
  auto algo = parse_allreduce_algorithm(f.allreduce);
  if (!algo) return algo.status().with_context("--allreduce");
  job.cluster.allreduce = *algo;
  if (!f.bandwidth_trace.empty()) {
    auto sched = BandwidthSchedule::from_spec(f.bandwidth_trace, f.seed);
    if (!sched) return sched.status().with_context("--bandwidth-trace");
    if (sched->is_constant()) {
      job.cluster.bandwidth = sched->rate_at(0);  // a constant trace is just a rate
    } else {
      job.cluster.schedule = std::move(*sched);
    }
  }
  if (f.workers < 1 || f.workers > 4096) return invalid_argument("--workers must be in 1..4096");
  QS_RETURN_IF_ERROR(parse_host_list(f.compute_factor, f.workers, "--compute-factor", "worker", 1.0,
                                     parse_number, &job.cluster.compute_factor));
  if ((!f.server_bandwidths.empty() || !f.server_shares.empty()) &&
      (f.servers < 1 || f.servers > 4096)) {
    return invalid_argument("--servers must be in 1..4096");
  }
  auto rate = [](const std::string& t) { return parse_rate(t); };
  QS_RETURN_IF_ERROR(parse_host_list(f.worker_bandwidths, f.workers, "--worker-bandwidths",
                                     "worker", job.cluster.bandwidth, rate,
                                     &job.cluster.worker_bandwidth));
  QS_RETURN_IF_ERROR(parse_host_list(f.server_bandwidths, f.servers, "--server-bandwidths",
                                     "server", job.cluster.bandwidth, rate,
                                     &job.cluster.server_bandwidth));
  QS_RETURN_IF_ERROR(parse_host_list(f.server_shares, f.servers, "--server-shares", "server", 1.0,
                                     parse_number, &job.cluster.server_shares));
  if (!f.reduction_rate.empty()) {
    auto r = parse_rate(f.reduction_rate);
    if (!r) return r.status().with_context("--reduction-rate");
    job.cluster.reduction_rate = *r;
  }
  if (!f.allreduce_fit.empty()) {
    auto fit = fit_allreduce_cost(f.allreduce_fit);
    if (!fit) return fit.status().with_context("--allreduce-fit");
    job.cluster.allreduce_a = fit->a;
    job.cluster.allreduce_b_ns_per_byte = fit->b_ns_per_byte;
  }
  if (!f.allreduce_a.empty()) {
    auto a = parse_time(f.allreduce_a);
    if (!a) return a.status().with_context("--allreduce-a");
    job.cluster.allreduce_a = *a;
  }
  if (!f.allreduce_b.empty()) {
    auto b = parse_rate(f.allreduce_b);
    if (!b) return b.status().with_context("--allreduce-b");
    job.cluster.allreduce_b_ns_per_byte = 1e9 / b->bytes_per_second();
  }

  if (f.second_link != 0 && !(f.second_link >= 1 && f.second_link < 1e6)) {
    return invalid_argument("--second-link must be 0 (none) or a slowdown >= 1");
  }
  job.cluster.second_link_slowdown = f.second_link;
  {
    auto parsed = transport::parse_wire_dtype(f.compression);
    if (!parsed) return parsed.status().with_context("--compression");
    const transport::WireDType wire = *parsed;
    job.cluster.compression = transport::wire_dtype_name(wire);
    job.cluster.wire_element_bytes = transport::wire_dtype_size(wire);
    if (wire != transport::WireDType::kFloat32) job.cluster.convert_ns_per_element = 0.35;
  }
  job.cluster.overlapping_pulls = f.overlapping_pulls;
  if (!f.frame_header.empty()) {
    auto h = parse_size(f.frame_header);
    if (!h) return h.status().with_context("--frame-header");
    job.cluster.frame_header = *h;
  }
  if (!f.link_sharing.empty()) {
    auto l = parse_link_sharing(f.link_sharing);
    if (!l) return l.status().with_context("--link-sharing");
    job.cluster.link_sharing = *l;
  }
  if (!f.ack_queue.empty()) {
    auto q = parse_time(f.ack_queue);
    if (!q) return q.status().with_context("--ack-queue");
    job.cluster.ack_queue = *q;
  }
  if (!f.link_burst.empty()) {
    auto b = parse_size(f.link_burst);
    if (!b) return b.status().with_context("--link-burst");
    job.cluster.link_burst = *b;
  }
  if (!f.frame_cpu.empty()) {
    auto c = parse_time(f.frame_cpu);
    if (!c) return c.status().with_context("--frame-cpu");
    job.cluster.frame_cpu = *c;
  }
  QS_RETURN_IF_ERROR(job.cluster.validate());
  PolicyOptions& po = job.policy_options;
  for (const Knob* k : policy_registry().knobs()) {
    if (k->type == KnobType::kBool) {
      auto it = f.switches.find(k->name);
      if (it != f.switches.end() && it->second) QS_RETURN_IF_ERROR(k->parse("true", &po));
      continue;
    }
    auto it = f.knobs.find(k->name);
    if (it != f.knobs.end() && !it->second.empty()) QS_RETURN_IF_ERROR(k->parse(it->second, &po));
  }
  po.seed = f.seed;

  if (f.policy == "all") {
    job.policies = job.cluster.architecture == Architecture::kPs ? ps_policy_names()
                                                                 : allreduce_policy_names();
  } else {
    std::stringstream ss(f.policy);
    for (std::string p; std::getline(ss, p, ',');) {
      if (p.empty()) continue;
      if (p == "auto") {
        return invalid_argument(
            "--policy auto: the job chooses its policy as it runs, from its own measurements "
            "(run --policy auto, run --script S --policy auto, or DistributedOptimizer(policy="
            "\"auto\")); to rank the policies for this job beforehand, use quicksilver advise");
      }
      if (!is_known_policy(p)) {
        std::string known;
        for (const auto& n : all_policy_names()) known += (known.empty() ? "" : ", ") + n;
        return invalid_argument("--policy: unknown policy '" + p + "' (known: " + known +
                                ", or all)");
      }
      job.policies.push_back(p);
    }
    if (job.policies.empty()) return invalid_argument("--policy: no policy given");
  }
  if (f.iterations < 1) return invalid_argument("--iterations must be >= 1");
  if (f.warmup < 0) return invalid_argument("--warmup must be >= 0");
  job.sim.iterations = f.iterations;
  job.sim.warmup = std::min(f.warmup, f.iterations - 1);
  if (f.statistic == "median") {
    job.sim.statistic = Statistic::kMedian;
  } else if (f.statistic == "mean") {
    job.sim.statistic = Statistic::kMean;
  } else {
    return invalid_argument("--statistic: '" + f.statistic + "' is neither median nor mean");
  }
  job.sim.seed = f.seed;
  job.sim.record_trace = !f.trace.empty();
  if (auto detail = parse_trace_detail(f.trace_detail); !detail)
    return detail.status().with_context("--trace-detail");
  if (f.trace.empty() && f.trace_detail != "auto")
    return invalid_argument("--trace-detail needs --trace FILE");
  return job;
}

int run_models(const std::string& device_name, bool json) {
  auto device = find_device(device_name);
  if (!device) return fail("quicksilver", device.status().with_context("--device"));
  if (json) {
    std::cout << "{\"device\": \"" << (*device)->name << "\", \"models\": [";
    bool first = true;
    for (const ZooModel& m : zoo_models()) {
      Profile p = make_zoo_profile(m, **device);
      std::cout << (first ? "" : ", ") << "{\"name\": \"" << m.name
                << "\", \"layers\": " << p.num_layers() << ", \"tensors\": " << p.num_tensors()
                << ", \"parameters\": " << p.total_parameters()
                << ", \"bytes\": " << p.total_bytes() << ", \"batch_size\": " << p.batch_size
                << ", \"compute_ms\": " << to_ms(p.compute_time()) << "}";
      first = false;
    }
    std::cout << "]}\n";
    return 0;
  }
  std::printf(
      "Built-in models; compute per iteration on %s (%.1f TFLOPS sustained; forward = batch x\n"
      "FLOPs / rate or memory bound, backward = 2 x forward; see docs/zoo.md). --device picks "
      "another.\n\n",
      (*device)->display_name.c_str(), (*device)->sustained_tflops);
  std::printf("%-14s %-12s %6s %7s %13s %10s %6s %12s\n", "name", "input", "layers", "tensors",
              "parameters", "MB", "batch", "compute/iter");
  for (const ZooModel& m : zoo_models()) {
    Profile p = make_zoo_profile(m, **device);
    std::printf("%-14s %-12s %6d %7d %13lld %10.1f %6d %10.2fms\n", m.name.c_str(), m.input.c_str(),
                p.num_layers(), p.num_tensors(), static_cast<long long>(p.total_parameters()),
                static_cast<double>(p.total_bytes()) / 1e6, p.batch_size, to_ms(p.compute_time()));
  }
  return 0;
}

int fail(std::string_view prefix, std::string_view message, int code) {
  std::cerr << prefix << ": " << message << "\n";
  return code;
}

Result<std::vector<SharedJob>> parse_shared_jobs(const SimFlags& f, const Job& job) {
  if (static_cast<int>(f.jobs.size()) > kMaxSharedJobs) {
    return invalid_argument("--job: at most " + std::to_string(kMaxSharedJobs) + " jobs");
  }
  std::vector<SharedJob> jobs;
  for (const std::string& spec : f.jobs) {
    const std::string where = "--job '" + spec.substr(0, 200) + "'";
    std::vector<std::string> parts;
    std::stringstream ss(spec);
    for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
    if (spec.empty() || spec.size() > 4096 || parts.empty() || parts.size() > 3 ||
        parts[0].empty()) {
      return invalid_argument(where + ": expected MODEL[:POLICY[:BATCH]]");
    }
    int batch = f.batch_size;
    if (parts.size() == 3) {
      try {
        std::size_t used = 0;
        batch = std::stoi(parts[2], &used);
        if (used != parts[2].size() || batch < 1 || batch > 1'000'000)
          throw std::invalid_argument(parts[2]);
      } catch (const std::exception&) {
        return invalid_argument(where + ": the batch must be an integer in 1..1000000");
      }
    }
    auto profile = load_model(parts[0], f.device, batch);
    if (!profile) return profile.status().with_context(where);
    std::string policy = parts.size() >= 2 && !parts[1].empty() ? parts[1] : "";
    if (policy.empty()) {
      if (job.policies.size() != 1 || f.policy == "all") {
        return invalid_argument(where + ": name its policy (MODEL:POLICY) or give --policy one");
      }
      policy = job.policies[0];
    }
    jobs.push_back(SharedJob{std::move(*profile), policy, job.policy_options});
  }
  return jobs;
}

// simulate --job ...: several jobs sharing the cluster (simulate_shared).
Status write_trace(const std::vector<SimResult>& results, const SimFlags& f) {
  auto detail = parse_trace_detail(f.trace_detail);
  if (!detail) return detail.status().with_context("--trace-detail");
  auto written = write_chrome_trace(results, f.trace, *detail);
  if (!written) return written.status().with_context("--trace");
  std::cerr << "quicksilver: " << written->describe(f.trace) << std::endl;
  return Status::ok();
}

int run_shared(const SimFlags& f, const Job& job) {
  auto sharing = parse_job_sharing(f.job_sharing);
  if (!sharing) return fail("quicksilver", sharing.status().with_context("--job-sharing"));
  auto parsed = parse_shared_jobs(f, job);
  if (!parsed) return fail("quicksilver", parsed.status());
  const std::vector<SharedJob>& jobs = *parsed;
  const SharingOptions options{*sharing, !f.separate_gpus};
  auto results = simulate_shared(jobs, job.cluster, job.sim, options);
  if (!results) return fail("quicksilver", results.status());
  if (!f.trace.empty()) {
    if (Status s = write_trace(*results, f); !s.is_ok()) return fail("quicksilver", s);
  }
  print_shared(job, jobs, *results, options, f.json);
  return 0;
}

int run_simulate(const SimFlags& f) {
  auto job = make_job(f);
  if (!job) return fail("quicksilver", job.status());
  if (!f.jobs.empty()) return run_shared(f, *job);
  if (f.job_sharing != "fair" || f.separate_gpus) {
    return fail("quicksilver", invalid_argument("--job-sharing and --separate-gpus need --job"));
  }
  auto rows = [&] {
    Progress progress("quicksilver simulate", f.json);
    progress.set("simulating " + std::to_string(job->policies.size()) + " policies");
    return simulate(*job);
  }();
  if (!rows) return fail("quicksilver", rows.status());
  if (!f.trace.empty()) {
    std::vector<SimResult> results;
    for (const Row& row : *rows) results.push_back(row.result);
    if (Status s = write_trace(results, f); !s.is_ok()) return fail("quicksilver", s);
  }
  if (f.json) {
    print_json(*job, *rows);
  } else {
    print_table(*job, *rows, "simulated");
  }
  return 0;
}

int run_policies(bool markdown, const std::string& architecture) {
  auto arch = parse_architecture(architecture);
  if (!arch) return fail("quicksilver", arch.status().with_context("--architecture"));
  if (markdown) {
    std::cout << knob_markdown(*arch);
    return 0;
  }
  const PolicyRegistry& reg = policy_registry();
  for (const std::string& n : reg.names(*arch)) {
    const PolicySpec* p = reg.find(n, *arch);
    std::string knobs;
    for (const std::string& k : p->knobs)
      knobs += (knobs.empty() ? "" : ", ") + reg.find_knob(k)->flag;
    std::printf("%-18s %s%s\n", n.c_str(), p->summary.c_str(),
                knobs.empty() ? "" : ("; knobs: " + knobs).c_str());
  }
  return 0;
}

}  // namespace qs::cli
