#include "quicksilver/core/status.h"

#include "quicksilver/core/check.h"

namespace qs {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kProtocolError:
      return "protocol error";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  // A message that already names its context ("server 1: lost worker 2 ...") keeps one.
  if (message_.compare(0, context.size() + 2, context + ": ") == 0) return *this;
  return {code_, context + ": " + message_};
}

void fail_check(const char* file, int line, const std::string& what) {
  throw CheckFailure(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace qs
