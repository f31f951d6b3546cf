#include "agreement.h"

#include <algorithm>

#include "quicksilver/core/thread_name.h"
#include "quicksilver/transport/crc32c.h"

namespace qs::runtime {

namespace {

constexpr std::size_t kControlCovered = 16;
constexpr std::uint64_t kReportSlot = 1;
constexpr std::uint64_t kDecisionSlot = 16;  // + link
constexpr TimeNs kForever = 24 * 3600 * kNsPerSec;

ControlMessage sealed(ControlMessage m, bool checksums) {
  m.crc = checksums ? transport::crc32c(0, &m, kControlCovered) : 0;
  return m;
}

// Throws naming `from` when `m` fails its checksum.
void check_control(const ControlMessage& m, bool checksums, int from, const char* what) {
  if (checksums && transport::crc32c(0, &m, kControlCovered) != m.crc) {
    throw PeerError(from, "corrupted data from worker " + std::to_string(from) + ": " + what +
                              " failed its CRC32C check; not used");
  }
}

}  // namespace

std::uint64_t bucket_key(const CollectiveBucket& b) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<std::uint64_t>(b.first_iteration));
  mix(static_cast<std::uint64_t>(b.last_iteration));
  for (const Chunk& c : b.chunks) {
    mix(static_cast<std::uint64_t>(c.tensor));
    mix(static_cast<std::uint64_t>(c.offset));
    mix(static_cast<std::uint64_t>(c.length));
  }
  return h;
}

BucketAgreement::BucketAgreement(Communicator& comm, bool checksums, TimeNs peer_timeout,
                                 std::function<void(const Status&)> fail, bool own_order)
    : comm_(comm),
      checksums_(checksums),
      peer_timeout_(peer_timeout),
      fail_(std::move(fail)),
      own_order_(own_order),
      links_(static_cast<std::size_t>(comm.links())),
      queues_(links_.size()),
      lags_(links_.size(), std::vector<Lag>(static_cast<std::size_t>(comm.size()))) {}

void BucketAgreement::start() {
  // The receive buffers exist before their threads start, so that stop can abort them.
  const bool leader = comm_.rank() == 0;
  for (Link& l : links_) {
    if (own_order_) break;  // no decisions
    if (!leader) l.decision_rx = comm_.control_buffer(&l.decision, sizeof l.decision);
    if (leader && comm_.size() > 1) l.decision_tx = comm_.control_buffer(&l.out, sizeof l.out);
  }
  if (!leader) {
    report_buf_ = comm_.control_buffer(&report_msg_, sizeof report_msg_);
    report_thread_ = std::thread([this] {
      name_this_thread("qs-agreement");
      report_loop();
    });
  } else if (comm_.size() > 1) {
    report_buf_ = comm_.control_buffer(&rx_msg_, sizeof rx_msg_);
    report_thread_ = std::thread([this] {
      name_this_thread("qs-agreement");
      collect_loop();
    });
  }
}

void BucketAgreement::issued(const CollectiveBucket& b) {
  const std::uint64_t key = bucket_key(b);
  Status mismatch;
  {
    MutexLock lock(mu_);
    queues_[static_cast<std::size_t>(b.link)].push_back(Entry{b, key});
    if (own_order_ && comm_.rank() == 0) mismatch = match_locked(b.link, 0, key);
    // Queued for the report thread: a send completes only once worker 0 posted its
    // receive, a round trip the loop (and the emulated GPU's timers) should not wait for.
    if (comm_.rank() != 0) reports_out_.push_back(ControlMessage{key, b.link, 1});
  }
  cv_.notify_all();
  if (!mismatch.is_ok()) failed(mismatch);
}

Status BucketAgreement::match_locked(int link, int from, std::uint64_t key) {
  // Worker 0's own bucket is matched against every follower's; a report against worker 0's.
  const bool leader_side = from == 0;
  const int first = leader_side ? 1 : from, last = leader_side ? comm_.size() - 1 : from;
  for (int r = first; r <= last; ++r) {
    Lag& lag = lags_[static_cast<std::size_t>(link)][static_cast<std::size_t>(r)];
    if (lag.keys.empty() || lag.ahead_is_leader == leader_side) {
      lag.keys.push_back(key);
      lag.ahead_is_leader = leader_side;
      continue;
    }
    const bool same = lag.keys.front() == key;
    lag.keys.pop_front();
    ++lag.matched;
    if (!same && !mismatched_) {
      mismatched_ = true;
      return internal_error(
          "worker " + std::to_string(r) + "'s bucket " + std::to_string(lag.matched) + " on link " +
          std::to_string(link) +
          " is not worker 0's: the workers' policies cut different buckets or issued them in "
          "another order, so those all-reduces summed different gradients; the job stops");
    }
  }
  return Status::ok();
}

std::optional<CollectiveBucket> BucketAgreement::next(int link) {
  if (own_order_) {
    MutexLock lock(mu_);
    std::deque<Entry>& queue = queues_[static_cast<std::size_t>(link)];
    const bool leader = comm_.rank() == 0;
    while (!stopping_ &&
           (queue.empty() || (!leader && queue.front().bucket.first_iteration > leader_started_)))
      cv_.wait(mu_);
    if (stopping_) return std::nullopt;
    Entry e = std::move(queue.front());
    queue.pop_front();
    return std::move(e.bucket);
  }
  std::optional<Entry> e = comm_.rank() == 0 ? lead(link) : follow(link);
  if (!e) return std::nullopt;
  return std::move(e->bucket);
}

// Worker 0: the earliest bucket of this link every worker has issued, announced.
std::optional<BucketAgreement::Entry> BucketAgreement::lead(int li) {
  Link& link = links_[static_cast<std::size_t>(li)];
  const int n = comm_.size();
  Entry e;
  {
    MutexLock lock(mu_);
    std::deque<Entry>& queue = queues_[static_cast<std::size_t>(li)];
    std::deque<Entry>::iterator pick;
    while (!stopping_ && (pick = first_reported_locked(queue, n)) == queue.end()) cv_.wait(mu_);
    if (stopping_) return std::nullopt;
    e = std::move(*pick);
    queue.erase(pick);
    reports_.erase(e.key);
  }
  link.out = sealed(ControlMessage{e.key, li, 2}, checksums_);
  for (int r = 1; r < n; ++r) {
    try {
      link.decision_tx->send(r, kDecisionSlot + static_cast<std::uint64_t>(li),
                             sizeof(ControlMessage));
      if (!link.decision_tx->wait_send(peer_timeout_)) return std::nullopt;  // aborted
    } catch (const std::exception& ex) {
      throw std::runtime_error("lost worker " + std::to_string(r) + ": " + ex.what());
    }
  }
  return e;
}

std::deque<BucketAgreement::Entry>::iterator BucketAgreement::first_reported_locked(
    std::deque<Entry>& queue, int n) {
  for (auto q = queue.begin(); q != queue.end(); ++q) {
    if (n == 1) return q;
    auto r = reports_.find(q->key);
    if (r != reports_.end() && r->second >= n - 1) return q;
  }
  return queue.end();
}

std::optional<BucketAgreement::Entry> BucketAgreement::take_locked(std::uint64_t key) {
  for (std::deque<Entry>& queue : queues_) {
    auto pick =
        std::find_if(queue.begin(), queue.end(), [&](const Entry& q) { return q.key == key; });
    if (pick != queue.end()) {
      Entry e = std::move(*pick);
      queue.erase(pick);
      return e;
    }
  }
  return std::nullopt;
}

// Workers 1..N-1: worker 0's next bucket of this link, found among this worker's own
// (on any link: DeFT's choice of link may differ).
std::optional<BucketAgreement::Entry> BucketAgreement::follow(int li) {
  Link& link = links_[static_cast<std::size_t>(li)];
  // No deadline here: a link may idle for a long compute phase; the worker's watchdog
  // detects a stall, and a dead worker 0 closes the pair at once. The engine's error may
  // name no peer (gloo: "Application timeout caused pair closure"): this one is worker 0's.
  try {
    link.decision_rx->recv({0}, kDecisionSlot + static_cast<std::uint64_t>(li));
    if (!link.decision_rx->wait_recv(nullptr, kForever)) return std::nullopt;  // aborted
  } catch (const std::exception& e) {
    throw std::runtime_error(
        std::string("lost worker 0 (its decisions of which bucket runs next): ") + e.what());
  }
  check_control(link.decision, checksums_, 0, "a decision of which bucket runs next");
  const std::uint64_t key = link.decision.key;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(peer_timeout_);
  MutexLock lock(mu_);
  while (true) {
    if (stopping_) return std::nullopt;
    if (std::optional<Entry> e = take_locked(key)) return e;
    if (!cv_.wait_until(mu_, deadline) && !stopping_) {
      if (std::optional<Entry> e = take_locked(key)) return e;
      throw std::runtime_error(
          "worker 0 runs a bucket this worker never issued within the peer timeout (the "
          "policy cut different buckets on different workers)");
    }
  }
}

void BucketAgreement::report_loop() {
  try {
    while (true) {
      {
        MutexLock lock(mu_);
        while (!stopping_ && reports_out_.empty()) cv_.wait(mu_);
        if (stopping_) return;
        report_msg_ = sealed(reports_out_.front(), checksums_);
        reports_out_.pop_front();
      }
      report_buf_->send(0, kReportSlot, sizeof(ControlMessage));
      if (!report_buf_->wait_send(peer_timeout_)) return;  // aborted: stopping
    }
  } catch (const std::exception& ex) {
    failed(unavailable(std::string("lost worker 0 (reporting a bucket): ") + ex.what()));
  }
}

void BucketAgreement::collect_loop() {
  std::vector<int> others;
  for (int r = 1; r < comm_.size(); ++r) others.push_back(r);
  try {
    while (true) {
      report_buf_->recv(others, kReportSlot);
      int from = -1;
      if (!report_buf_->wait_recv(&from, kForever)) return;  // aborted: stopping
      check_control(rx_msg_, checksums_, from, "a report of an issued bucket");
      if (own_order_) {
        if (rx_msg_.link < 0 || rx_msg_.link >= static_cast<std::int32_t>(links_.size())) {
          throw PeerError(from, "malformed data from worker " + std::to_string(from) +
                                    ": a report of a bucket on link " +
                                    std::to_string(rx_msg_.link) + " of " +
                                    std::to_string(links_.size()));
        }
        Status mismatch;
        {
          MutexLock lock(mu_);
          mismatch = match_locked(rx_msg_.link, from, rx_msg_.key);
        }
        if (!mismatch.is_ok()) failed(mismatch);
        continue;
      }
      {
        MutexLock lock(mu_);
        ++reports_[rx_msg_.key];
      }
      cv_.notify_all();
    }
  } catch (const PeerError& ex) {
    failed(unavailable(ex.what()));
  } catch (const std::exception& ex) {
    // The engine's error may name no peer: the ones this thread hears from are the
    // candidates.
    std::string who;
    for (int r : others) who += (who.empty() ? "" : ", ") + std::to_string(r);
    failed(unavailable(
        (others.size() == 1 ? "lost worker " + who : "lost one of workers {" + who + "}") +
        " (its reports of issued buckets): " + ex.what()));
  }
}

void BucketAgreement::failed(const Status& s) {
  if (!stopping_) fail_(s);
}

void BucketAgreement::leader_started(std::int64_t it) {
  {
    MutexLock lock(mu_);
    leader_started_ = std::max(leader_started_, it);
  }
  cv_.notify_all();
}

void BucketAgreement::request_stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

void BucketAgreement::interrupt(int li) {
  Link& l = links_[static_cast<std::size_t>(li)];
  if (l.decision_rx) l.decision_rx->abort_recv();
  if (l.decision_tx) l.decision_tx->abort_send();
}

void BucketAgreement::stop() {
  request_stop();
  while (report_thread_.joinable()) {
    if (comm_.rank() == 0) {
      report_buf_->abort_recv();
    } else {
      report_buf_->abort_send();
    }
    report_thread_.join();
  }
}

}  // namespace qs::runtime
