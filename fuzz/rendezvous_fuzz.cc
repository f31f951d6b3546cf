// libFuzzer target: the rendezvous protocol's lines (include/runtime/quicksilver/runtime/
// rendezvous.h), the coordinator's request parser and the clients' server-list parser.
// Properties: a parsed server request has a role and the fields it needs; every address of
// a parsed list has a non-empty host and a port in 1..65535.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "quicksilver/core/check.h"
#include "quicksilver/runtime/rendezvous.h"

using namespace qs::runtime;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The coordinator reads one line of at most 256 bytes; the parsers take any text.
  const std::string_view line = text.substr(0, text.find('\n'));
  if (auto r = parse_rendezvous_request(line)) {
    QS_CHECK(r->role == RendezvousRequest::Role::kWorker ||
             r->role == RendezvousRequest::Role::kServer);
    if (r->role == RendezvousRequest::Role::kWorker) QS_CHECK(r->port == -1);
  }
  if (auto list = parse_server_list(line)) {
    QS_CHECK(!list->empty());
    for (const Endpoint& e : *list) QS_CHECK(!e.host.empty() && e.port >= 1 && e.port <= 65535);
  }
  return 0;
}
