// The all-reduce worker's watchdog, over any engine: a worker waiting on its peers (a
// collective outstanding, a forward gate closed on sums, or worker 0's decisions not yet
// come) with nothing from them for the peer timeout fails, saying what it waited for.
// Waiting for its own compute (a PyTorch user's evaluation pass) is not waiting on peers.
#pragma once

#include <functional>
#include <string>

#include "quicksilver/transport/event_loop.h"

namespace qs::runtime {

class PeerWatchdog {
 public:
  struct State {
    bool done = false;      // nothing left to wait for: the watchdog ends
    bool on_peers = false;  // waiting on the peers now
    std::string waiting_for;
    std::int64_t iteration = 0;
  };
  // Loop thread only. `rank`, `workers`: to name the silent peer when it is known.
  PeerWatchdog(transport::EventLoop& loop, TimeNs peer_timeout, int rank, int workers,
               std::function<State()> state)
      : loop_(loop),
        peer_timeout_(peer_timeout),
        rank_(rank),
        workers_(workers),
        state_(std::move(state)) {}
  // Starts watching (the peers count as heard now).
  void start();
  // Something came from the peers.
  void heard();

 private:
  void schedule();

  transport::EventLoop& loop_;
  const TimeNs peer_timeout_;
  const int rank_, workers_;
  std::function<State()> state_;
  TimeNs last_heard_ = 0;
};

}  // namespace qs::runtime
