// The job message (quicksilver/launch/job_message.h): one JSON codec both ways, and the
// runtime job it maps to.
#include "quicksilver/launch/job_message.h"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/policy/registry.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/transport/socket.h"

namespace qs {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxMessageBytes = 1 << 20;

Status field_error(const std::string& field, const std::string& what) {
  return invalid_argument("job message: field '" + field + "': " + what);
}

Result<ChildRole> parse_role(const std::string& s) {
  for (ChildRole r : {ChildRole::kCoordinator, ChildRole::kServer, ChildRole::kWorker}) {
    if (s == child_role_name(r)) return r;
  }
  return invalid_argument("'" + s + "' is none of coordinator, server, worker");
}

// One JSON value into a field of its type: the error says what the value should be.
Status read_value(const json& v, std::string* out) {
  if (!v.is_string()) return invalid_argument("expected a string");
  *out = v.get<std::string>();
  return Status::ok();
}
Status read_value(const json& v, bool* out) {
  if (!v.is_boolean()) return invalid_argument("expected true or false");
  *out = v.get<bool>();
  return Status::ok();
}
Status read_value(const json& v, int* out) {
  const bool fits = v.is_number_unsigned()
                        ? v.get<std::uint64_t>() <= std::numeric_limits<int>::max()
                        : v.is_number_integer() &&
                              v.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                              v.get<std::int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) return invalid_argument("expected an integer (32 bits)");
  *out = v.get<int>();
  return Status::ok();
}
Status read_value(const json& v, std::uint64_t* out) {
  if (!v.is_number_unsigned()) return invalid_argument("expected a non-negative integer");
  *out = v.get<std::uint64_t>();
  return Status::ok();
}
Status read_value(const json& v, double* out) {
  if (!v.is_number()) return invalid_argument("expected a number");
  *out = v.get<double>();
  return Status::ok();
}
// Times (TimeNs) and rates: non-negative integers, nanoseconds and bit/s.
Status read_count(const json& v, std::int64_t* out) {
  if (!v.is_number_unsigned() ||
      v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return invalid_argument("expected a non-negative integer");
  *out = v.get<std::int64_t>();
  return Status::ok();
}
Status read_value(const json& v, Rate* out) { return read_count(v, &out->bits_per_second); }
Status read_value(const json& v, std::vector<std::string>* out) {
  if (!v.is_array()) return invalid_argument("expected an array of strings");
  out->clear();
  for (const json& e : v) {
    if (!e.is_string()) return invalid_argument("expected an array of strings");
    out->push_back(e.get<std::string>());
  }
  return Status::ok();
}
Status read_value(const json& v, ChildRole* out) {
  std::string s;
  QS_RETURN_IF_ERROR(read_value(v, &s));
  QS_ASSIGN_OR_RETURN(*out, parse_role(s));
  return Status::ok();
}
Status read_value(const json& v, Architecture* out) {
  std::string s;
  QS_RETURN_IF_ERROR(read_value(v, &s));
  QS_ASSIGN_OR_RETURN(*out, parse_architecture(s));
  return Status::ok();
}
Status read_value(const json& v, AllReduceAlgorithm* out) {
  std::string s;
  QS_RETURN_IF_ERROR(read_value(v, &s));
  QS_ASSIGN_OR_RETURN(*out, parse_allreduce_algorithm(s));
  return Status::ok();
}
Status read_value(const json& v, transport::WireDType* out) {
  std::string s;
  QS_RETURN_IF_ERROR(read_value(v, &s));
  QS_ASSIGN_OR_RETURN(*out, transport::parse_wire_dtype(s));
  return Status::ok();
}
// The knobs: {"packet_size": "32768B", ...}, each parsed as its flag's value.
Status read_value(const json& v, PolicyOptions* out) {
  if (!v.is_object()) return invalid_argument("expected an object of knob values");
  for (const auto& [name, text] : v.items()) {
    const Knob* k = policy_registry().find_knob(name);
    if (k == nullptr) return invalid_argument("'" + name + "' is no knob of this build");
    if (!text.is_string()) return invalid_argument("'" + name + "': expected a string");
    QS_RETURN_IF_ERROR(k->parse(text.get<std::string>(), out).with_context("'" + name + "'"));
  }
  return Status::ok();
}

// Reads the fields of one object, each at most once, remembering the first error and every
// field it was asked for (the rest are unknown: a misspelt field is an error, not a
// default).
class FieldReader {
 public:
  explicit FieldReader(const json& object) : object_(object) {}

  template <typename T>
  void read(const char* name, T* out) {
    known_.insert(name);
    if (!status_.is_ok()) return;
    auto it = object_.find(name);
    if (it == object_.end()) return;  // its default
    Status s = read_value(*it, out);
    if (!s.is_ok()) status_ = field_error(name, s.message());
  }
  void read_time(const char* name, TimeNs* out) {
    known_.insert(name);
    if (!status_.is_ok()) return;
    auto it = object_.find(name);
    if (it == object_.end()) return;
    Status s = read_count(*it, out);
    if (!s.is_ok()) status_ = field_error(name, s.message() + " (nanoseconds)");
  }

  // A field read elsewhere.
  void skip(const char* name) { known_.insert(name); }

  // The first error, else the first field nobody read.
  Status finish() const {
    if (!status_.is_ok()) return status_;
    for (const auto& [name, value] : object_.items()) {
      if (known_.count(name) == 0)
        return field_error(name, "no such field in version " + std::to_string(kJobMessageVersion));
    }
    return Status::ok();
  }

 private:
  const json& object_;
  std::set<std::string> known_;
  Status status_;
};

// Every field, in one place for both directions: `Io` reads (FieldReader) or writes
// (FieldWriter) each under its name.
template <typename Io, typename Message>
void fields(Io& io, Message& m) {
  io.read("role", &m.role);
  io.read("model", &m.model);
  io.read("device", &m.device);
  io.read("batch_size", &m.batch_size);
  io.read("policy", &m.policy);
  io.read("knobs", &m.knobs);
  io.read("architecture", &m.architecture);
  io.read("workers", &m.workers);
  io.read("servers", &m.servers);
  io.read("iterations", &m.iterations);
  io.read("warmup", &m.warmup);
  io.read("bandwidth_bps", &m.bandwidth);
  io.read("seed", &m.seed);
  io.read("allreduce", &m.allreduce);
  io.read("gloo_algorithm", &m.gloo_algorithm);
  io.read("second_link", &m.second_link);
  io.read("compression", &m.compression);
  // The runtime's settings, each under its table name (times: "<name>_ns").
  for (const runtime::RuntimeSetting& s : runtime::runtime_settings()) {
    const std::string name(s.name);
    switch (s.kind) {
      case runtime::SettingKind::kText:
        io.read(name.c_str(), &(m.settings.*s.text));
        break;
      case runtime::SettingKind::kTime:
        io.read_time((name + "_ns").c_str(), &(m.settings.*s.time));
        break;
      case runtime::SettingKind::kSwitch:
        io.read(name.c_str(), &(m.settings.*s.on));
        break;
    }
  }
  io.read("secret_file", &m.secret_file);
  io.read("insecure", &m.insecure);
  io.read("id", &m.id);
  io.read("listen", &m.listen);
  io.read("coordinator", &m.coordinator);
  io.read("connect", &m.connect);
  io.read("links", &m.links);
  io.read("pacing_rate_bps", &m.pacing_rate);
  io.read("nic_rate_bps", &m.nic_rate);
  io.read("slowdown", &m.slowdown);
  io.read("die_at_iteration", &m.die_at_iteration);
  io.read("announce_start", &m.announce_start);
  io.read("verify", &m.verify);
  io.read("gloo_via", &m.gloo_via);
  io.read("trace", &m.trace);
  io.read("trace_detail", &m.trace_detail);
  io.read("json", &m.json);
  io.read_time("timeout_ns", &m.timeout);
}

// One value as encode() writes it.
json to_json(const std::string& v) { return v; }
json to_json(bool v) { return v; }
json to_json(int v) { return v; }
json to_json(std::uint64_t v) { return v; }
json to_json(double v) { return v; }
json to_json(Rate v) { return v.bits_per_second; }
json to_json(const std::vector<std::string>& v) { return v; }
json to_json(ChildRole v) { return child_role_name(v); }
json to_json(Architecture v) { return architecture_name(v); }
json to_json(AllReduceAlgorithm v) { return allreduce_algorithm_name(v); }
json to_json(transport::WireDType v) { return transport::wire_dtype_name(v); }
json to_json(const PolicyOptions& o) {
  json knobs = json::object();
  for (const Knob* k : policy_registry().knobs()) knobs[k->name] = k->format(o);
  return knobs;
}

class FieldWriter {
 public:
  explicit FieldWriter(json* object) : object_(object) {}
  template <typename T>
  void read(const char* name, const T* v) {
    (*object_)[name] = to_json(*v);
  }
  void read_time(const char* name, const TimeNs* v) { (*object_)[name] = *v; }

 private:
  json* object_;
};

}  // namespace

const char* child_role_name(ChildRole r) {
  switch (r) {
    case ChildRole::kCoordinator:
      return "coordinator";
    case ChildRole::kServer:
      return "server";
    case ChildRole::kWorker:
      return "worker";
  }
  return "?";
}

std::string encode(const JobMessage& m) {
  json j = json::object();
  j["version"] = kJobMessageVersion;
  FieldWriter w(&j);
  fields(w, m);
  return j.dump(2) + "\n";
}

Result<JobMessage> decode(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("job message: not JSON");
  if (!j.is_object()) return invalid_argument("job message: not a JSON object");
  auto version = j.find("version");
  if (version == j.end()) {
    return invalid_argument(
        "job message: no 'version' field (the launcher and its children must be the same "
        "quicksilver build)");
  }
  if (!version->is_number_integer() || version->get<std::int64_t>() != kJobMessageVersion) {
    return invalid_argument("job message: version " + version->dump() +
                            ", this quicksilver reads version " +
                            std::to_string(kJobMessageVersion) +
                            ": the launcher and its children must be the same quicksilver build");
  }
  JobMessage m;
  FieldReader r(j);
  r.skip("version");  // checked above
  fields(r, m);
  QS_RETURN_IF_ERROR(r.finish());
  m.knobs.seed = m.seed;
  return m;
}

Status write_job_message(const JobMessage& m, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << encode(m);
  out.close();
  if (!out) return io_error("cannot write the job message " + path);
  return Status::ok();
}

Result<JobMessage> read_job_message(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument("cannot read '" + path + "'");
  std::string text(kMaxMessageBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return invalid_argument("cannot read '" + path + "'");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxMessageBytes) {
    return invalid_argument("'" + path + "' is longer than " + std::to_string(kMaxMessageBytes) +
                            " bytes: not a job message");
  }
  auto m = decode(text);
  if (!m) return m.status().with_context(path);
  return m;
}

Result<JobMessage> job_part(const Job& job, const std::string& policy) {
  JobMessage m;
  m.policy = policy;
  m.knobs = job.policy_options;
  m.architecture = job.cluster.architecture;
  m.workers = job.cluster.workers;
  m.servers = job.cluster.servers;
  m.iterations = job.sim.iterations;
  m.warmup = job.sim.warmup;
  m.bandwidth = job.cluster.bandwidth;
  m.seed = job.sim.seed;
  QS_ASSIGN_OR_RETURN(m.compression, transport::parse_wire_dtype(job.cluster.compression));
  if (job.cluster.architecture == Architecture::kAllReduce) {
    m.second_link = job.cluster.second_link_slowdown;
    m.allreduce = job.cluster.allreduce;
  } else if (job.cluster.second_link_slowdown != 0) {
    return invalid_argument(
        "--second-link is DeFT's second link, an all-reduce one: give --architecture allreduce");
  }
  return m;
}

Result<runtime::JobOptions> job_options(const JobMessage& m) {
  auto profile = load_model(m.model, m.device, m.batch_size);
  if (!profile) return profile.status().with_context("--model");
  if (m.batch_size < 0) return invalid_argument("--batch-size must be >= 0");
  if (m.policy == "all" || m.policy.find(',') != std::string::npos) {
    return invalid_argument("--policy: a server or worker runs exactly one policy");
  }
  if (!is_known_policy(m.policy)) {
    return invalid_argument("--policy: unknown policy '" + m.policy + "'");
  }
  if (m.iterations < 1) return invalid_argument("--iterations must be >= 1");
  if (m.warmup < 0) return invalid_argument("--warmup must be >= 0");
  runtime::JobOptions o;
  o.profile = std::move(*profile);
  o.policy = m.policy;
  o.policy_options = m.knobs;
  o.policy_options.seed = m.seed;
  o.workers = m.workers;
  o.servers = m.servers;
  o.iterations = m.iterations;
  o.bandwidth = m.bandwidth;
  QS_RETURN_IF_ERROR(runtime::check_settings(m.settings));
  static_cast<runtime::RuntimeSettings&>(o) = m.settings;
  o.wire_dtype = m.compression;
  if (m.pacing_rate.bits_per_second > 0) {
    o.socket.max_pacing_rate = static_cast<std::int64_t>(m.pacing_rate.bytes_per_second());
  }
  // Bad input is exit 2, before any socket.
  QS_RETURN_IF_ERROR(m.architecture == Architecture::kPs ? runtime::validate_job(o)
                                                         : runtime::validate_collective_job(o));
  return o;
}

}  // namespace qs
