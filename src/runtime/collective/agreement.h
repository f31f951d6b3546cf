// The workers' agreement on which bucket each link runs next, over any engine
// (quicksilver/runtime/communicator.h; collective.h, "Agreement"): every worker reports
// each bucket it issued to worker 0 on the control channel; worker 0 runs, on each link,
// the earliest bucket every worker has issued, and tells the others which one before it
// starts it. Buckets are matched across workers by their content (bucket_key).
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
                  std::function<void(const Status&)> fail);
  ~BucketAgreement() { stop(); }
  // Its buffers and threads (the links' buffers too): before the first next().
  void start();
  // Loop thread: this worker's policy issued `b` (queued on b.link; reported to worker 0).
  void issued(const CollectiveBucket& b);
  // Link thread: the next bucket to run on `link`, as every worker runs it; nullopt once
  // stopping. Throws when a peer is lost or breaks the protocol.
  std::optional<CollectiveBucket> next(int link);
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

  Communicator& comm_;
  const bool checksums_;
  const TimeNs peer_timeout_;
  std::function<void(const Status&)> fail_;
  std::vector<Link> links_;
  Mutex mu_;
  CondVar cv_;
  std::atomic<bool> stopping_{false};  // set under mu_ (the waits read it there)
  std::vector<std::deque<Entry>> queues_ QS_GUARDED_BY(mu_);           // per link
  std::unordered_map<std::uint64_t, int> reports_ QS_GUARDED_BY(mu_);  // worker 0
  std::deque<ControlMessage> reports_out_ QS_GUARDED_BY(mu_);          // followers
  ControlMessage report_msg_{}, rx_msg_{};
  std::unique_ptr<ControlBuffer> report_buf_;
  std::thread report_thread_;
};

}  // namespace qs::runtime
