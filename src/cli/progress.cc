#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace qs::cli {

namespace {
constexpr auto kFirst = std::chrono::milliseconds(1500);
constexpr auto kEvery = std::chrono::seconds(10);
}  // namespace

Progress::Progress(std::string command, bool quiet)
    : command_(std::move(command)), start_(std::chrono::steady_clock::now()), last_(start_) {
  const char* forced = std::getenv("QS_PROGRESS");
  const bool on =
      forced != nullptr ? std::string(forced) == "1" : (!quiet && isatty(STDERR_FILENO) == 1);
  if (on) thread_ = std::thread([this] { ticker(); });
}

Progress::~Progress() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Progress::set(const std::string& what) {
  std::lock_guard lock(mu_);
  if (what == what_) return;
  what_ = what;
  // A change is shown at once, but no more than one line every 2 s (a counter changes
  // faster); the ticker shows the latest within 10 s anyway.
  if (printing_ && std::chrono::steady_clock::now() >= last_ + std::chrono::seconds(2))
    print_locked();
}

void Progress::print_locked() {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "%s: %s, %.0f s\n", command_.c_str(),
               what_.empty() ? "working" : what_.c_str(), s);
  std::fflush(stderr);
  last_ = now;
  printing_ = true;
}

void Progress::ticker() {
  std::unique_lock lock(mu_);
  if (cv_.wait_until(lock, start_ + kFirst, [this] { return done_; })) return;
  print_locked();
  while (!cv_.wait_until(lock, last_ + kEvery, [this] { return done_; })) {
    if (std::chrono::steady_clock::now() >= last_ + kEvery) print_locked();
  }
}

}  // namespace qs::cli
