// Private: SIGINT, SIGTERM and SIGHUP (a closed terminal) caught while a launcher runs, so
// that it can stop its children and remove what it made; the previous handlers are put
// back when the scope ends. Only SIGKILL leaves a run's leftovers (`quicksilver cleanup`).
#pragma once

#include <csignal>

namespace qs::runtime {

class StopSignals {
 public:
  // `handler` runs on each caught signal (async-signal-safe: it sets a flag). Inactive:
  // nothing is changed.
  StopSignals(bool active, void (*handler)(int)) : active_(active) {
    if (!active_) return;
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kCaught[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    if (!active_) return;
    for (int i = 0; i < 3; ++i) sigaction(kCaught[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kCaught[3] = {SIGINT, SIGTERM, SIGHUP};
  bool active_;
  struct sigaction old_[3]{};
};

}  // namespace qs::runtime
