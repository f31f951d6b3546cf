// Rendezvous for jobs on real hosts: a coordinator that servers register with and workers
// ask for the server list, so that only one address (the coordinator's) has to be known
// in advance and servers may listen on ephemeral ports.
//
// Line protocol over TCP (ASCII, one line each way):
//   server -> "server <id> <port>\n"   coordinator -> "ok\n"
//   worker -> "worker <id>\n"          coordinator -> "servers <host:port>,...\n" once all
//                                      M servers registered (server s at position s)
//   on any error                       coordinator -> "error <text>\n" and closes
// With a secret (CoordinatorOptions::secret), every connection first authenticates both
// ways (transport/auth.h, context kRendezvousAuthContext); a peer that fails is closed
// without a word and the slot it asked for stays free.
// A server's host is the address its registration came from, as the coordinator saw it.
// The coordinator returns once every worker got the list; it fails on a duplicate or
// out-of-range id, a malformed line, or when `timeout` passes.
#pragma once

#include <atomic>
#include <functional>
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

struct CoordinatorOptions {
  Endpoint listen;  // port 0 = ephemeral; the host defaults to loopback (127.0.0.1)
  int workers = 1;
  int servers = 1;
  TimeNs timeout = 300 * kNsPerSec;
  // The cluster secret every client must prove it knows before its line is read (and the
  // coordinator proves it to them). Null: no authentication.
  std::shared_ptr<const transport::Secret> secret;
  // What peers that have not sent their request may hold (a deadline, a cap, a pause when
  // out of descriptors).
  transport::AcceptLimits limits;
  // One line per refused peer and per paused accept. May be empty.
  std::function<void(std::string_view)> log;
};

// What a rendezvous connection's authentication is for (transport::Handshake's context).
inline constexpr const char* kRendezvousAuthContext = "quicksilver-rendezvous";

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> create(const CoordinatorOptions& options);
  ~Coordinator();
  int port() const { return port_; }
  // Serves registrations and look-ups until every worker has the list. Blocking.
  Status run();
  // Thread-safe, during run(): connections accepted, refused (authentication, a bad or
  // duplicate request, the deadline, the cap), pending now (not yet identified), accepts
  // that failed, and poll() calls made (a loop that spins shows here).
  struct Counters {
    std::int64_t accepted = 0, refused = 0;
    int pending = 0;
    std::int64_t accept_failures = 0, polls = 0;
  };
  Counters counters() const;

 private:
  Coordinator(CoordinatorOptions options, int fd, int port)
      : options_(std::move(options)), fd_(fd), port_(port) {}
  CoordinatorOptions options_;
  int fd_;
  int port_;
  std::atomic<std::int64_t> accepted_{0}, refused_{0}, accept_failures_{0},
      polls_{0};  // run() writes
  std::atomic<int> pending_{0};
};

// The protocol's lines, parsed without I/O (the coordinator, the clients and the fuzz
// target fuzz/rendezvous_fuzz.cc go through these).
struct RendezvousRequest {
  enum class Role { kServer, kWorker };
  Role role = Role::kWorker;
  long id = -1;    // not range-checked here: the coordinator knows N and M
  long port = -1;  // kServer only
};
// "server <id> <port>" or "worker <id>" (no newline; fields separated by whitespace).
// Errors: kProtocolError "expected 'server ID PORT' or 'worker ID'".
Result<RendezvousRequest> parse_rendezvous_request(std::string_view line);
// The coordinator's reply to a look-up, "servers <host:port>,..." (no newline): the
// addresses in order, each port in 1..65535 and each host non-empty. Errors: kProtocolError
// naming the reply or the bad address.
Result<std::vector<Endpoint>> parse_server_list(std::string_view reply);

// Registers server `id`, listening on `port`, with the coordinator (retrying until
// `timeout` passes). With `secret`, authenticates first (both ways: a coordinator without
// the secret is refused).
Status register_server(const Endpoint& coordinator, int id, int port, TimeNs timeout,
                       const transport::Secret* secret = nullptr);
// Asks the coordinator for the servers' addresses (waits until all have registered or
// `timeout` passes). `secret` as in register_server.
Result<std::vector<Endpoint>> lookup_servers(const Endpoint& coordinator, int worker_id,
                                             TimeNs timeout,
                                             const transport::Secret* secret = nullptr);

}  // namespace qs::runtime
