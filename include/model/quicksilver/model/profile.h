// The job profile: a model's layers in forward order, their tensors and compute times.
//
// Conventions (DESIGN.md): layers are stored in forward order, index 0 = input side.
// The paper's layer number l (1..L) is index + 1. A smaller index is more urgent: its
// parameters are needed first by the next forward pass. A layer's gradient is ready when
// its backward ends; its parameters are needed when its forward starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs {

struct TensorSpec {
  std::string name;
  std::int64_t elements = 0;
  int bytes_per_element = 4;

  Bytes bytes() const { return elements * bytes_per_element; }
};

struct LayerSpec {
  std::string name;
  TimeNs forward = 0;   // forward compute time of one iteration (whole local batch)
  TimeNs backward = 0;  // backward compute time
  TimeNs update = 0;    // optimizer step for this layer's parameters
  std::vector<TensorSpec> tensors;

  Bytes bytes() const;
  std::int64_t parameters() const;
};

struct Profile {
  std::string name;
  int batch_size = 32;
  std::vector<LayerSpec> layers;

  int num_layers() const { return static_cast<int>(layers.size()); }
  int num_tensors() const;
  Bytes total_bytes() const;
  std::int64_t total_parameters() const;
  // Sum of forward + backward + update over all layers: the oracle's iteration time
  // (Mercury paper eq. 9).
  TimeNs compute_time() const;
};

// Limits that make a profile "absurd" rather than merely large. A profile beyond them
// is rejected with an error that names the field and the layer.
struct ProfileLimits {
  std::int64_t max_tensor_elements = std::int64_t{1} << 36;  // 64 Gi elements
  Bytes max_total_bytes = Bytes{1} << 40;                    // 1 TiB of gradients
  double max_layer_ms = 1e6;                                 // 1000 s per phase
  int max_layers = 1'000'000;
};

// Checks every field; the error names the field and the layer ("layer 3 'fc1':
// tensors[0].elements must be > 0"). Names must be non-empty, well-formed UTF-8.
Status validate_profile(const Profile& p, const ProfileLimits& limits = {});

// JSON (format of DESIGN.md). Unknown fields are ignored. `source` names the input in
// error messages (a file path or "<string>"); when the JSON has no "name", the profile
// is named after `default_name`.
Result<Profile> profile_from_json(const std::string& text, const std::string& source = "<string>",
                                  const std::string& default_name = "profile");
std::string profile_to_json(const Profile& p);
// A profile file is at most this long (the largest zoo profile is ~20 KiB); a device, a
// FIFO or a larger file is refused before it is read.
inline constexpr std::int64_t kMaxProfileFileBytes = std::int64_t{64} << 20;  // 64 MiB
// Reads and parses the profile file at `path` (a regular file of at most
// kMaxProfileFileBytes). Errors: not_found when there is no such file; invalid_argument
// naming the file and the field otherwise. A profile without "name" is named after the
// file's stem (bytes that are not UTF-8 become '?').
Result<Profile> load_profile(const std::string& path);
Status save_profile(const Profile& p, const std::string& path);

}  // namespace qs
