// EventLoop: one thread's epoll loop with timers. Each runtime node (a worker or a server)
// owns one loop and runs everything on it (sockets, compute-emulation timers, policy
// callbacks), so its state has a single owner and needs no locks (STYLE.md practice 14).
//
// Timers fire in (time, sequence) order: a strict order, so equal times fire in the order
// they were scheduled. They are armed on a timerfd (CLOCK_MONOTONIC, nanosecond
// resolution), the clock SteadyClock reads.
// Thread safety: everything is loop-thread only, except post() and request_stop().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "quicksilver/core/mutex.h"
#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/socket.h"

namespace qs::transport {

class EventLoop {
 public:
  using IoCallback = std::function<void(std::uint32_t events)>;
  using TimerId = std::uint64_t;

  // `clock` must be the steady clock for timers to fire on time (the timerfd is
  // CLOCK_MONOTONIC); it is a parameter so the loop and its users read one seam.
  static Result<std::unique_ptr<EventLoop>> create(const Clock& clock = SteadyClock::instance());
  ~EventLoop();

  const Clock& clock() const { return clock_; }
  TimeNs now() const { return clock_.now(); }

  // Watches `fd` for `events` (EPOLLIN/EPOLLOUT, level-triggered). The callback runs on the
  // loop thread. Precondition: fd not yet watched.
  Status watch(int fd, std::uint32_t events, IoCallback cb);
  Status modify(int fd, std::uint32_t events);
  // Stops watching (safe inside the fd's own callback).
  void unwatch(int fd);

  // Runs `fn` at `when` (absolute, clock time). Returns an id for cancel().
  TimerId schedule_at(TimeNs when, std::function<void()> fn);
  TimerId schedule_after(TimeNs delay, std::function<void()> fn) {
    return schedule_at(now() + delay, std::move(fn));
  }
  void cancel(TimerId id);
  // Runs `fn` once the current batch of events is handled, before the loop sleeps again
  // (cheaper than a zero-delay timer: no timerfd call).
  void defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  // Thread-safe: runs `fn` on the loop thread soon (after the current batch of events),
  // in the order posted. For work that arrives on other threads (PyTorch's autograd hooks,
  // a collective library's completion callbacks). A function posted after run() returned
  // waits for the next run(); one still queued when the loop is destroyed never runs.
  void post(std::function<void()> fn);

  // Runs until `done()` is true (checked after every batch of events and timers), stop is
  // requested, or an error is posted with fail(). Returns the first error posted, or
  // kUnavailable when stopped from another thread.
  Status run(const std::function<bool()>& done);
  // Posts an error: run() returns it after the current callback (first error wins).
  void fail(Status s);
  const Status& error() const { return error_; }

  // Thread-safe: makes run() return kUnavailable("stopped: <why>") soon.
  void request_stop(const std::string& why);

 private:
  EventLoop(const Clock& clock, Fd epoll, Fd timer, Fd wake);
  void arm_timer();
  void fire_timers();
  void run_posted();

  const Clock& clock_;
  Fd epoll_, timer_fd_, wake_fd_;
  std::unordered_map<int, IoCallback> io_;                              // loop thread only
  std::map<std::pair<TimeNs, TimerId>, std::function<void()>> timers_;  // loop thread only
  std::unordered_map<TimerId, TimeNs> timer_when_;                      // loop thread only
  std::vector<std::function<void()>> deferred_;                         // loop thread only
  TimerId next_timer_ = 1;
  TimeNs armed_ = kTimeNever;
  Status error_;
  Mutex posted_mu_;
  std::vector<std::function<void()>> posted_ QS_GUARDED_BY(posted_mu_);  // any thread -> loop
  std::atomic<bool> stop_requested_{false};                              // any thread -> loop
  std::string stop_reason_;  // written before stop_requested_ (release)
};

}  // namespace qs::transport
