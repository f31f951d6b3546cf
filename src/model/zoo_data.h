// Private: the zoo's JSON files, embedded at build time (cmake/embed_files.cmake).
#pragma once

#include <vector>

namespace qs {

struct EmbeddedFile {
  const char* stem;  // file name without extension, e.g. "vgg16"
  const char* text;  // the whole JSON document
};

const std::vector<EmbeddedFile>& embedded_zoo_files();

}  // namespace qs
