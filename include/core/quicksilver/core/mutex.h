// A mutex and condition variable whose lock rules clang's thread-safety analysis checks
// (-Wthread-safety; as leveldb's port::Mutex and GUARDED_BY). State a mutex protects is
// declared QS_GUARDED_BY(mu_); a function that must be called with it held,
// QS_REQUIRES(mu_). scripts/style.sh compiles the annotated files with clang and the
// analysis on, so a read or write of guarded state without its lock is a build error
// there. Other compilers see plain std::mutex and std::condition_variable.
//
// Waits are written as loops (`while (!ready) cv.wait();`), not with predicate lambdas:
// the analysis cannot see that a lambda runs with the lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define QS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define QS_THREAD_ANNOTATION(x)
#endif

#define QS_CAPABILITY(x) QS_THREAD_ANNOTATION(capability(x))
#define QS_SCOPED_CAPABILITY QS_THREAD_ANNOTATION(scoped_lockable)
#define QS_GUARDED_BY(x) QS_THREAD_ANNOTATION(guarded_by(x))
#define QS_PT_GUARDED_BY(x) QS_THREAD_ANNOTATION(pt_guarded_by(x))
#define QS_REQUIRES(...) QS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define QS_EXCLUDES(...) QS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define QS_ACQUIRE(...) QS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define QS_RELEASE(...) QS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

namespace qs {

class QS_CAPABILITY("mutex") Mutex {
 public:
  void lock() QS_ACQUIRE() { mu_.lock(); }
  void unlock() QS_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class QS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) QS_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() QS_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable; every wait names the Mutex it is called with (held), so that the
// analysis checks it.
class CondVar {
 public:
  // Releases `mu` while it waits (spurious wake-ups happen: wait in a loop).
  void wait(Mutex& mu) QS_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As wait(), until `deadline` (std::chrono::steady_clock): false once it has passed.
  bool wait_until(Mutex& mu, std::chrono::steady_clock::time_point deadline) QS_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woke = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woke;
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace qs
