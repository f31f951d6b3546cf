// EventLoop: timers in (time, order) and post() from other threads.
#include "quicksilver/transport/event_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace qs::transport {
namespace {

TEST(EventLoop, PostFromManyThreadsRunsEveryFunctionOnTheLoopThreadInOrderPerThread) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  constexpr int kThreads = 4, kEach = 2000;
  std::vector<int> last(kThreads, -1);  // loop thread only
  int ran = 0;
  bool in_order = true;
  const auto loop_thread = std::this_thread::get_id();
  std::atomic<bool> off_thread{false};
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        (*loop)->post([&, t, i] {
          if (std::this_thread::get_id() != loop_thread) off_thread = true;
          in_order &= last[static_cast<std::size_t>(t)] == i - 1;
          last[static_cast<std::size_t>(t)] = i;
          ++ran;
        });
      }
    });
  }
  // A deadline so that a lost wake-up fails the test instead of hanging it.
  (*loop)->schedule_after(20 * kNsPerSec,
                          [&] { (*loop)->fail(unavailable("posted functions never ran")); });
  Status s = (*loop)->run([&] { return ran == kThreads * kEach; });
  for (auto& p : posters) p.join();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(ran, kThreads * kEach);
  EXPECT_TRUE(in_order);
  EXPECT_FALSE(off_thread);
}

TEST(EventLoop, TimersAtEqualTimesFireInTheOrderScheduled) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.is_ok());
  std::vector<int> order;
  const TimeNs at = (*loop)->now() + kNsPerMs;
  for (int i = 0; i < 5; ++i) (*loop)->schedule_at(at, [&order, i] { order.push_back(i); });
  (*loop)->schedule_at(at - kNsPerUs, [&order] { order.push_back(-1); });
  ASSERT_TRUE((*loop)->run([&] { return order.size() == 6; }).is_ok());
  EXPECT_EQ(order, (std::vector<int>{-1, 0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace qs::transport
