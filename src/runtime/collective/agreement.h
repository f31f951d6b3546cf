// The workers' agreement on which bucket each link runs next, over any engine
// (quicksilver/runtime/communicator.h; collective.h, "Agreement"): every worker reports
// each bucket it issued to worker 0 on the control channel; worker 0 runs, on each link,
// the earliest bucket every worker has issued, and tells the others which one before it
// starts it. Buckets are matched across workers by their content (bucket_key).
//
// In its own order (a policy whose buckets the job fixes, AllReducePolicy::fixed_order):
// every worker runs its own buckets on each link in the order it issued them, with no
// round trip through worker 0 before each (on 2 cores that round trip and the replica's
// stream cost as much CPU as the digits CNN's compute: docs/benchmarks.md, "Where a
// pass's CPU goes on gloo"). The reports still go to worker 0, which checks, as they come,
// that each worker's n-th bucket on a link is its own n-th: a difference fails the job.
// A follower starts a bucket only once worker 0 began its iteration (leader_started).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "quicksilver/core/mutex.h"
#include "quicksilver/core/status.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/runtime/communicator.h"

namespace qs::runtime {

// A bucket's identity across workers: its iterations and chunks. Not the policy's id
// (local), nor its link: DeFT assigns links from the links' backlog at the moment, which
// differs between workers by a little; worker 0's choice of link is the one that runs.
std::uint64_t bucket_key(const CollectiveBucket& b);

// The control message: a report (worker -> 0: "I issued KEY on LINK") or a decision
// (0 -> worker: "run KEY next on LINK"), with the CRC32C of its first 16 bytes when the
// job has checksums.
struct ControlMessage {
  std::uint64_t key = 0;
  std::int32_t link = 0;
  std::int32_t kind = 0;
  std::uint32_t crc = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(ControlMessage) == 24);

class BucketAgreement {
 public:
  // `fail`: a failure of the agreement's own threads (a lost or corrupting peer), called
  // on that thread; none once stop() began.
  BucketAgreement(Communicator& comm, bool checksums, TimeNs peer_timeout,
                  std::function<void(const Status&)> fail, bool own_order = false);
  ~BucketAgreement() { stop(); }
  // Its buffers and threads (the links' buffers too): before the first next().
  void start();
  // Loop thread: this worker's policy issued `b` (queued on b.link; reported to worker 0).
  void issued(const CollectiveBucket& b);
  // Link thread: the next bucket to run on `link`, as every worker runs it; nullopt once
  // stopping. Throws when a peer is lost or breaks the protocol.
  std::optional<CollectiveBucket> next(int link);
  // Own order, workers 1..N-1: worker 0 began iteration `it` (its stream, the loop
  // thread). A follower runs a bucket of an iteration only once worker 0 began it: a bucket
  // worker 0 never joins (its loop ended first) is never started, so the link thread waits
  // here, where stop() reaches it, and not in an all-reduce.
  void leader_started(std::int64_t it);
  // Makes every next() return nullopt (and keeps it so).
  void request_stop();
  // Ends a blocked wait of `link`'s thread (call until that thread has left).
  void interrupt(int link);
  // request_stop(), then ends the agreement's own threads.
  void stop();

 private:
  struct Entry {
    CollectiveBucket bucket;
    std::uint64_t key;
  };
  struct Link {
    ControlMessage decision{}, out{};
    std::unique_ptr<ControlBuffer> decision_rx;  // followers: worker 0's decisions
    std::unique_ptr<ControlBuffer> decision_tx;  // worker 0
  };
  std::optional<Entry> lead(int link) QS_EXCLUDES(mu_);
  std::optional<Entry> follow(int link) QS_EXCLUDES(mu_);
  // The queued entry of `key` (on any link), taken; nullopt if none.
  std::optional<Entry> take_locked(std::uint64_t key) QS_REQUIRES(mu_);
  // The first entry of `queue` every one of `n` workers has issued.
  std::deque<Entry>::iterator first_reported_locked(std::deque<Entry>& queue, int n)
      QS_REQUIRES(mu_);
  void report_loop();   // followers: reports_out_ to worker 0
  void collect_loop();  // worker 0: the others' reports
  void failed(const Status& s);
  // Own order, worker 0: one more bucket of `link`, its own (worker 0) or reported by
  // `from`, matched against the other side's; the error when they differ.
  Status match_locked(int link, int from, std::uint64_t key) QS_REQUIRES(mu_);

  // Own order, worker 0: per link and follower, the keys one side issued that the other
  // has not yet (the side ahead: ahead_is_leader), and how many were matched.
  struct Lag {
    std::deque<std::uint64_t> keys;
    bool ahead_is_leader = false;
    std::int64_t matched = 0;
  };

  Communicator& comm_;
  const bool checksums_;
  const TimeNs peer_timeout_;
  std::function<void(const Status&)> fail_;
  const bool own_order_;
  std::vector<Link> links_;
  Mutex mu_;
  CondVar cv_;
  std::atomic<bool> stopping_{false};  // set under mu_ (the waits read it there)
  std::vector<std::deque<Entry>> queues_ QS_GUARDED_BY(mu_);           // per link
  std::unordered_map<std::uint64_t, int> reports_ QS_GUARDED_BY(mu_);  // worker 0
  std::deque<ControlMessage> reports_out_ QS_GUARDED_BY(mu_);          // followers
  std::vector<std::vector<Lag>> lags_ QS_GUARDED_BY(mu_);  // own order, worker 0: [link][rank]
  bool mismatched_ QS_GUARDED_BY(mu_) = false;             // told once
  std::int64_t leader_started_ QS_GUARDED_BY(mu_) = -1;    // own order, followers
  ControlMessage report_msg_{}, rx_msg_{};
  std::unique_ptr<ControlBuffer> report_buf_;
  std::thread report_thread_;
};

}  // namespace qs::runtime
