// gloo over TCP as the all-reduce runtime's engine (quicksilver/runtime/communicator.h):
// one gloo context for the control channel and one per link, each with its own TCP device
// bound to that link's address, found through the coordinator's store (store.h); every
// all-reduce is checked_allreduce (checked_allreduce.h) on the link's context.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/communicator.h"

namespace qs::runtime {

struct GlooSettings {
  int rank = 0;
  int workers = 1;
  Endpoint store;
  std::shared_ptr<const transport::Secret> secret;
  TimeNs connect_timeout = 0;
  TimeNs peer_timeout = 0;
  std::vector<std::string> links;  // this host's address per link
  GlooAlgorithm algorithm = GlooAlgorithm::kRing;
  int via_rank = -1;  // CollectiveOptions::via_rank, via
  Endpoint via;
  std::function<void(const std::string&)> log;  // CollectiveOptions::log
};

// Meets the other ranks (every context connected, the store told this rank is done).
// Errors name the rank ("worker 2: gloo rendezvous failed: ...").
Result<std::unique_ptr<Communicator>> connect_gloo(const GlooSettings& settings);

}  // namespace qs::runtime
