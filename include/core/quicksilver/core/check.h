// QS_CHECK: a broken internal invariant (a programming error, never bad input).
//
// A failed check throws qs::CheckFailure naming the file, the line and the condition, so
// the CLI prints it and exits non-zero and a test can observe it; it never aborts silently.
#pragma once

#include <stdexcept>
#include <string>

#include "quicksilver/core/status.h"

namespace qs {

class CheckFailure : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace qs

#define QS_CHECK(cond)                                                         \
  do {                                                                         \
    if (!(cond)) ::qs::fail_check(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define QS_CHECK_MSG(cond, msg)                                                               \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::qs::fail_check(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)
