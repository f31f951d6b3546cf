// libFuzzer target: the profile loader's parser (include/model/quicksilver/model/profile.h).
// Properties: bad input is a Status, never an exception or a crash; a profile that parses
// is valid, and writes out and reads back equal (profile_to_json round trip).
#include <cstddef>
#include <cstdint>
#include <string>

#include "quicksilver/core/check.h"
#include "quicksilver/model/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Any name: the default name comes from a file name, which need not be UTF-8.
  auto p = qs::profile_from_json(text, "<fuzz>", std::string(text.substr(0, 8)));
  if (!p) return 0;
  QS_CHECK_MSG(qs::validate_profile(*p).is_ok(), "a parsed profile is valid");
  auto back = qs::profile_from_json(qs::profile_to_json(*p), "<round trip>");
  QS_CHECK_MSG(back.is_ok(), back.status().to_string());
  QS_CHECK(back->name == p->name && back->batch_size == p->batch_size);
  QS_CHECK(back->num_layers() == p->num_layers() && back->num_tensors() == p->num_tensors());
  QS_CHECK(back->total_bytes() == p->total_bytes());
  for (int l = 0; l < p->num_layers(); ++l) {
    const auto& a = p->layers[static_cast<std::size_t>(l)];
    const auto& b = back->layers[static_cast<std::size_t>(l)];
    QS_CHECK(a.name == b.name && a.forward == b.forward && a.backward == b.backward &&
             a.update == b.update);
  }
  return 0;
}
