// The policy registry (include/policy/quicksilver/policy/registry.h): the built-in policies'
// registration, the knob codecs, and the lookups the factories go through.
#include "quicksilver/policy/registry.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sstream>

#include "knob_table.h"
#include "quicksilver/core/check.h"
#include "quicksilver/policy/layout.h"

namespace qs {

struct PolicyRegistry::Impl {
  mutable std::mutex mu;
  std::deque<Knob> knobs;           // guarded by mu; deque: pointers stay valid
  std::deque<PolicySpec> policies;  // guarded by mu
};

PolicyRegistry::PolicyRegistry() : impl_(std::make_unique<Impl>()) {}
PolicyRegistry::~PolicyRegistry() = default;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  double back = 0;
  // The shortest of %.15g .. %.17g that reads back exactly (1.65, not 1.6499999999999999).
  for (int p = 15; p <= 17; ++p) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*g", p, v);
    if (std::sscanf(b, "%lf", &back) == 1 && back == v) return b;
  }
  return buf;
}

// The one registry: built on first use from the built-in policies' own files (one line
// each); register_policy() may add to it afterwards.
PolicyRegistry& mutable_registry() {
  static PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
    for (Status (*add)(PolicyRegistry&) :
         {register_placement_knobs, register_ps_policies, register_prophet,
          register_allreduce_policies, register_usbyte, register_deft}) {
      Status s = add(*r);
      QS_CHECK_MSG(s.is_ok(), s.to_string());
    }
    return r;
  }();
  return *registry;
}

}  // namespace

Status need_positive(Bytes v, std::string_view what, std::string_view policy) {
  return v > 0 ? Status::ok()
               : invalid_argument(std::string(what) + " must be positive for policy " +
                                  std::string(policy));
}

// ---- Knob ----

std::string_view Knob::unit() const {
  switch (type) {
    case KnobType::kBytes:
      return "bytes";
    case KnobType::kTime:
      return "time";
    case KnobType::kInt:
      return "integer";
    case KnobType::kDouble:
      return "number";
    case KnobType::kBool:
      return "flag";
  }
  return "?";
}

std::int64_t Knob::get_int(const PolicyOptions& o) const {
  if (auto* f = std::get_if<std::int64_t PolicyOptions::*>(&field)) return o.**f;
  if (auto* f = std::get_if<int PolicyOptions::*>(&field)) return o.**f;
  QS_CHECK_MSG(false, "knob " + name + " is not an integer");
  return 0;
}

void Knob::set_int(PolicyOptions* o, std::int64_t v) const {
  if (auto* f = std::get_if<std::int64_t PolicyOptions::*>(&field)) {
    o->** f = v;
  } else if (auto* f = std::get_if<int PolicyOptions::*>(&field)) {
    o->** f = static_cast<int>(v);
  } else {
    QS_CHECK_MSG(false, "knob " + name + " is not an integer");
  }
}

bool Knob::get_bool(const PolicyOptions& o) const {
  auto* f = std::get_if<bool PolicyOptions::*>(&field);
  QS_CHECK_MSG(f != nullptr, "knob " + name + " is not a flag");
  return o.**f;
}

std::string Knob::format(const PolicyOptions& o) const {
  switch (type) {
    case KnobType::kBytes:
      return std::to_string(get_int(o)) + "B";
    case KnobType::kTime:
      return std::to_string(get_int(o)) + "ns";
    case KnobType::kInt:
      return std::to_string(get_int(o));
    case KnobType::kDouble:
      return format_double(o.*std::get<double PolicyOptions::*>(field));
    case KnobType::kBool:
      return get_bool(o) ? "true" : "false";
  }
  return "?";
}

std::string Knob::display(const PolicyOptions& o) const {
  switch (type) {
    case KnobType::kBytes: {
      // The short form where it is exact ("32KiB", "4MB"), else bytes ("4096000B").
      const std::string s = format_size(get_int(o));
      auto back = parse_size(s);
      return back && *back == get_int(o) ? s : std::to_string(get_int(o)) + "B";
    }
    case KnobType::kTime:
      return format_time(get_int(o));
    default:
      return format(o);
  }
}

Status Knob::parse_bare(std::string_view text, PolicyOptions* o) const {
  const bool bare = !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  return parse(bare && type == KnobType::kBytes ? std::string(text) + "B" : text, o);
}

Status Knob::parse(std::string_view text, PolicyOptions* o) const {
  double value = 0;
  switch (type) {
    case KnobType::kBytes: {
      auto v = parse_size(text);
      if (!v) return v.status().with_context(flag);
      if (*v <= 0) return invalid_argument(flag + " must be positive");
      value = static_cast<double>(*v);
      if (accepts && !accepts(value)) return invalid_argument(flag + " " + requirement);
      set_int(o, *v);
      return Status::ok();
    }
    case KnobType::kTime: {
      auto v = parse_time(text);
      if (!v) return v.status().with_context(flag);
      value = static_cast<double>(*v);
      if (accepts && !accepts(value)) return invalid_argument(flag + " " + requirement);
      set_int(o, *v);
      return Status::ok();
    }
    case KnobType::kInt: {
      std::int64_t v = 0;
      try {
        std::size_t used = 0;
        v = std::stoll(std::string(text), &used);
        if (used != text.size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        return invalid_argument(flag + ": '" + std::string(text) + "' is not an integer");
      }
      if (accepts && !accepts(static_cast<double>(v)))
        return invalid_argument(flag + " " + requirement);
      set_int(o, v);
      return Status::ok();
    }
    case KnobType::kDouble: {
      try {
        std::size_t used = 0;
        value = std::stod(std::string(text), &used);
        if (used != text.size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        return invalid_argument(flag + ": '" + std::string(text) + "' is not a number");
      }
      if (accepts && !accepts(value)) return invalid_argument(flag + " " + requirement);
      o->*std::get<double PolicyOptions::*>(field) = value;
      return Status::ok();
    }
    case KnobType::kBool: {
      bool v;
      if (text == "true" || text == "1") {
        v = true;
      } else if (text == "false" || text == "0") {
        v = false;
      } else {
        return invalid_argument(flag + ": '" + std::string(text) + "' is neither true nor false");
      }
      o->*std::get<bool PolicyOptions::*>(field) = v;
      return Status::ok();
    }
  }
  return internal_error("knob " + name + ": unknown type");
}

// ---- PolicyRegistry ----

Status PolicyRegistry::add(std::vector<Knob> knobs, std::vector<PolicySpec> policies) {
  std::lock_guard lock(impl_->mu);
  for (Knob& k : knobs) {
    for (const Knob& have : impl_->knobs) {
      if (have.name == k.name || have.flag == k.flag) {
        return invalid_argument("knob '" + k.name + "' (" + k.flag + ") is registered twice");
      }
    }
    impl_->knobs.push_back(std::move(k));
  }
  for (PolicySpec& p : policies) {
    for (const PolicySpec& have : impl_->policies) {
      if (have.name == p.name && have.architecture == p.architecture) {
        return invalid_argument("policy '" + p.name + "' is registered twice on one architecture");
      }
    }
    for (const std::string& k : p.knobs) {
      bool found = false;
      for (const Knob& have : impl_->knobs) found |= have.name == k;
      if (!found)
        return invalid_argument("policy '" + p.name + "' reads unregistered knob '" + k + "'");
    }
    if (p.architecture == Architecture::kPs ? !p.make_ps : !p.make_allreduce) {
      return invalid_argument("policy '" + p.name + "' has no factory for its architecture");
    }
    impl_->policies.push_back(std::move(p));
  }
  return Status::ok();
}

const PolicySpec* PolicyRegistry::find(std::string_view name, Architecture architecture) const {
  std::lock_guard lock(impl_->mu);
  for (const PolicySpec& p : impl_->policies) {
    if (p.name == name && p.architecture == architecture) return &p;
  }
  return nullptr;
}

const Knob* PolicyRegistry::find_knob(std::string_view name) const {
  std::lock_guard lock(impl_->mu);
  for (const Knob& k : impl_->knobs) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> PolicyRegistry::names(Architecture architecture) const {
  std::lock_guard lock(impl_->mu);
  std::vector<const PolicySpec*> v;
  for (const PolicySpec& p : impl_->policies) {
    if (p.architecture == architecture) v.push_back(&p);
  }
  std::stable_sort(v.begin(), v.end(),
                   [](const PolicySpec* a, const PolicySpec* b) { return a->rank < b->rank; });
  std::vector<std::string> out;
  for (const PolicySpec* p : v) out.push_back(p->name);
  return out;
}

std::vector<std::string> PolicyRegistry::all_names() const {
  std::vector<std::string> out = names(Architecture::kPs);
  for (std::string& n : names(Architecture::kAllReduce)) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
  }
  return out;
}

bool PolicyRegistry::is_known(std::string_view name) const {
  return find(name, Architecture::kPs) != nullptr ||
         find(name, Architecture::kAllReduce) != nullptr;
}

bool PolicyRegistry::communicates(std::string_view name) const {
  for (Architecture a : {Architecture::kPs, Architecture::kAllReduce}) {
    if (const PolicySpec* s = find(name, a); s != nullptr && s->communicates) return true;
  }
  return false;
}

std::vector<const Knob*> PolicyRegistry::knobs() const {
  std::lock_guard lock(impl_->mu);
  std::vector<const Knob*> out;
  for (const Knob& k : impl_->knobs) out.push_back(&k);
  return out;
}

std::vector<std::string> PolicyRegistry::policies_using(std::string_view knob) const {
  std::vector<std::string> out;
  for (Architecture a : {Architecture::kPs, Architecture::kAllReduce}) {
    for (const std::string& n : names(a)) {
      const PolicySpec* p = find(n, a);
      if (std::find(p->knobs.begin(), p->knobs.end(), knob) != p->knobs.end() &&
          std::find(out.begin(), out.end(), n) == out.end()) {
        out.push_back(n);
      }
    }
  }
  return out;
}

const PolicyRegistry& policy_registry() { return mutable_registry(); }

Status register_policy(std::vector<PolicySpec> policies, std::vector<Knob> knobs) {
  return mutable_registry().add(std::move(knobs), std::move(policies));
}

std::string hashed_knob_text(const PolicyOptions& o) {
  std::string s;
  for (const Knob* k : policy_registry().knobs()) {
    if (k->hashed) s += (s.empty() ? "" : "|") + k->name + "=" + k->format(o);
  }
  return s;
}

std::string hashed_knob_names() {
  std::string s;
  for (const Knob* k : policy_registry().knobs()) {
    if (k->hashed) s += (s.empty() ? "" : ", ") + k->name;
  }
  return s;
}

std::string knob_markdown(Architecture architecture) {
  const PolicyRegistry& reg = policy_registry();
  const PolicyOptions defaults;
  std::ostringstream s;
  s << "| flag | field | default | unit | scales | hashed | policies | meaning |\n";
  s << "|---|---|---|---|---|---|---|---|\n";
  for (const Knob* k : reg.knobs()) {
    std::vector<std::string> users;
    for (const std::string& n : reg.policies_using(k->name)) {
      if (reg.find(n, architecture) && std::find(reg.find(n, architecture)->knobs.begin(),
                                                 reg.find(n, architecture)->knobs.end(), k->name) !=
                                           reg.find(n, architecture)->knobs.end()) {
        users.push_back("`" + n + "`");
      }
    }
    if (users.empty()) continue;
    s << "| `" << k->flag << "` | `" << k->name << "` | " << k->display(defaults) << " | "
      << k->unit() << " | " << (k->scales ? "yes" : "no") << " | " << (k->hashed ? "yes" : "no")
      << " | " << join(users) << " | " << k->help << " |\n";
  }
  return s.str();
}

// ---- the lookups every engine goes through (ps_policy.h, allreduce_policy.h) ----

std::vector<std::string> all_policy_names() { return policy_registry().all_names(); }
std::vector<std::string> ps_policy_names() { return policy_registry().names(Architecture::kPs); }
std::vector<std::string> allreduce_policy_names() {
  return policy_registry().names(Architecture::kAllReduce);
}
bool is_known_policy(std::string_view name) { return policy_registry().is_known(name); }

Result<std::unique_ptr<PsPolicy>> make_ps_policy(std::string_view name, const PolicyOptions& o,
                                                 const PsContext& ctx) {
  QS_CHECK(ctx.profile && ctx.layout && ctx.placement);
  const PolicyRegistry& reg = policy_registry();
  if (const PolicySpec* p = reg.find(name, Architecture::kPs)) return p->make_ps(o, ctx);
  if (!reg.is_known(name)) {
    return invalid_argument("unknown policy '" + std::string(name) +
                            "' (known: " + join(reg.all_names()) + ")");
  }
  return invalid_argument("policy '" + std::string(name) +
                          "' runs on the all-reduce architecture only (use --architecture "
                          "allreduce); parameter-server policies: " +
                          join(reg.names(Architecture::kPs)));
}

Result<std::unique_ptr<AllReducePolicy>> make_allreduce_policy(std::string_view name,
                                                               const PolicyOptions& o,
                                                               const AllReduceContext& ctx) {
  QS_CHECK(ctx.profile && ctx.layout && !ctx.links.empty());
  const PolicyRegistry& reg = policy_registry();
  if (const PolicySpec* p = reg.find(name, Architecture::kAllReduce))
    return p->make_allreduce(o, ctx);
  const std::string known = join(reg.names(Architecture::kAllReduce));
  if (reg.is_known(name)) {
    return invalid_argument("policy '" + std::string(name) +
                            "' runs on the parameter-server architecture only (use --architecture "
                            "ps); all-reduce policies: " +
                            known);
  }
  return invalid_argument("unknown policy '" + std::string(name) + "' (known: " + known + ")");
}

Status check_unit_budget(const Profile& profile, std::string_view policy, Architecture architecture,
                         const PolicyOptions& options, int workers, int servers) {
  const PolicyRegistry& reg = policy_registry();
  const PolicySpec* spec = reg.find(policy, architecture);
  if (spec == nullptr) return Status::ok();
  // The ranges a policy cuts: PS, each server's slice of a tensor; all-reduce, the tensor.
  std::vector<std::pair<Bytes, Bytes>> ranges;  // (bytes, element size)
  if (architecture == Architecture::kPs && servers > 1 && options.split_threshold >= 1) {
    const TensorLayout layout(profile);
    const Placement placement(layout, servers, options.split_threshold);
    for (const TensorInfo& t : layout.tensors()) {
      for (const Slice& s : placement.slices(t.id))
        ranges.emplace_back(s.chunk.length, t.element_size);
    }
  } else {
    for (const LayerSpec& l : profile.layers) {
      for (const TensorSpec& t : l.tensors) ranges.emplace_back(t.bytes(), 1);
    }
  }
  for (const std::string& name : spec->knobs) {
    const Knob* k = reg.find_knob(name);
    if (k == nullptr || !k->cuts) continue;
    const Bytes size = k->get_int(options);
    if (size <= 0) return invalid_argument(k->flag + " must be positive");
    std::int64_t units = 0;
    for (const auto& [bytes, align] : ranges) {
      // As split_chunk() cuts: pieces of `size` rounded down to whole elements.
      const Bytes step = std::max(align, size / align * align);
      units += (bytes + step - 1) / step;
    }
    const std::string what = k->flag + " " + k->display(options) + " cuts " + profile.name + "'s " +
                             format_size(profile.total_bytes()) + " of gradients into " +
                             std::to_string(units) + " units per iteration";
    if (units > kMaxUnitsPerIteration) {
      const Bytes least =
          (profile.total_bytes() + kMaxUnitsPerIteration - 1) / kMaxUnitsPerIteration;
      return invalid_argument(what + "; the limit is " + std::to_string(kMaxUnitsPerIteration) +
                              " per worker (give at least about " + format_size(least) + ")");
    }
    if (architecture == Architecture::kPs && units * workers > kMaxUnitsPerIterationAllWorkers) {
      return invalid_argument(what + ", " + std::to_string(units * workers) + " over --workers " +
                              std::to_string(workers) + "; the limit is " +
                              std::to_string(kMaxUnitsPerIterationAllWorkers) +
                              " over all workers (fewer workers or a larger " + k->flag + ")");
    }
  }
  return Status::ok();
}

}  // namespace qs
