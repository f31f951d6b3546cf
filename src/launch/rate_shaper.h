// Private: a time-varying link rate on the emulated cluster. Applies a bandwidth schedule
// to every host's shaper (NetnsCluster::set_rate_all) over time, on a thread of its own
// from start() (the schedule's time 0) until destroyed; the first segment's rate is the
// caller's to set before. Used by `run --bandwidth-trace` (launcher.cc) and by `run
// --script --netns --bandwidth-trace` (script_launcher.cc).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "quicksilver/core/bandwidth_schedule.h"
#include "quicksilver/core/units.h"
#include "quicksilver/runtime/netns.h"

namespace qs::launch {

class RateShaper {
 public:
  // `schedule` may be null (nothing to change: start() only records the time); it and
  // `cluster` outlive this object. `log` gets a failed change's message.
  RateShaper(runtime::NetnsCluster* cluster, const BandwidthSchedule* schedule,
             std::function<void(const std::string&)> log);
  RateShaper(const RateShaper&) = delete;
  RateShaper& operator=(const RateShaper&) = delete;
  ~RateShaper();

  void start();
  // When start() was called: steady clock (CLOCK_MONOTONIC) nanoseconds, as the workers'
  // reports; -1 before.
  TimeNs started_at() const { return start_; }

 private:
  runtime::NetnsCluster* cluster_;
  const BandwidthSchedule* schedule_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
  TimeNs start_ = -1;
};

}  // namespace qs::launch
