#include "quicksilver/transport/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "quicksilver/core/check.h"

namespace qs::transport {

Result<std::unique_ptr<EventLoop>> EventLoop::create(const Clock& clock) {
  Fd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep.valid()) return errno_status("epoll_create1", errno);
  Fd tfd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!tfd.valid()) return errno_status("timerfd_create", errno);
  Fd wfd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wfd.valid()) return errno_status("eventfd", errno);
  std::unique_ptr<EventLoop> loop(
      new EventLoop(clock, std::move(ep), std::move(tfd), std::move(wfd)));
  const int tf = loop->timer_fd_.get();
  QS_RETURN_IF_ERROR(loop->watch(tf, EPOLLIN, [l = loop.get(), tf](std::uint32_t) {
    std::uint64_t n;
    while (::read(tf, &n, sizeof n) > 0) {
    }
    l->armed_ = kTimeNever;
    l->fire_timers();
  }));
  const int wf = loop->wake_fd_.get();
  QS_RETURN_IF_ERROR(loop->watch(wf, EPOLLIN, [l = loop.get(), wf](std::uint32_t) {
    std::uint64_t n;
    while (::read(wf, &n, sizeof n) > 0) {
    }
    l->run_posted();
  }));
  return loop;
}

EventLoop::EventLoop(const Clock& clock, Fd epoll, Fd timer, Fd wake)
    : clock_(clock),
      epoll_(std::move(epoll)),
      timer_fd_(std::move(timer)),
      wake_fd_(std::move(wake)) {}

EventLoop::~EventLoop() = default;

Status EventLoop::watch(int fd, std::uint32_t events, IoCallback cb) {
  QS_CHECK(io_.find(fd) == io_.end());
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    return errno_status("epoll_ctl(ADD)", errno);
  io_.emplace(fd, std::move(cb));
  return Status::ok();
}

Status EventLoop::modify(int fd, std::uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0)
    return errno_status("epoll_ctl(MOD)", errno);
  return Status::ok();
}

void EventLoop::unwatch(int fd) {
  if (io_.erase(fd) > 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

EventLoop::TimerId EventLoop::schedule_at(TimeNs when, std::function<void()> fn) {
  const TimerId id = next_timer_++;
  timers_.emplace(std::make_pair(when, id), std::move(fn));
  timer_when_.emplace(id, when);
  if (when < armed_) arm_timer();
  return id;
}

void EventLoop::cancel(TimerId id) {
  auto it = timer_when_.find(id);
  if (it == timer_when_.end()) return;
  timers_.erase({it->second, id});
  timer_when_.erase(it);
}

void EventLoop::arm_timer() {
  itimerspec spec{};
  if (!timers_.empty()) {
    TimeNs when = std::max<TimeNs>(timers_.begin()->first.first, 1);
    spec.it_value.tv_sec = when / kNsPerSec;
    spec.it_value.tv_nsec = when % kNsPerSec;
    armed_ = when;
  } else {
    armed_ = kTimeNever;
  }
  ::timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
}

void EventLoop::fire_timers() {
  const TimeNs now = clock_.now();
  while (!timers_.empty() && timers_.begin()->first.first <= now && error_.is_ok()) {
    auto node = timers_.extract(timers_.begin());
    timer_when_.erase(node.key().second);
    node.mapped()();
  }
  arm_timer();
}

void EventLoop::fail(Status s) {
  if (error_.is_ok() && !s.is_ok()) error_ = std::move(s);
}

void EventLoop::post(std::function<void()> fn) {
  {
    MutexLock lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
}

void EventLoop::run_posted() {
  std::vector<std::function<void()>> now;
  {
    MutexLock lock(posted_mu_);
    now.swap(posted_);
  }
  for (auto& fn : now) {
    if (!error_.is_ok()) break;
    fn();
  }
}

void EventLoop::request_stop(const std::string& why) {
  if (!stop_requested_.load(std::memory_order_acquire)) {
    stop_reason_ = why;
    stop_requested_.store(true, std::memory_order_release);
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
}

Status EventLoop::run(const std::function<bool()>& done) {
  std::vector<epoll_event> events(64);
  while (error_.is_ok()) {
    if (stop_requested_.load(std::memory_order_acquire))
      return unavailable("stopped: " + stop_reason_);
    if (done()) return Status::ok();
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                               deferred_.empty() ? -1 : 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("epoll_wait", errno);
    }
    for (int i = 0; i < n && error_.is_ok(); ++i) {
      auto it = io_.find(events[static_cast<std::size_t>(i)].data.fd);
      if (it == io_.end()) continue;  // unwatched by an earlier callback of this batch
      IoCallback cb = it->second;     // a copy: the callback may unwatch itself
      cb(events[static_cast<std::size_t>(i)].events);
    }
    if (error_.is_ok() && !timers_.empty() && timers_.begin()->first.first <= clock_.now())
      fire_timers();
    if (error_.is_ok() && !deferred_.empty()) {
      std::vector<std::function<void()>> now;
      now.swap(deferred_);
      for (auto& fn : now) {
        if (!error_.is_ok()) break;
        fn();
      }
    }
  }
  return error_;
}

}  // namespace qs::transport
