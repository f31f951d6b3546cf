// The Python module `quicksilver._quicksilver` (pybind11): the Session and its job, for the
// thin layer python/quicksilver/torch.py. It never touches a torch object: tensors arrive
// as (data pointer, element count) pairs that the Python layer checked (float32,
// contiguous, CPU) and keeps referenced. So it does not depend on torch's C++ ABI or
// version (one build serves PyTorch 1.13 and 2.x), and compiles without torch's headers.
// Errors become quicksilver.QuicksilverError (a RuntimeError) or ValueError, with the
// message the library wrote; calls that wait release the GIL.
#include <execinfo.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "quicksilver/policy/registry.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/runtime/settings.h"
#include "quicksilver/runtime/store.h"
#include "quicksilver/torch/planner.h"
#include "quicksilver/torch/session.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/crc32c.h"

namespace py = pybind11;

namespace {

struct QuicksilverError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void raise(const qs::Status& s) {
  if (s.code() == qs::StatusCode::kInvalidArgument) throw py::value_error(s.message());
  throw QuicksilverError(s.to_string());
}
void check(const qs::Status& s) {
  if (!s.is_ok()) raise(s);
}
template <typename T>
T take(qs::Result<T> r) {
  if (!r.is_ok()) raise(r.status());
  return std::move(r).value();
}

qs::TimeNs seconds(double s) { return static_cast<qs::TimeNs>(s * 1e9); }

// Runtime settings from Python ({"peer_timeout": 600.0, "congestion": "cubic"}), by the
// table's names: a time in seconds, a switch a bool, a word a str; None keeps the default.
void set_settings(qs::runtime::RuntimeSettings& out, const py::dict& given) {
  namespace rt = qs::runtime;
  for (const auto& [key, value] : given) {
    const std::string name = py::str(key);
    const rt::RuntimeSetting& s = *take(rt::find_setting(name));
    if (value.is_none()) continue;
    const bool ok = s.kind == rt::SettingKind::kText ? py::isinstance<py::str>(value)
                    : s.kind == rt::SettingKind::kSwitch
                        ? py::isinstance<py::bool_>(value)
                        : py::isinstance<py::float_>(value) || (py::isinstance<py::int_>(value) &&
                                                                !py::isinstance<py::bool_>(value));
    if (!ok) {
      const char* want = s.kind == rt::SettingKind::kText     ? "a str"
                         : s.kind == rt::SettingKind::kSwitch ? "True or False"
                                                              : "a number of seconds";
      throw py::type_error(name + "=" + std::string(py::repr(value)) + ": give " + want);
    }
    switch (s.kind) {
      case rt::SettingKind::kText:
        out.*s.text = value.cast<std::string>();
        break;
      case rt::SettingKind::kTime: {
        const double v = value.cast<double>();
        if (!(v >= 0 && v < 1e9)) throw py::value_error(name + " must be in [0, 1e9) seconds");
        out.*s.time = seconds(v);
        break;
      }
      case rt::SettingKind::kSwitch:
        out.*s.on = value.cast<bool>();
        break;
    }
    check(rt::check_setting(out, s));
  }
}

// The job's secret from Python bytes (empty: none, no authentication).
std::shared_ptr<const qs::transport::Secret> secret_of(const py::bytes& b) {
  const std::string bytes = b;
  if (bytes.empty()) return nullptr;
  return std::make_shared<const qs::transport::Secret>(
      take(qs::transport::Secret::from_bytes(bytes)));
}

// A job and the server this process may host (created before the endpoints are known).
struct Job {
  qs::runtime::JobOptions options;
  bool allreduce = false;  // gloo all-reduce (else TCP parameter servers)
};

struct HostedServer {
  std::unique_ptr<qs::runtime::Server> server;
  int port() const { return server ? server->port() : 0; }
};

// The all-reduce job's rendezvous store, hosted by rank 0 on a thread of its own until
// every worker connected its gloo contexts (or the object goes).
struct HostedStore {
  std::unique_ptr<qs::runtime::StoreServer> store;
  std::thread thread;
  qs::Status status;
  HostedStore(std::unique_ptr<qs::runtime::StoreServer> s) : store(std::move(s)) {
    thread = std::thread([this] { status = store->run(); });
  }
  ~HostedStore() {
    store->request_stop();
    if (thread.joinable()) thread.join();
  }
  int port() const { return store->port(); }
};

py::dict report_dict(const qs::runtime::WorkerReport& r) {
  py::dict d;
  std::vector<double> ms;
  for (qs::TimeNs t : r.iteration_times) ms.push_back(static_cast<double>(t) / 1e6);
  d["policy"] = r.policy;
  d["iteration_ms"] = ms;
  d["median_iteration_ms"] = static_cast<double>(r.median_iteration) / 1e6;
  d["bytes_pushed_per_iteration"] = r.bytes_pushed_per_iteration;
  d["units_per_iteration"] = r.units_per_iteration;
  d["uplink_gbps"] = r.uplink_gbps;
  d["congestion_control"] = r.congestion_control;
  d["queue_delay_p99_us"] = static_cast<double>(r.queue_delay_p99) / 1e3;
  d["notes"] = r.notes;
  d["staging_buffers_max"] = r.staging_buffers_max;
  return d;
}

// QS_SEGV_TRACE=1: a crash prints the native stack (which library, which function) before
// the process dies as it would have; Python's faulthandler shows only Python frames.
void print_native_stack(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  static const char kHead[] = "quicksilver: native stack at the crash (QS_SEGV_TRACE=1):\n";
  (void)!write(STDERR_FILENO, kHead, sizeof kHead - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_trace() {
  const char* v = std::getenv("QS_SEGV_TRACE");
  if (v == nullptr || std::string(v) != "1") return;
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc now: nothing to load inside the handler
  struct sigaction sa = {};
  sa.sa_handler = print_native_stack;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

// An advised policy as the planner reads it: {policy, iteration_ms, default_ms, knobs}.
py::dict advised(const qs::AdvisedPolicy& a) {
  py::dict d;
  d["policy"] = a.policy;
  d["iteration_ms"] = qs::to_ms(a.iteration_time);
  d["default_ms"] = qs::to_ms(a.default_time);
  d["knobs"] = std::map<std::string, std::string>(a.knobs.begin(), a.knobs.end());
  return d;
}

qs::pytorch::PlanSpec plan_spec(const std::string& profile_json, const std::string& architecture,
                                int workers, int servers, double gbps, double latency_us,
                                const std::string& compression) {
  qs::pytorch::PlanSpec spec;
  spec.profile_json = profile_json;
  spec.architecture = take(qs::parse_architecture(architecture));
  spec.workers = workers;
  spec.servers = servers;
  if (!(gbps > 0 && gbps < 1e6)) throw py::value_error("plan: gbps must be in (0, 1e6)");
  if (!(latency_us >= 0 && latency_us < 1e9))
    throw py::value_error("plan: latency_us must be >= 0");
  spec.bandwidth = qs::Rate::gbps(gbps);
  spec.latency = static_cast<qs::TimeNs>(latency_us * 1e3);
  spec.compression = compression;
  return spec;
}

// A duration in milliseconds from Python: finite, in [0, 1e12) (above 0 unless zero_ok).
qs::TimeNs ms_arg(const char* what, double ms, bool zero_ok) {
  if (!((zero_ok ? ms >= 0 : ms > 0) && ms < 1e12))
    throw py::value_error(std::string(what) + " must be in " + (zero_ok ? "[0" : "(0") + ", 1e12)");
  return qs::from_ms(ms);
}

// policy="auto" (python/quicksilver/auto.py): the simulator on the measured profile.
void def_planner(py::module_& m) {
  m.def(
      "predict",
      [](const std::string& profile_json, const std::string& architecture, int workers, int servers,
         double gbps, double latency_us, const std::string& compression, const std::string& policy,
         const std::map<std::string, std::string>& knobs) {
        const qs::pytorch::PlanSpec spec =
            plan_spec(profile_json, architecture, workers, servers, gbps, latency_us, compression);
        const std::vector<std::pair<std::string, std::string>> k(knobs.begin(), knobs.end());
        qs::Result<qs::TimeNs> t = [&] {
          py::gil_scoped_release release;
          return qs::pytorch::predict_iteration(spec, policy, k);
        }();
        return qs::to_ms(take(std::move(t)));
      },
      py::arg("profile_json"), py::arg("architecture"), py::arg("workers"), py::arg("servers"),
      py::arg("gbps"), py::arg("latency_us"), py::arg("compression"), py::arg("policy"),
      py::arg("knobs"), "The simulator's iteration time (ms) of `policy` with `knobs`");
  m.def(
      "rank_policies",
      [](const std::string& profile_json, const std::string& architecture, int workers, int servers,
         double gbps, double latency_us, const std::string& compression, bool allow_stale) {
        const qs::pytorch::PlanSpec spec =
            plan_spec(profile_json, architecture, workers, servers, gbps, latency_us, compression);
        qs::Result<qs::Advice> r = [&] {
          py::gil_scoped_release release;
          return qs::pytorch::rank_policies(spec, allow_stale);
        }();
        const qs::Advice advice = take(std::move(r));
        py::list out;
        for (const qs::AdvisedPolicy& a : advice.ranking) out.append(advised(a));
        return out;
      },
      py::arg("profile_json"), py::arg("architecture"), py::arg("workers"), py::arg("servers"),
      py::arg("gbps"), py::arg("latency_us"), py::arg("compression"), py::arg("allow_stale"),
      "Every communicating policy of the architecture, knobs tuned, fastest first "
      "(quicksilver advise without the sweep): [{policy, iteration_ms, default_ms, knobs}]");
}

// policy="auto"'s rules (quicksilver/sim/auto_planner.h), for python/quicksilver/auto.py.
void def_auto(py::module_& m) {
  m.attr("AUTO_MIN_GAIN") = qs::kAutoMinGain;
  m.attr("AUTO_TRIAL_BAND") = qs::kAutoTrialBand;
  m.attr("AUTO_TRIAL_MAX") = qs::kAutoTrialMax;
  m.attr("AUTO_TRIAL_BUDGET") = qs::kAutoTrialBudget;
  m.attr("AUTO_GBPS_RANGE") =
      py::make_tuple(qs::kAutoSlowest.gbps_value(), qs::kAutoFastest.gbps_value());
  m.def(
      "effective_gbps",
      [](const py::function& predict, double iteration_ms) {
        const qs::TimeNs measured = ms_arg("effective_gbps: iteration_ms", iteration_ms, false);
        qs::Result<qs::Rate> r = qs::effective_rate(
            [&](qs::Rate rate) -> qs::Result<qs::TimeNs> {
              const double ms = predict(rate.gbps_value()).cast<double>();
              if (!(ms >= 0 && ms < 1e12))
                return qs::invalid_argument("effective_gbps: predict() gave " + std::to_string(ms));
              return qs::from_ms(ms);
            },
            measured);
        return take(std::move(r)).gbps_value();
      },
      py::arg("predict"), py::arg("iteration_ms"),
      "The rate (Gbit/s) at which predict(gbps) (ms, falling as gbps grows) is iteration_ms "
      "within 0.2 %, in AUTO_GBPS_RANGE (qs::effective_rate)");
  m.def(
      "auto_candidate",
      [](const std::string& policy, const std::map<std::string, std::string>& knobs,
         const std::string& architecture) {
        const std::vector<std::pair<std::string, std::string>> k(knobs.begin(), knobs.end());
        return take(qs::pytorch::candidate(policy, k, take(qs::parse_architecture(architecture))));
      },
      py::arg("policy"), py::arg("knobs"), py::arg("architecture"),
      "A candidate's name as the decisions give it: \"bytescheduler partition_size=64KiB "
      "credit_size=4MiB\"");
  m.def(
      "decide_auto",
      [](const std::string& profile_json, const std::string& architecture, int workers, int servers,
         double latency_us, const std::string& compression, const std::string& policy,
         const std::map<std::string, std::string>& knobs, double iteration_ms,
         double switch_cost_ms, int horizon, bool allow_stale,
         const std::vector<std::string>& trialled, double trialled_gbps,
         const std::string& trialled_pick, double trialled_pick_ms,
         const std::vector<double>& trialled_ms, double min_gain, double trial_band, int trial_max,
         double trial_budget) {
        const qs::pytorch::PlanSpec spec =
            plan_spec(profile_json, architecture, workers, servers, 10.0, latency_us, compression);
        const qs::TimeNs measured = ms_arg("decide_auto: iteration_ms", iteration_ms, false);
        const qs::TimeNs cost = ms_arg("decide_auto: switch_cost_ms", switch_cost_ms, true);
        const std::vector<std::pair<std::string, std::string>> k(knobs.begin(), knobs.end());
        qs::AutoTrialled t{trialled, qs::Rate{0}, trialled_pick,
                           ms_arg("decide_auto: trialled_pick_ms", trialled_pick_ms, true)};
        if (trialled_gbps > 0) t.network = qs::Rate::gbps(trialled_gbps);
        if (!trialled_ms.empty() && trialled_ms.size() != trialled.size()) {
          throw py::value_error(
              "decide_auto: trialled_ms must give one time per trialled candidate (" +
              std::to_string(trialled.size()) + "), not " + std::to_string(trialled_ms.size()));
        }
        for (const double ms : trialled_ms) {
          t.measured.push_back(ms_arg("decide_auto: trialled_ms", ms, true));
        }
        qs::AutoOptions rules;
        rules.min_gain = min_gain;
        rules.trial_band = trial_band;
        rules.trial_max = trial_max;
        rules.trial_budget = trial_budget;
        qs::Result<qs::AutoDecision> r = [&] {
          py::gil_scoped_release release;
          return qs::pytorch::decide(spec, policy, k, measured, cost, horizon, allow_stale, t,
                                     rules);
        }();
        const qs::AutoDecision d = take(std::move(r));
        py::dict out;
        out["network_gbps"] = d.network.gbps_value();
        out["predicted_ms"] = qs::to_ms(d.predicted);
        py::list ranking, trial;
        for (const qs::AdvisedPolicy& a : d.ranking) ranking.append(advised(a));
        for (const qs::AdvisedPolicy& a : d.trial) trial.append(advised(a));
        out["ranking"] = ranking;
        out["trial"] = trial;
        out["near"] = d.near;
        out["change"] = d.change;
        out["next"] = advised(d.next);
        out["reason"] = d.reason;
        return out;
      },
      py::arg("profile_json"), py::arg("architecture"), py::arg("workers"), py::arg("servers"),
      py::arg("latency_us"), py::arg("compression"), py::arg("policy"), py::arg("knobs"),
      py::arg("iteration_ms"), py::arg("switch_cost_ms"), py::arg("horizon"),
      py::arg("allow_stale"), py::arg("trialled"), py::arg("trialled_gbps"),
      py::arg("trialled_pick"), py::arg("trialled_pick_ms"),
      py::arg("trialled_ms") = std::vector<double>{}, py::arg("min_gain") = qs::kAutoMinGain,
      py::arg("trial_band") = qs::kAutoTrialBand, py::arg("trial_max") = qs::kAutoTrialMax,
      py::arg("trial_budget") = qs::kAutoTrialBudget,
      "policy=\"auto\"'s decision (qs::decide_auto): {network_gbps, predicted_ms, ranking, "
      "trial, near, change, next, reason}");
}

}  // namespace

PYBIND11_MODULE(_quicksilver, m) {
  install_crash_trace();
  m.doc() = "Quicksilver's runtime for PyTorch (see quicksilver.torch)";
  py::register_exception<QuicksilverError>(m, "QuicksilverError", PyExc_RuntimeError);

  m.def(
      "ps_policies", [] { return qs::policy_registry().names(qs::Architecture::kPs); },
      "The parameter-server policies, by rank");
  m.def(
      "allreduce_policies",
      [] { return qs::policy_registry().names(qs::Architecture::kAllReduce); },
      "The all-reduce policies (on gloo)");
  m.def("is_allreduce_policy", &qs::pytorch::is_allreduce_policy);
  m.def(
      "delays_updates",
      [](const std::string& policy) {
        const qs::PolicySpec* spec =
            qs::policy_registry().find(policy, qs::Architecture::kAllReduce);
        return spec != nullptr && spec->delays_updates;
      },
      "Whether the all-reduce policy applies its updates late (DeFT)");
  m.def(
      "communicates",
      [](const std::string& policy) { return qs::policy_registry().communicates(policy); },
      "Whether the policy moves gradients (false for the oracle, the compute-only bound)");
  m.attr("AFTER_TRAINING") = qs::runtime::kAfterTraining;
  m.def(
      "digest",
      [](std::uintptr_t data, std::int64_t bytes) {
        if (bytes < 0) throw py::value_error("digest: a negative size");
        return qs::transport::crc32c(0, reinterpret_cast<const void*>(data),
                                     static_cast<std::size_t>(bytes));
      },
      py::arg("data"), py::arg("bytes"), py::call_guard<py::gil_scoped_release>(),
      "CRC32C of `bytes` bytes at address `data` (a tensor's data_ptr(), kept alive by the "
      "caller): the "
      "consistency check's digest of a parameter");
  m.def("knobs", [] {
    std::map<std::string, std::string> out;
    for (const qs::Knob* k : qs::policy_registry().knobs()) out[k->name] = k->help;
    return out;
  });

  def_planner(m);
  def_auto(m);

  py::class_<Job>(m, "Job")
      .def(py::init([](const std::string& profile_json, const std::string& policy,
                       const std::map<std::string, std::string>& knobs, int workers, int servers,
                       const std::string& bandwidth, const py::dict& settings,
                       const std::string& architecture, const std::string& compression) {
             qs::pytorch::JobSpec spec;
             spec.compression = compression;
             spec.profile_json = profile_json;
             spec.policy = policy;
             spec.architecture = architecture;
             spec.knobs.assign(knobs.begin(), knobs.end());
             spec.workers = workers;
             spec.servers = servers;
             spec.bandwidth = bandwidth;
             set_settings(spec.settings, settings);
             Job job{take(qs::pytorch::make_job(spec))};
             job.allreduce =
                 take(qs::pytorch::job_architecture(spec)) == qs::Architecture::kAllReduce;
             return job;
           }),
           py::arg("profile_json"), py::arg("policy"), py::arg("knobs"), py::arg("workers"),
           py::arg("servers"), py::arg("bandwidth") = "10Gbps", py::arg("settings") = py::dict(),
           py::arg("architecture") = "", py::arg("compression") = "none")
      .def_property_readonly("num_layers",
                             [](const Job& j) { return j.options.profile.num_layers(); })
      .def_property_readonly("num_tensors",
                             [](const Job& j) { return j.options.profile.num_tensors(); })
      .def_property_readonly("allreduce", [](const Job& j) { return j.allreduce; });

  py::class_<HostedStore>(m, "Store")
      .def(
          py::init([](int workers, const std::string& host, const py::bytes& secret) {
            return std::make_unique<HostedStore>(take(qs::runtime::StoreServer::create(
                qs::runtime::Endpoint{host, 0}, workers, 600 * qs::kNsPerSec, secret_of(secret))));
          }),
          py::arg("workers"), py::arg("host") = "127.0.0.1", py::arg("secret") = py::bytes(),
          "The all-reduce rendezvous store: listens at once (port known), serves on its own thread")
      .def_property_readonly("port", &HostedStore::port);

  py::class_<HostedServer>(m, "Server")
      .def(py::init(
               [](const Job& job, int server_id, const std::string& host, const py::bytes& secret) {
                 qs::runtime::ServerOptions o;
                 o.job = job.options;
                 o.server_id = server_id;
                 o.listen = qs::runtime::Endpoint{host, 0};
                 o.secret = secret_of(secret);
                 return HostedServer{take(qs::runtime::Server::create(std::move(o)))};
               }),
           py::arg("job"), py::arg("server_id"), py::arg("host") = "127.0.0.1",
           py::arg("secret") = py::bytes(),
           "Listens at once (port known); serves once handed to a Session")
      .def_property_readonly("port", &HostedServer::port);

  py::class_<qs::pytorch::Session>(m, "Session")
      .def(py::init([](const Job& job, int rank,
                       const std::vector<std::tuple<std::string, int>>& servers,
                       const std::vector<py::tuple>& tensors, HostedServer* hosted,
                       const std::vector<std::string>& links, const std::string& algorithm,
                       const py::bytes& secret) {
             qs::pytorch::SessionOptions o;
             o.job = job.options;
             o.rank = rank;
             o.secret = secret_of(secret);
             if (job.allreduce) {
               // servers: the one store; links: this host's address per link.
               if (servers.size() != 1)
                 throw py::value_error("an all-reduce session takes the store's address");
               o.make_worker = qs::pytorch::allreduce_worker(
                   qs::runtime::Endpoint{std::get<0>(servers[0]), std::get<1>(servers[0])},
                   links.empty() ? std::vector<std::string>{"127.0.0.1"} : links,
                   take(qs::runtime::parse_gloo_algorithm(algorithm)));
             } else {
               for (const auto& [host, port] : servers)
                 o.servers.push_back(qs::runtime::Endpoint{host, port});
             }
             // Each tensor: (address, elements) of host float32 used in place, or
             // (address, elements, space, dtype, staged) with the model tensor's memory space
             // and dtype ("cuda", "bfloat16") and whether the address is a staging buffer.
             for (std::size_t t = 0; t < tensors.size(); ++t) {
               const py::tuple& e = tensors[t];
               if (e.size() != 2 && e.size() != 5) {
                 throw py::value_error(
                     "tensor " + std::to_string(t) +
                     ": give (address, elements) or (address, elements, space, dtype, staged)");
               }
               auto* data = reinterpret_cast<float*>(e[0].cast<std::uintptr_t>());
               qs::runtime::TensorBuffer b{static_cast<qs::TensorId>(t), data, data,
                                           e[1].cast<std::int64_t>(), static_cast<int>(t)};
               if (e.size() == 5) {
                 b.space = take(qs::runtime::parse_memory_space(e[2].cast<std::string>()));
                 b.dtype = take(qs::runtime::parse_dtype(e[3].cast<std::string>()));
                 b.staged = e[4].cast<bool>();
               }
               o.tensors.push_back(b);
             }
             std::unique_ptr<qs::runtime::Server> server;
             if (hosted != nullptr) {
               if (!hosted->server)
                 throw py::value_error("this server was handed to a session already");
               server = std::move(hosted->server);
             }
             return take(qs::pytorch::Session::start(std::move(o), std::move(server)));
           }),
           py::arg("job"), py::arg("rank"), py::arg("servers"), py::arg("tensors"),
           py::arg("server") = nullptr, py::arg("links") = std::vector<std::string>{},
           py::arg("algorithm") = "ring", py::arg("secret") = py::bytes())
      .def_property_readonly("num_layers", &qs::pytorch::Session::num_layers)
      .def("layer_of", &qs::pytorch::Session::layer_of)
      .def("gradient_ready", [](qs::pytorch::Session& s, int t) { check(s.gradient_ready(t)); })
      .def(
          "enter_forward", [](qs::pytorch::Session& s, int l) { check(s.enter_forward(l)); },
          py::call_guard<py::gil_scoped_release>())
      .def("leave_forward", [](qs::pytorch::Session& s) { check(s.leave_forward()); })
      .def(
          "sum_ready",
          [](qs::pytorch::Session& s, int l, bool wait) { return take(s.sum_ready(l, wait)); },
          py::arg("layer"), py::arg("wait") = false, py::call_guard<py::gil_scoped_release>())
      .def("backwards", &qs::pytorch::Session::backwards)
      .def_property_readonly("delayed_updates", &qs::pytorch::Session::delayed_updates)
      .def_property_readonly("merged_bytes_max", &qs::pytorch::Session::merged_bytes_max,
                             "Delayed updates: the most bytes of merged-sum buffers held at once")
      .def(
          "take_updates",
          [](qs::pytorch::Session& s, int l, std::int64_t before) {
            std::vector<std::tuple<std::int64_t, std::int64_t>> out;
            for (const qs::runtime::LayerUpdate& u : take(s.take_updates(l, before)))
              out.emplace_back(u.first, u.last);
            return out;
          },
          py::arg("layer"), py::arg("before"), py::call_guard<py::gil_scoped_release>(),
          "Layer's delayed updates due before the forward pass after `before` backward passes, "
          "once their sums "
          "are in: [(first, last)]")
      .def(
          "load_update",
          [](qs::pytorch::Session& s, int l, std::int64_t first, std::int64_t last) {
            check(s.load_update(qs::runtime::LayerUpdate{l, first, last}));
          },
          py::arg("layer"), py::arg("first"), py::arg("last"),
          "Copies the sums of the update into the layer's gradient buffers")
      .def(
          "feedback",
          [](qs::pytorch::Session& s, std::int64_t iteration, double loss, double grad_sq,
             double noise, double lr, double batch) {
            s.feedback(qs::TrainingFeedback{iteration, loss, grad_sq, noise, lr, batch});
          },
          py::arg("iteration"), py::arg("loss"), py::arg("grad_sq"), py::arg("noise"),
          py::arg("lr"), py::arg("batch"))
      .def("finish",
           [](qs::pytorch::Session& s) {
             qs::Result<qs::runtime::WorkerReport> r = [&] {
               py::gil_scoped_release release;
               return s.finish();
             }();
             py::dict d = report_dict(take(std::move(r)));
             d["merged_bytes_max"] = s.merged_bytes_max();
             return d;
           })
      .def("abort", &qs::pytorch::Session::abort, py::call_guard<py::gil_scoped_release>());
}
