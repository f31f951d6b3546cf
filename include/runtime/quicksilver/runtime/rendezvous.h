// Rendezvous for jobs on real hosts: a coordinator that servers register with and workers
// ask for the server list, so that only one address (the coordinator's) has to be known
// in advance and servers may listen on ephemeral ports.
//
// Line protocol over TCP (ASCII, one line each way):
//   server -> "server <id> <port>\n"   coordinator -> "ok\n"
//   worker -> "worker <id>\n"          coordinator -> "servers <host:port>,...\n" once all
//                                      M servers registered (server s at position s)
//   on any error                       coordinator -> "error <text>\n" and closes
// A server's host is the address its registration came from, as the coordinator saw it.
// The coordinator returns once every worker got the list; it fails on a duplicate or
// out-of-range id, a malformed line, or when `timeout` passes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/runtime/runtime.h"

namespace qs::runtime {

struct CoordinatorOptions {
  Endpoint listen;  // port 0 = ephemeral
  int workers = 1;
  int servers = 1;
  TimeNs timeout = 300 * kNsPerSec;
};

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> create(const CoordinatorOptions& options);
  ~Coordinator();
  int port() const { return port_; }
  // Serves registrations and look-ups until every worker has the list. Blocking.
  Status run();

 private:
  Coordinator(CoordinatorOptions options, int fd, int port) : options_(std::move(options)), fd_(fd), port_(port) {}
  CoordinatorOptions options_;
  int fd_;
  int port_;
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
// `timeout` passes).
Status register_server(const Endpoint& coordinator, int id, int port, TimeNs timeout);
// Asks the coordinator for the servers' addresses (waits until all have registered or
// `timeout` passes).
Result<std::vector<Endpoint>> lookup_servers(const Endpoint& coordinator, int worker_id, TimeNs timeout);

}  // namespace qs::runtime
