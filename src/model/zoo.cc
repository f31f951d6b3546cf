#include "quicksilver/model/zoo.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "quicksilver/core/check.h"
#include "zoo_data.h"

namespace qs {

std::int64_t ZooModel::parameters() const {
  std::int64_t n = 0;
  for (const auto& l : layers)
    for (const auto& t : l.tensors) n += t.elements;
  return n;
}

double ZooModel::forward_flops() const {
  double f = 0;
  for (const auto& l : layers) f += l.forward_flops;
  return f;
}

namespace {

ZooModel parse_zoo_model(const char* text) {
  using nlohmann::json;
  const json d = json::parse(text);  // shipped data: a parse failure is a build defect
  ZooModel m;
  m.name = d.at("name").get<std::string>();
  m.display_name = d.value("display_name", m.name);
  m.input = d.value("input", "");
  m.default_batch_size = d.value("default_batch_size", 32);
  m.reference_parameters = d.value("reference_parameters", std::int64_t{0});
  m.source = d.value("source", "");
  for (const json& jl : d.at("layers")) {
    ZooLayer l;
    l.name = jl.at("name").get<std::string>();
    l.forward_flops = jl.value("forward_flops", 0.0);
    l.activation_bytes = jl.value("activation_bytes", 0.0);
    for (const json& jt : jl.at("tensors")) {
      TensorSpec t;
      t.name = jt.at("name").get<std::string>();
      t.elements = jt.at("elements").get<std::int64_t>();
      t.bytes_per_element = jt.value("bytes_per_element", 4);
      l.tensors.push_back(std::move(t));
    }
    m.layers.push_back(std::move(l));
  }
  return m;
}

}  // namespace

const std::vector<ZooModel>& zoo_models() {
  static const std::vector<ZooModel> models = [] {
    std::vector<ZooModel> v;
    for (const EmbeddedFile& f : embedded_zoo_files()) v.push_back(parse_zoo_model(f.text));
    return v;
  }();
  return models;
}

Result<const ZooModel*> find_zoo_model(const std::string& name) {
  std::string known;
  for (const ZooModel& m : zoo_models()) {
    if (m.name == name) return &m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  return not_found("no built-in model '" + name + "' (built-in: " + known + ")");
}

const std::vector<Device>& devices() {
  // Sustained FP32 training rates, fixed so that ResNet-50 (batch 32, 3 x 8.2 GFLOPs per
  // sample per iteration) trains at the throughput commonly published for the card.
  static const std::vector<Device> kDevices = {
      {"k80", "NVIDIA Tesla K80 (one GK210)", 1.4, 240, 20 * kNsPerUs,
       "~55 samples/s ResNet-50 FP32 (4.4 TFLOPS peak)"},
      {"gtx1080ti", "NVIDIA GTX 1080 Ti", 5.0, 484, 10 * kNsPerUs,
       "~200 samples/s ResNet-50 FP32 (11.3 TFLOPS peak)"},
      {"v100", "NVIDIA Tesla V100", 8.5, 900, 8 * kNsPerUs,
       "~350 samples/s ResNet-50 FP32 (15.7 TFLOPS peak)"},
      {"rtx3090", "NVIDIA RTX 3090", 10.0, 936, 8 * kNsPerUs,
       "~400 samples/s ResNet-50 FP32 (35.6 TFLOPS peak)"},
      {"a100", "NVIDIA A100 40GB (TF32)", 22.0, 1555, 6 * kNsPerUs,
       "~900 samples/s ResNet-50 TF32 (156 TFLOPS peak)"},
  };
  return kDevices;
}

Result<const Device*> find_device(const std::string& name) {
  std::string known;
  for (const Device& d : devices()) {
    if (d.name == name) return &d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  return not_found("no device '" + name + "' (known: " + known + ")");
}

Profile make_zoo_profile(const ZooModel& model, const Device& device, int batch_size) {
  QS_CHECK(device.sustained_tflops > 0 && device.memory_gbps > 0);
  Profile p;
  p.name = model.name;
  p.batch_size = batch_size > 0 ? batch_size : model.default_batch_size;
  for (const ZooLayer& zl : model.layers) {
    LayerSpec l;
    l.name = zl.name;
    l.tensors = zl.tensors;
    // Roofline: compute bound (FLOPs) or memory bound (read the input, write the output:
    // about twice the output activation), whichever is slower.
    const double compute_ns = p.batch_size * zl.forward_flops / (device.sustained_tflops * 1e3);
    const double memory_ns = p.batch_size * 2.0 * zl.activation_bytes / device.memory_gbps;
    const double fwd_ns = std::max(compute_ns, memory_ns);
    l.forward = static_cast<TimeNs>(std::llround(fwd_ns)) + device.layer_overhead;
    l.backward = static_cast<TimeNs>(std::llround(kBackwardRatio * fwd_ns)) + device.layer_overhead;
    const double update_ns = 5.0 * static_cast<double>(l.bytes()) / device.memory_gbps;
    l.update = static_cast<TimeNs>(std::llround(update_ns));
    p.layers.push_back(std::move(l));
  }
  return p;
}

Result<Profile> load_model(const std::string& name_or_path, const std::string& device,
                           int batch_size) {
  for (const ZooModel& m : zoo_models()) {
    if (m.name == name_or_path) {
      QS_ASSIGN_OR_RETURN(const Device* d, find_device(device));
      return make_zoo_profile(m, *d, batch_size);
    }
  }
  auto p = load_profile(name_or_path);
  if (!p.is_ok() && p.status().code() == StatusCode::kNotFound) {
    std::string known;
    for (const ZooModel& m : zoo_models()) known += (known.empty() ? "" : ", ") + m.name;
    return not_found("'" + name_or_path + "' is neither a built-in model (" + known +
                     ") nor an existing profile file");
  }
  if (p.is_ok() && batch_size > 0 && batch_size != p->batch_size) {
    // A profile's times were measured at its own batch size; changing the batch alone
    // would only change the samples/s figure.
    return invalid_argument("--batch-size " + std::to_string(batch_size) +
                            " differs from the profile's batch_size " +
                            std::to_string(p->batch_size) +
                            ": its times are for that batch (edit the profile instead)");
  }
  return p;
}

}  // namespace qs
