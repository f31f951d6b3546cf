// Which Python interpreter runs quicksilver's Python code (`quicksilver run --script`,
// `quicksilver profile`). One rule for every caller; scripts/python.sh is the same rule for
// the shell scripts (with QS_PYTHON for --python), docs/cli.md states it for users:
//
//   1. the interpreter asked for (--python), used as given;
//   2. the interpreter the build was made for (CMake's Python3_EXECUTABLE with
//      QS_WITH_TORCH, recorded in build/python-interpreter and compiled into the CLI as
//      QS_BUILD_PYTHON), when it is an executable file;
//   3. `python3` on PATH, when it imports torch;
//   4. /usr/bin/python3 (Debian's, which sees python3-torch), when it imports torch.
//
// The launch layer reads no environment: the caller passes PATH in.
#pragma once

#include <string>

#include "quicksilver/core/status.h"

namespace qs {

struct PythonSearch {
  std::string given;  // --python: used as is when not empty (not checked)
  std::string build;  // the interpreter the build was made for; empty: none recorded
  std::string path;   // the PATH to look up `python3` in (colon-separated; empty: none)
  // The last resort. A test aid: tests point it at a stub.
  std::string system = "/usr/bin/python3";
};

// The interpreter chosen by the rule above. Steps 3 and 4 each start the candidate once
// (`-c 'import torch'`, about a second with torch 1.13); a candidate that is the same file
// as one already rejected is not started again. When no step gives one: not_found, one
// line naming every candidate tried and why it was rejected (not given, no such
// executable file, the last line of its import error), and the remedy: --python PATH, or
// installing torch.
Result<std::string> choose_python(const PythonSearch& search);

}  // namespace qs
