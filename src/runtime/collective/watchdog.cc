#include "watchdog.h"

#include <algorithm>

#include "quicksilver/core/status.h"
#include "quicksilver/transport/clock.h"

namespace qs::runtime {

void PeerWatchdog::start() {
  heard();
  schedule();
}

void PeerWatchdog::heard() { last_heard_ = transport::steady_now(); }

void PeerWatchdog::schedule() {
  loop_.schedule_after(std::max<TimeNs>(peer_timeout_ / 4, kNsPerMs), [this] {
    const State s = state_();
    if (s.done) return;
    if (s.on_peers && transport::steady_now() - last_heard_ > peer_timeout_) {
      // With two workers the silent one is known.
      const std::string who = workers_ == 2
                                  ? "lost worker " + std::to_string(1 - rank_) + ": nothing from it"
                                  : "nothing from the other workers";
      loop_.fail(unavailable("worker " + std::to_string(rank_) + ": " + who + " for " +
                             format_time(peer_timeout_) + " in iteration " +
                             std::to_string(s.iteration) + " (" + s.waiting_for +
                             "; a peer stalled or ended early)"));
      return;
    }
    schedule();
  });
}

}  // namespace qs::runtime
