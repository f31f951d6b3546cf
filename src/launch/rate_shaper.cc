#include "rate_shaper.h"

#include <chrono>
#include <utility>

namespace qs::launch {

RateShaper::RateShaper(runtime::NetnsCluster* cluster, const BandwidthSchedule* schedule,
                       std::function<void(const std::string&)> log)
    : cluster_(cluster), schedule_(schedule), log_(std::move(log)) {}

RateShaper::~RateShaper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RateShaper::start() {
  const auto t0 = std::chrono::steady_clock::now();
  start_ = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
  if (schedule_ == nullptr || cluster_ == nullptr) return;
  thread_ = std::thread([this, t0] {
    const auto& segs = schedule_->segments();
    std::unique_lock lock(mu_);
    for (std::size_t i = 1; i < segs.size(); ++i) {
      // Wakes at the segment's start (or at once when the run ends).
      if (cv_.wait_until(lock, t0 + std::chrono::nanoseconds(segs[i].start), [&] { return stop_; }))
        break;
      Status c = cluster_->set_rate_all(segs[i].rate);
      if (!c.is_ok()) log_("changing the rate: " + c.message());
    }
  });
}

}  // namespace qs::launch
