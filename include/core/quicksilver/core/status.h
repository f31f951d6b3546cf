// Status and Result<T>: how every fallible operation inside Quicksilver reports an error.
//
// Validation and I/O failures are values, never exceptions (STYLE.md practice 7). A
// Status carries a code and one human-readable message that names what is wrong (the
// field, the layer, the peer); callers add context with Status::with_context().
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace qs {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input: a flag, a profile field, a unit
  kNotFound,         // a file, a model name, a policy name
  kIoError,          // a system call failed
  kProtocolError,    // a peer sent something that violates the wire protocol
  kUnavailable,      // a peer died, timed out or closed the connection
  kInternal,         // a broken invariant that was caught instead of crashing
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "code: message", or "OK".
  std::string to_string() const;
  // Returns a copy whose message is "context: message" (no-op on OK, and on a message that
  // begins so already).
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return {StatusCode::kInvalidArgument, std::move(msg)};
}
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
inline Status protocol_error(std::string msg) {
  return {StatusCode::kProtocolError, std::move(msg)};
}
inline Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

// Either a T or a non-OK Status. Accessing value() of an error is a programming error
// and fails a check.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const;
  T& value() &;
  const T& value() const&;
  T&& value() &&;
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void fail_check(const char* file, int line, const std::string& what);

template <typename T>
const Status& Result<T>::status() const {
  static const Status kOk;
  return is_ok() ? kOk : std::get<Status>(v_);
}
template <typename T>
T& Result<T>::value() & {
  if (!is_ok()) fail_check(__FILE__, __LINE__, "value() of an error: " + status().to_string());
  return std::get<T>(v_);
}
template <typename T>
const T& Result<T>::value() const& {
  if (!is_ok()) fail_check(__FILE__, __LINE__, "value() of an error: " + status().to_string());
  return std::get<T>(v_);
}
template <typename T>
T&& Result<T>::value() && {
  if (!is_ok()) fail_check(__FILE__, __LINE__, "value() of an error: " + status().to_string());
  return std::get<T>(std::move(v_));
}

}  // namespace qs

// Propagates a non-OK Status from an expression that yields Status.
#define QS_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::qs::Status qs_status_ = (expr);           \
    if (!qs_status_.is_ok()) return qs_status_; \
  } while (0)

#define QS_CONCAT_INNER_(a, b) a##b
#define QS_CONCAT_(a, b) QS_CONCAT_INNER_(a, b)
// `QS_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its Status.
#define QS_ASSIGN_OR_RETURN(lhs, expr) \
  QS_ASSIGN_OR_RETURN_IMPL_(QS_CONCAT_(qs_result_, __LINE__), lhs, expr)
#define QS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
