#include "quicksilver/model/profile.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "quicksilver/core/text_table.h"

namespace qs {

Bytes LayerSpec::bytes() const {
  Bytes b = 0;
  for (const auto& t : tensors) b += t.bytes();
  return b;
}

std::int64_t LayerSpec::parameters() const {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.elements;
  return n;
}

int Profile::num_tensors() const {
  int n = 0;
  for (const auto& l : layers) n += static_cast<int>(l.tensors.size());
  return n;
}

Bytes Profile::total_bytes() const {
  Bytes b = 0;
  for (const auto& l : layers) b += l.bytes();
  return b;
}

std::int64_t Profile::total_parameters() const {
  std::int64_t n = 0;
  for (const auto& l : layers) n += l.parameters();
  return n;
}

TimeNs Profile::compute_time() const {
  TimeNs t = 0;
  for (const auto& l : layers) t += l.forward + l.backward + l.update;
  return t;
}

namespace {

std::string layer_ref(std::size_t i, const std::string& name) {
  return "layer " + std::to_string(i + 1) + (name.empty() ? "" : " '" + name + "'");
}

}  // namespace

Status validate_profile(const Profile& p, const ProfileLimits& limits) {
  if (!is_valid_utf8(p.name)) return invalid_argument("name must be UTF-8");
  if (p.batch_size <= 0) return invalid_argument("batch_size must be a positive integer");
  if (p.layers.empty()) return invalid_argument("layers: a profile needs at least one layer");
  if (p.num_layers() > limits.max_layers) {
    return invalid_argument("layers: " + std::to_string(p.layers.size()) +
                            " layers is more than the limit of " +
                            std::to_string(limits.max_layers));
  }
  const TimeNs max_t = from_ms(limits.max_layer_ms);
  Bytes total = 0;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const LayerSpec& l = p.layers[i];
    const std::string ref = layer_ref(i, l.name);
    if (l.name.empty()) return invalid_argument(ref + ": name must be a non-empty string");
    if (!is_valid_utf8(l.name)) return invalid_argument(ref + ": name must be UTF-8");
    const std::pair<const char*, TimeNs> times[] = {
        {"forward_ms", l.forward}, {"backward_ms", l.backward}, {"update_ms", l.update}};
    for (const auto& [field, t] : times) {
      if (t < 0) return invalid_argument(ref + ": " + field + " must be >= 0");
      if (t > max_t) {
        return invalid_argument(ref + ": " + field + " is absurdly large (limit " +
                                std::to_string(limits.max_layer_ms) + " ms)");
      }
    }
    if (l.tensors.empty()) return invalid_argument(ref + ": tensors must list at least one tensor");
    for (std::size_t j = 0; j < l.tensors.size(); ++j) {
      const TensorSpec& t = l.tensors[j];
      const std::string tref = ref + ": tensors[" + std::to_string(j) + "]";
      if (t.name.empty() || !is_valid_utf8(t.name)) {
        return invalid_argument(tref + ".name must be a non-empty UTF-8 string");
      }
      if (t.elements <= 0) return invalid_argument(tref + ".elements must be > 0");
      if (t.elements > limits.max_tensor_elements) {
        return invalid_argument(tref + ".elements " + std::to_string(t.elements) +
                                " is absurdly large (limit " +
                                std::to_string(limits.max_tensor_elements) + ")");
      }
      if (t.bytes_per_element != 1 && t.bytes_per_element != 2 && t.bytes_per_element != 4 &&
          t.bytes_per_element != 8) {
        return invalid_argument(tref + ".bytes_per_element must be 1, 2, 4 or 8");
      }
      total += t.bytes();
      if (total > limits.max_total_bytes) {
        return invalid_argument(tref + ": the model's gradients exceed " +
                                format_size(limits.max_total_bytes) + " in total");
      }
    }
  }
  return Status::ok();
}

namespace {

using nlohmann::json;

// Reads a number field; `required` decides whether absence is an error.
Status read_ms(const json& obj, const char* field, bool required, const std::string& ref,
               TimeNs* out) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    if (required) return invalid_argument(ref + ": missing field " + field);
    *out = 0;
    return Status::ok();
  }
  if (!it->is_number()) return invalid_argument(ref + ": " + field + " must be a number");
  double v = it->get<double>();
  if (!std::isfinite(v)) return invalid_argument(ref + ": " + field + " must be finite");
  if (v < 0) return invalid_argument(ref + ": " + field + " must be >= 0");
  if (v > 9e12) return invalid_argument(ref + ": " + field + " is absurdly large");
  *out = from_ms(v);
  return Status::ok();
}

Status read_string(const json& obj, const char* field, const std::string& ref, std::string* out) {
  auto it = obj.find(field);
  if (it == obj.end()) return invalid_argument(ref + ": missing field " + field);
  if (!it->is_string() || it->get<std::string>().empty()) {
    return invalid_argument(ref + ": " + field + " must be a non-empty string");
  }
  *out = it->get<std::string>();
  return Status::ok();
}

// Integers must be JSON integers (not 1.5, not "3"); range-checked by the caller.
Status read_int(const json& obj, const char* field, bool required, const std::string& ref,
                std::int64_t* out) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    return required ? invalid_argument(ref + ": missing field " + field) : Status::ok();
  }
  if (it->is_number_unsigned()) {
    auto u = it->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) {
      return invalid_argument(ref + ": " + field + " is absurdly large");
    }
    *out = static_cast<std::int64_t>(u);
    return Status::ok();
  }
  if (it->is_number_integer()) {
    *out = it->get<std::int64_t>();
    return Status::ok();
  }
  return invalid_argument(ref + ": " + field + " must be an integer");
}

Result<Profile> parse(const json& doc, const std::string& default_name) {
  if (!doc.is_object()) return invalid_argument("the profile must be a JSON object");
  Profile p;
  p.name = default_name;
  if (doc.contains("name")) QS_RETURN_IF_ERROR(read_string(doc, "name", "profile", &p.name));
  std::int64_t batch = p.batch_size;
  QS_RETURN_IF_ERROR(read_int(doc, "batch_size", false, "profile", &batch));
  if (batch <= 0 || batch > (1 << 30)) {
    return invalid_argument("profile: batch_size must be a positive integer");
  }
  p.batch_size = static_cast<int>(batch);
  auto layers = doc.find("layers");
  if (layers == doc.end()) return invalid_argument("profile: missing field layers");
  if (!layers->is_array()) return invalid_argument("profile: layers must be an array");
  if (layers->empty()) return invalid_argument("layers: a profile needs at least one layer");
  p.layers.reserve(layers->size());
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const json& jl = (*layers)[i];
    std::string ref = layer_ref(i, "");
    if (!jl.is_object()) return invalid_argument(ref + ": must be a JSON object");
    LayerSpec l;
    QS_RETURN_IF_ERROR(read_string(jl, "name", ref, &l.name));
    ref = layer_ref(i, l.name);
    QS_RETURN_IF_ERROR(read_ms(jl, "forward_ms", true, ref, &l.forward));
    QS_RETURN_IF_ERROR(read_ms(jl, "backward_ms", true, ref, &l.backward));
    QS_RETURN_IF_ERROR(read_ms(jl, "update_ms", false, ref, &l.update));
    auto tensors = jl.find("tensors");
    if (tensors == jl.end()) return invalid_argument(ref + ": missing field tensors");
    if (!tensors->is_array()) return invalid_argument(ref + ": tensors must be an array");
    if (tensors->empty()) return invalid_argument(ref + ": tensors must list at least one tensor");
    for (std::size_t j = 0; j < tensors->size(); ++j) {
      const json& jt = (*tensors)[j];
      const std::string tref = ref + ": tensors[" + std::to_string(j) + "]";
      if (!jt.is_object()) return invalid_argument(tref + " must be a JSON object");
      TensorSpec t;
      QS_RETURN_IF_ERROR(read_string(jt, "name", tref, &t.name));
      QS_RETURN_IF_ERROR(read_int(jt, "elements", true, tref, &t.elements));
      std::int64_t bpe = 4;
      QS_RETURN_IF_ERROR(read_int(jt, "bytes_per_element", false, tref, &bpe));
      if (bpe != 1 && bpe != 2 && bpe != 4 && bpe != 8) {
        return invalid_argument(tref + ".bytes_per_element must be 1, 2, 4 or 8");
      }
      t.bytes_per_element = static_cast<int>(bpe);
      l.tensors.push_back(std::move(t));
    }
    p.layers.push_back(std::move(l));
  }
  QS_RETURN_IF_ERROR(validate_profile(p));
  return p;
}

}  // namespace

Result<Profile> profile_from_json(const std::string& text, const std::string& source,
                                  const std::string& default_name) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Re-parse with exceptions only to obtain the position for the message. Every
    // json::exception counts: a number beyond double's range (1e400) is an out_of_range.
    try {
      [[maybe_unused]] json unused = json::parse(text);
    } catch (const json::exception& e) {
      return invalid_argument(source + ": not valid JSON: " + e.what());
    }
    return invalid_argument(source + ": not valid JSON");
  }
  Result<Profile> r = internal_error("unreachable");
  try {
    r = parse(doc, sanitize_utf8(default_name));
  } catch (const json::exception& e) {
    // parse() checks every type before reading it; this is a backstop for the library's
    // own refusals, reported as bad input rather than a crash.
    return invalid_argument(source + ": " + e.what());
  }
  if (!r.is_ok()) return r.status().with_context(source);
  return r;
}

std::string profile_to_json(const Profile& p) {
  // Hand-formatted so that each layer is one readable line and round-trips exactly.
  std::ostringstream os;
  os.precision(17);
  os << "{ \"name\": " << json(p.name).dump() << ", \"batch_size\": " << p.batch_size
     << ",\n  \"layers\": [\n";
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const LayerSpec& l = p.layers[i];
    os << "    { \"name\": " << json(l.name).dump() << ", \"forward_ms\": " << to_ms(l.forward)
       << ", \"backward_ms\": " << to_ms(l.backward) << ", \"update_ms\": " << to_ms(l.update)
       << ",\n      \"tensors\": [";
    for (std::size_t j = 0; j < l.tensors.size(); ++j) {
      const TensorSpec& t = l.tensors[j];
      os << (j ? ", " : " ") << "{ \"name\": " << json(t.name).dump()
         << ", \"elements\": " << t.elements;
      if (t.bytes_per_element != 4) os << ", \"bytes_per_element\": " << t.bytes_per_element;
      os << " }";
    }
    os << " ] }" << (i + 1 < p.layers.size() ? "," : "") << "\n";
  }
  os << "  ] }\n";
  return os.str();
}

Result<Profile> load_profile(const std::string& path) {
  QS_ASSIGN_OR_RETURN(std::string text, read_text_file(path, "profile", kMaxProfileFileBytes));
  return profile_from_json(text, path, std::filesystem::path(path).stem().string());
}

Status save_profile(const Profile& p, const std::string& path) {
  QS_RETURN_IF_ERROR(validate_profile(p));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error(path + ": cannot open for writing");
  out << profile_to_json(p);
  out.close();
  if (!out) return io_error(path + ": write failed");
  return Status::ok();
}

}  // namespace qs
