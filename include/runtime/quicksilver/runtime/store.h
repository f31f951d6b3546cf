// The key-value store of the all-reduce runtime's rendezvous: gloo's contexts find each
// other through a gloo::rendezvous::Store, and Debian's gloo (2022) ships none over TCP, so
// the job's coordinator serves one (`quicksilver coordinator --architecture allreduce`).
//
// Line protocol over TCP (ASCII; one connection per client, any number of requests):
//   "set KEY HEX"  -> "ok"                  KEY: 1..128 of [A-Za-z0-9_./:-]; the value is
//                                           HEX-encoded, at most kMaxStoreValue bytes
//   "get KEY"      -> "value HEX"           answered once KEY is set (the request waits)
//   "done RANK"    -> "ok"                  the rank has every context it needs
//   on any error   -> "error <text>" and the connection is closed
// The server returns once all N ranks said done, or fails at its deadline naming the ranks
// that did not. With a cluster secret every client authenticates first, both ways
// (transport/auth.h, context "quicksilver-store"): a stranger reads nothing and writes
// nothing; a client not authenticated within AcceptLimits::handshake_timeout is closed,
// and at most AcceptLimits::max_pending wait at once (the oldest goes). Everything a stranger can
// make it hold is bounded: the keys (kMaxStoreKeys, kMaxStoreBytes), each value, each line, the
// connections (kMaxStoreClients).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/runtime/runtime.h"
#include "quicksilver/transport/auth.h"
#include "quicksilver/transport/socket.h"

namespace qs::runtime {

inline constexpr std::size_t kMaxStoreValue = 64 * 1024;
inline constexpr std::size_t kMaxStoreKeys = 1024;
inline constexpr std::size_t kMaxStoreBytes = 8 * 1024 * 1024;  // all values together
inline constexpr std::size_t kMaxStoreClients = 256;
inline constexpr const char* kStoreAuthContext = "quicksilver-store";

class StoreServer {
 public:
  // Listens on `listen` (port 0: ephemeral) for a job of `ranks` ranks; `secret` null: no
  // authentication (a trusted network only).
  static Result<std::unique_ptr<StoreServer>> create(
      const Endpoint& listen, int ranks, TimeNs timeout,
      std::shared_ptr<const transport::Secret> secret = nullptr,
      transport::AcceptLimits limits = {});
  ~StoreServer();
  int port() const { return port_; }
  // Serves until every rank said done (OK) or the deadline. Blocking.
  Status run();
  // Thread-safe: makes run() return soon (OK if every rank was done, else an error).
  void request_stop();

 private:
  StoreServer(int fd, int port, int ranks, TimeNs timeout);
  int fd_, port_, ranks_;
  TimeNs timeout_;
  std::shared_ptr<const transport::Secret> secret_;
  transport::AcceptLimits limits_;
  int wake_[2] = {-1, -1};  // a pipe: request_stop() writes, run() polls
};

// A blocking client; one per thread.
class StoreClient {
 public:
  // Connects (retrying until `timeout` passes) and, with `secret`, authenticates (a store
  // without the secret is refused too).
  static Result<std::unique_ptr<StoreClient>> connect(const Endpoint& server, TimeNs timeout,
                                                      const transport::Secret* secret = nullptr);
  ~StoreClient();
  Status set(std::string_view key, std::string_view value);
  // Waits until `key` is set or `timeout` passes.
  Result<std::string> get(std::string_view key, TimeNs timeout);
  Status done(int rank);

 private:
  explicit StoreClient(int fd) : fd_(fd) {}
  Result<std::string> request(const std::string& line, TimeNs timeout);
  int fd_;
  std::string buffer_;
};

// The protocol's pieces, without I/O (tests and fuzzing).
struct StoreRequest {
  enum class Kind { kSet, kGet, kDone };
  Kind kind = Kind::kGet;
  std::string key;    // kSet, kGet
  std::string value;  // kSet: decoded
  long rank = -1;     // kDone
};
Result<StoreRequest> parse_store_request(std::string_view line);
std::string hex_encode(std::string_view bytes);
Result<std::string> hex_decode(std::string_view hex);

}  // namespace qs::runtime
