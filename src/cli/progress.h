// Progress lines for long commands on a terminal (issue 31, item 2): a command that is
// still working 1.5 s after it began prints what it is doing, then again when that changes
// (at most a line every 2 s) and at least every 10 s, each line with the time so far:
//
//   quicksilver run: mercury (policy 7 of 7), 24 s
//
// on stderr. Off a terminal (CI, a pipe) and with --json it prints nothing: the output is
// the table or the JSON alone. The CLI layer owns it: the libraries report what they are
// doing through a callback and never read a clock for it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace qs::cli {

class Progress {
 public:
  // `command`: the line's prefix ("quicksilver run"). Active when stderr is a terminal and
  // `quiet` is false, or when QS_PROGRESS=1 (tests).
  Progress(std::string command, bool quiet);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // What the command does now; printed at once if lines are being printed already and
  // the last one is 2 s old, else by the ticker.
  void set(const std::string& what);

 private:
  void ticker();
  void print_locked();

  std::string command_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string what_;
  bool done_ = false;
  bool printing_ = false;  // the first line was printed
  std::chrono::steady_clock::time_point last_;
  std::thread thread_;
};

}  // namespace qs::cli
