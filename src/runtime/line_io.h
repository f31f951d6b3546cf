// Newline-terminated text over a TCP socket, each call bounded by a deadline (the
// SteadyClock's): the coordinator's rendezvous protocol (rendezvous.cc) and the all-reduce
// store's (store.cc) share these. Private to the runtime.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::runtime {

// Writes all of `data` to `fd` (blocking or not) before `deadline`. Errors name `what`
// ("store send: ...", "store send timed out").
Status send_all(int fd, std::string_view data, TimeNs deadline, std::string_view what);

// One line from `fd` (without its newline) before `deadline`, reading into `buffer` (the
// bytes after the line stay there for the next call). `peer` names the other end in
// errors ("recv from the coordinator", "the coordinator closed the connection"); a line
// longer than `max_line` is a protocol error.
Result<std::string> read_line(int fd, TimeNs deadline, std::string* buffer, std::size_t max_line,
                              std::string_view peer);

}  // namespace qs::runtime
