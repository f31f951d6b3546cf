// The all-reduce worker (quicksilver/runtime/collective.h): the one training loop over the
// node's event loop (Timer), the emulated GPU (Compute) and gloo (Exchange).
//
// Threads: the loop thread runs the training loop, the policy and every listener call;
// one thread per link runs that link's collectives, one at a time; on worker 0 a control
// thread collects the other workers' "issued" reports. The link threads touch the tensor
// buffers only for the chunks of the bucket they run, which the loop does not write
// meanwhile (see Staging).
#include <arpa/inet.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "checked_allreduce.h"
#include "quicksilver/core/check.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/runtime/store.h"
#include "quicksilver/transport/clock.h"
#include "quicksilver/transport/crc32c.h"
#include "../runtime_internal.h"

namespace qs::runtime {

namespace {

using Clock = std::chrono::steady_clock;
TimeNs mono_now() { return transport::SteadyClock::instance().now(); }
std::chrono::milliseconds to_ms_duration(TimeNs t) {
  return std::chrono::milliseconds(std::max<TimeNs>(1, t / kNsPerMs));
}

// gloo's rendezvous store over the coordinator's (store.h). gloo reports a store failure
// by exception; ours carry the coordinator's message. `rewrite`: applied to every value
// read (CollectiveOptions::via_rank).
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(StoreClient& client, TimeNs timeout,
                   std::function<void(const std::string&, std::vector<char>&)> rewrite = {},
                   std::function<void(const std::string&, const std::vector<char>&)> on_set = {})
      : client_(client),
        timeout_(timeout),
        rewrite_(std::move(rewrite)),
        on_set_(std::move(on_set)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (on_set_) on_set_(key, data);
    Status s = client_.set(key, std::string_view(data.data(), data.size()));
    if (!s.is_ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_.get(key, timeout_);
    if (!v) throw std::runtime_error(v.status().message());
    std::vector<char> out(v->begin(), v->end());
    if (rewrite_) rewrite_(key, out);
    return out;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, to_ms_duration(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      auto v = client_.get(k, static_cast<TimeNs>(timeout.count()) * kNsPerMs);
      if (!v) throw std::runtime_error(v.status().message());
    }
  }

 private:
  StoreClient& client_;
  TimeNs timeout_;
  std::function<void(const std::string&, std::vector<char>&)> rewrite_;
  std::function<void(const std::string&, const std::vector<char>&)> on_set_;
};

// The addresses a rank published for its pairs (gloo/rendezvous/context.cc: one
// gloo::transport::tcp::Address per peer, back to back) with `to`'s IPv4 address and port
// in place of each one's, their sequence numbers kept (they name the pair at the device).
// The addresses of such a value, in order ("[127.0.0.1]:41234").
std::vector<std::string> addresses(const std::vector<char>& value) {
  std::vector<std::string> out;
  const std::size_t one = gloo::transport::tcp::Address().bytes().size();
  for (std::size_t at = 0; one > 0 && at + one <= value.size(); at += one) {
    const gloo::transport::tcp::Address a(
        std::vector<char>(value.begin() + static_cast<std::ptrdiff_t>(at),
                          value.begin() + static_cast<std::ptrdiff_t>(at + one)));
    // Not a.str(): this gloo prints the port in network byte order.
    const sockaddr_storage& ss = a.getSockaddr();
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      port = ntohs(in6->sin6_port);
    }
    out.push_back("[" + std::string(host) + "]:" + std::to_string(port));
  }
  return out;
}

void redirect_addresses(std::vector<char>& value, const Endpoint& to) {
  const std::size_t one = gloo::transport::tcp::Address().bytes().size();
  for (std::size_t at = 0; one > 0 && at + one <= value.size(); at += one) {
    const gloo::transport::tcp::Address a(
        std::vector<char>(value.begin() + static_cast<std::ptrdiff_t>(at),
                          value.begin() + static_cast<std::ptrdiff_t>(at + one)));
    sockaddr_storage ss = a.getSockaddr();
    if (ss.ss_family != AF_INET) throw std::runtime_error("via: the peer's address is not IPv4");
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    if (inet_pton(AF_INET, to.host.c_str(), &in->sin_addr) != 1)
      throw std::runtime_error("via: bad host " + to.host);
    in->sin_port = htons(static_cast<std::uint16_t>(to.port));
    const std::vector<char> b = gloo::transport::tcp::Address(ss, a.getSeq()).bytes();
    std::copy(b.begin(), b.end(), value.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

// A bucket's identity across workers: its iterations and chunks. Not the policy's id
// (local), nor its link: DeFT assigns links from the links' backlog at the moment, which
// differs between workers by a little; worker 0's choice of link is the one that runs.
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

std::string describe(const CollectiveBucket& b) {
  return "bucket #" + std::to_string(b.id) + " (iteration " + std::to_string(b.first_iteration) +
         (b.last_iteration != b.first_iteration ? ".." + std::to_string(b.last_iteration) : "") +
         ", " + std::to_string(b.chunks.size()) + " chunks, " + format_size(b.bytes()) + ", link " +
         std::to_string(b.link) + ")";
}

// The control message: a report (worker -> 0: "I issued KEY on LINK") or a decision
// (0 -> worker: "run KEY next on LINK"), with the CRC32C of its first 16 bytes when the
// job has checksums (JobOptions::payload_checksums).
struct ControlMessage {
  std::uint64_t key = 0;
  std::int32_t link = 0;
  std::int32_t kind = 0;
  std::uint32_t crc = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(ControlMessage) == 24);
constexpr std::size_t kControlCovered = 16;

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
constexpr std::uint64_t kReportSlot = 1;
constexpr std::uint64_t kDecisionSlot = 16;  // + link

}  // namespace

namespace {

// Least squares of time (ns) on size (bytes): T = a + b*M (MG-WFBP II-D).
AllReduceCost fit_line(const std::vector<double>& sizes, const std::vector<double>& times) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sx += sizes[i], sy += times[i], sxx += sizes[i] * sizes[i], sxy += sizes[i] * times[i];
  }
  const double den = n * sxx - sx * sx;
  double b = den > 0 ? (n * sxy - sx * sy) / den : 0.0;
  b = std::max(b, 1e-6);
  const double a = std::max(0.0, (sy - b * sx) / n);
  return AllReduceCost{static_cast<TimeNs>(a + 0.5), b};
}

}  // namespace

// ---- replicating a policy whose decisions depend on timing ----
//
// DeFT decides its knapsacks from the links' backlog at the moment, so two workers may
// cut different buckets (one merges iteration i into i+1, the other does not), and
// ByteScheduler fuses whatever was handed over since its last cycle; no agreement on
// order can reconcile different buckets. Worker 0's policy therefore decides for all:
// it records every input it receives (the callback, its arguments and worker 0's time),
// and every other worker feeds the same inputs, in the same order and with the same
// times, to a replica of the policy, each input once the worker has reached the same
// point itself (its own backward of that layer, its own completion of that bucket). The
// replicas make exactly worker 0's decisions (the policies are deterministic state
// machines), and each worker's gates follow worker 0's schedule.

enum RecordKind : std::int32_t {
  kIterationStart = 1,
  kGradientReady,
  kForwardStart,
  kCollectiveDone,
  kTrainingEnd,
  kEndOfStream,
  kFeedback
};
struct PolicyRecord {
  std::int32_t kind = 0;
  std::int32_t layer = 0;
  std::int64_t iteration = 0;
  std::int64_t now = 0;
  std::uint64_t id = 0;  // kCollectiveDone: the bucket's id (the same on every replica)
  // kFeedback: TrainingFeedback's loss, grad_sq, noise, lr, batch (iteration above).
  double values[5] = {0, 0, 0, 0, 0};
};

PolicyRecord feedback_record(const TrainingFeedback& f, TimeNs now) {
  PolicyRecord r{kFeedback, 0, f.iteration, now, 0};
  r.values[0] = f.loss, r.values[1] = f.grad_sq, r.values[2] = f.noise, r.values[3] = f.lr,
  r.values[4] = f.batch;
  return r;
}

TrainingFeedback feedback_of(const PolicyRecord& r) {
  TrainingFeedback f;
  f.iteration = r.iteration;
  f.loss = r.values[0], f.grad_sq = r.values[1], f.noise = r.values[2], f.lr = r.values[3],
  f.batch = r.values[4];
  return f;
}
// A batch of worker 0's inputs; `crc`: the CRC32C of `count` and the records it counts,
// when the job has checksums.
struct RecordBatch {
  std::uint32_t crc = 0;
  std::uint32_t reserved = 0;
  std::int64_t count = 0;
  PolicyRecord records[64];
};
static_assert(sizeof(PolicyRecord) == 72, "a record has no padding (its bytes are checksummed)");
std::uint32_t batch_crc(const RecordBatch& b) {
  const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(b.count, 0, 64));
  return transport::crc32c(transport::crc32c(0, &b.count, sizeof b.count), b.records,
                           n * sizeof(PolicyRecord));
}
constexpr std::uint64_t kReplicaSlot = 8;

// Worker 0: its policy, every input recorded.
class RecordingPolicy final : public AllReducePolicy {
 public:
  RecordingPolicy(std::unique_ptr<AllReducePolicy> real,
                  std::function<void(const PolicyRecord&)> emit)
      : real_(std::move(real)), emit_(std::move(emit)) {}
  std::string_view name() const override { return real_->name(); }
  bool communicates() const override { return real_->communicates(); }
  ForwardGate forward_gate() const override { return real_->forward_gate(); }
  LinkDiscipline discipline() const override { return real_->discipline(); }
  void on_iteration_start(std::int64_t it, TimeNs now, CollectiveSink& out) override {
    iteration_ = it;
    emit_({kIterationStart, 0, it, now, 0});
    real_->on_iteration_start(it, now, out);
  }
  void on_gradient_ready(int layer, TimeNs now, CollectiveSink& out) override {
    emit_({kGradientReady, layer, iteration_, now, 0});
    real_->on_gradient_ready(layer, now, out);
  }
  void on_forward_start(int layer, TimeNs now, CollectiveSink& out) override {
    emit_({kForwardStart, layer, iteration_, now, 0});
    real_->on_forward_start(layer, now, out);
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs now, CollectiveSink& out) override {
    emit_({kCollectiveDone, 0, 0, now, b.id});
    real_->on_collective_done(b, now, out);
  }
  void on_feedback(const TrainingFeedback& f, TimeNs now, CollectiveSink& out) override {
    emit_(feedback_record(f, now));
    real_->on_feedback(f, now, out);
  }
  bool forward_ready(int layer) const override { return real_->forward_ready(layer); }
  bool backward_ready() const override { return real_->backward_ready(); }
  std::int64_t merged_from(std::int64_t iteration) const override {
    return real_->merged_from(iteration);
  }
  void on_training_end(TimeNs now, CollectiveSink& out) override {
    emit_({kTrainingEnd, 0, -1, now, 0});
    real_->on_training_end(now, out);
  }
  std::vector<std::string> report() const override { return real_->report(); }

 private:
  std::unique_ptr<AllReducePolicy> real_;
  std::function<void(const PolicyRecord&)> emit_;
  std::int64_t iteration_ = 0;
};

// Workers 1..N-1: a replica fed worker 0's inputs. `observe` sees each input as it is
// applied (in worker 0's order, as worker 0's RecordingPolicy emitted it).
class ReplicaPolicy final : public AllReducePolicy, CollectiveSink {
 public:
  ReplicaPolicy(std::unique_ptr<AllReducePolicy> real, std::function<void()> changed,
                std::function<void(const PolicyRecord&)> observe)
      : real_(std::move(real)), changed_(std::move(changed)), observe_(std::move(observe)) {}
  std::string_view name() const override { return real_->name(); }
  bool communicates() const override { return real_->communicates(); }
  ForwardGate forward_gate() const override { return real_->forward_gate(); }
  LinkDiscipline discipline() const override { return real_->discipline(); }
  // This worker's own inputs only say how far it has come.
  void on_iteration_start(std::int64_t it, TimeNs, CollectiveSink& out) override {
    sink_ = &out;
    iteration_ = it;
    started_ = true;
    reached({kIterationStart, 0, it, 0, 0});
  }
  void on_gradient_ready(int layer, TimeNs, CollectiveSink&) override {
    reached({kGradientReady, layer, iteration_, 0, 0});
  }
  void on_forward_start(int layer, TimeNs, CollectiveSink&) override {
    reached({kForwardStart, layer, iteration_, 0, 0});
  }
  void on_collective_done(const CollectiveBucket& b, TimeNs, CollectiveSink&) override {
    reached({kCollectiveDone, 0, 0, 0, b.id});
  }
  void on_training_end(TimeNs, CollectiveSink&) override { reached({kTrainingEnd, 0, -1, 0, 0}); }
  bool forward_ready(int layer) const override { return real_->forward_ready(layer); }
  // The range of an iteration whose start (worker 0's) was applied; -1 before. Asked in
  // increasing order of iterations (the staging's), so an answer forgets older ones.
  std::int64_t merged_from(std::int64_t iteration) const override {
    auto r = ranges_.find(iteration);
    if (r == ranges_.end()) return -1;
    const std::int64_t first = r->second;
    ranges_.erase(ranges_.begin(), r);
    return first;
  }
  // The replica's state is worker 0's at the last input both have reached. When this
  // worker is ahead of worker 0, that state is behind this worker's own, and its gate let
  // this worker start backward pass after backward pass, each staging a copy of its
  // gradients, with nothing to stop it (the soak grew a replica to 421 MB so:
  // docs/reliability.md). So this worker starts an iteration only once worker 0 has
  // started it (or ended its stream), and then asks the gate worker 0 asked; inputs the
  // two saw in another order (a completion before or after an iteration start) wait for
  // each other as before. deliver() reports a new iteration start of worker 0's.
  bool backward_ready() const override {
    const std::int64_t next = started_ ? iteration_ + 1 : 0;
    return (ended_ || worker0_started_ >= next) && real_->backward_ready();
  }
  std::vector<std::string> report() const override { return real_->report(); }

  // Worker 0's inputs, in its order (loop thread).
  void deliver(const PolicyRecord& r) {
    pending_.push_back(r);
    const bool news =
        (r.kind == kIterationStart && r.iteration > worker0_started_) || r.kind == kEndOfStream;
    if (r.kind == kIterationStart) worker0_started_ = std::max(worker0_started_, r.iteration);
    if (!drain() && news) changed_();  // a held backward pass may go now
  }
  // Worker 0 ended its stream and every input of it was applied.
  bool complete() const { return ended_ && pending_.empty(); }

 private:
  using Key = std::tuple<std::int32_t, std::int32_t, std::int64_t, std::uint64_t>;
  static Key key(const PolicyRecord& r) { return {r.kind, r.layer, r.iteration, r.id}; }

  // The replica's decisions go to the loop, remembered by id for their completion.
  void all_reduce(const CollectiveBucket& b, TimeNs delay) override {
    issued_[b.id] = b;
    sink_->all_reduce(b, delay);
  }

  void reached(const PolicyRecord& r) {
    reached_.insert(key(r));
    if (r.kind == kTrainingEnd) ended_locally_ = true;
    drain();
  }

  // Applies what it can; true when it applied something (and told the loop).
  bool drain() {
    bool applied = false;
    while (!pending_.empty()) {
      const PolicyRecord r = pending_.front();
      if (r.kind == kEndOfStream) {
        ended_ = true;
        pending_.pop_front();
        continue;
      }
      if (r.kind == kFeedback) {  // worker 0's measurements: no point of this worker's to wait for
        pending_.pop_front();
        apply(r);
        applied = true;
        continue;
      }
      auto at = reached_.find(key(r));
      // A run ended early (PyTorch: the user's loop decides) may have let worker 0 begin an
      // iteration this worker never will: once this worker's training ended, worker 0's
      // compute-chain inputs are applied as they come (the replica's state stays worker
      // 0's); completions still wait for this worker's own.
      const bool moot = ended_locally_ && r.kind != kCollectiveDone && r.kind != kTrainingEnd;
      if (at == reached_.end() && !moot) break;  // this worker is not there yet
      if (at != reached_.end()) reached_.erase(at);
      pending_.pop_front();
      apply(r);
      applied = true;
    }
    if (applied) changed_();
    return applied;
  }

  void apply(const PolicyRecord& r) {
    // Seen before it is applied, as worker 0's RecordingPolicy emits before its policy
    // acts: a bucket the input makes the policy issue comes after the input in both.
    if (observe_) observe_(r);
    switch (r.kind) {
      case kIterationStart:
        real_->on_iteration_start(r.iteration, r.now, *this);
        ranges_[r.iteration] = real_->merged_from(r.iteration);
        break;
      case kGradientReady:
        real_->on_gradient_ready(r.layer, r.now, *this);
        break;
      case kForwardStart:
        real_->on_forward_start(r.layer, r.now, *this);
        break;
      case kCollectiveDone: {
        auto b = issued_.find(r.id);
        QS_CHECK(b != issued_.end());  // this worker completed it, so its replica issued it
        real_->on_collective_done(b->second, r.now, *this);
        issued_.erase(b);
        break;
      }
      case kTrainingEnd:
        real_->on_training_end(r.now, *this);
        break;
      case kFeedback:
        real_->on_feedback(feedback_of(r), r.now, *this);
        break;
      default:
        break;
    }
  }

  std::unique_ptr<AllReducePolicy> real_;
  std::function<void()> changed_;
  std::function<void(const PolicyRecord&)> observe_;
  CollectiveSink* sink_ = nullptr;  // the loop's (set by the first iteration start)
  std::int64_t iteration_ = 0;
  bool started_ = false;               // this worker began its first iteration
  std::int64_t worker0_started_ = -1;  // the latest iteration worker 0 began (its stream)
  std::deque<PolicyRecord> pending_;
  std::multiset<Key> reached_;
  std::unordered_map<std::uint64_t, CollectiveBucket> issued_;
  // merged_from of the iterations started since the staging last asked (a few).
  mutable std::map<std::int64_t, std::int64_t> ranges_;
  bool ended_ = false;          // worker 0's stream ended
  bool ended_locally_ = false;  // this worker's training ended
};

// ---- the worker ----

struct CollectiveWorker::Impl final : Exchange {
  using StagingBuffer = std::unique_ptr<float[]>;  // the model's gradients' size (staging)
  explicit Impl(CollectiveOptions o) : opts(std::move(o)), layout(opts.job.profile) {}
  ~Impl() override { stop_threads(); }

  // ---- set-up ----
  Status init() {
    const JobOptions& job = opts.job;
    QS_RETURN_IF_ERROR(check_job_size(job.workers, 1));
    if (opts.rank < 0 || opts.rank >= job.workers) {
      return invalid_argument("worker id " + std::to_string(opts.rank) + " not in [0, " +
                              std::to_string(job.workers) + ")");
    }
    if (opts.links.empty() || opts.links.size() > 2)
      return invalid_argument("an all-reduce worker has one or two links");
    if (!(opts.compute_factor >= 0)) return invalid_argument("compute factor must be >= 0");
    if (opts.calibration_repeats < 1) return invalid_argument("calibration repeats must be >= 1");
    QS_ASSIGN_OR_RETURN(loop, transport::EventLoop::create());
    timer = std::make_unique<LoopTimer>(*loop);
    source = opts.tensors;
    if (source == nullptr) {
      // Its per-layer check is the PS loop's; buckets are checked here, per chunk.
      known = std::make_unique<KnownContent>(job.profile, opts.rank, job.workers, opts.verify);
      source = known.get();
    }
    buffers = source->tensors();
    QS_RETURN_IF_ERROR(check_registry(buffers, layout));
    return Status::ok();
  }

  std::string name() const { return "worker " + std::to_string(opts.rank); }

  // Every context of this worker: the control context and one per link, through the
  // coordinator's store. gloo throws on failure.
  Status connect() {
    const JobOptions& job = opts.job;
    QS_ASSIGN_OR_RETURN(store_client,
                        StoreClient::connect(opts.store, job.connect_timeout, opts.secret.get()));
    std::function<void(const std::string&, std::vector<char>&)> rewrite;
    if (opts.via_rank >= 0) {
      rewrite = [this](const std::string& key, std::vector<char>& value) {
        if (key == "link0/" + std::to_string(opts.via_rank)) redirect_addresses(value, opts.via);
      };
    }
    // The addresses this worker's pairs listen at, as it publishes them ("link0/1": link
    // 0's context, rank 1; one address per peer, in rank order).
    std::function<void(const std::string&, const std::vector<char>&)> on_set;
    if (opts.log) {
      on_set = [this](const std::string& key, const std::vector<char>& value) {
        const auto slash = key.find('/');
        if (slash == std::string::npos || key.substr(slash + 1) != std::to_string(opts.rank))
          return;
        std::string line;
        int peer = 0;
        for (const std::string& a : addresses(value)) {
          if (peer == opts.rank) ++peer;
          line += (line.empty() ? "" : ", ") + a + " (worker " + std::to_string(peer++) + ")";
        }
        opts.log(name() + ": " + key.substr(0, slash) + " pairs listen at " + line);
      };
    }
    CoordinatorStore store(*store_client, job.connect_timeout, std::move(rewrite),
                           std::move(on_set));
    ignore_sigpipe();
    auto make = [&](const std::string& prefix, const std::string& host) {
      gloo::transport::tcp::attr attr;
      attr.hostname = host;
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(opts.rank, job.workers);
      ctx->setTimeout(to_ms_duration(job.peer_timeout));
      gloo::rendezvous::PrefixStore ps(prefix, store);
      ctx->connectFullMesh(ps, dev);
      return std::pair{ctx, dev};
    };
    try {
      auto [c, d] = make("control", opts.links[0]);
      control = c;
      devices.push_back(d);
      for (std::size_t l = 0; l < opts.links.size(); ++l) {
        auto [lc, ld] = make("link" + std::to_string(l), opts.links[l]);
        links.emplace_back(std::make_unique<Link>());
        links.back()->ctx = lc;
        devices.push_back(ld);
      }
    } catch (const std::exception& e) {
      return unavailable(name() + ": gloo rendezvous failed: " + e.what());
    }
    return store_client->done(opts.rank).with_context(name());
  }

  // Every collective of this worker, on `ctx`: checked_allreduce (checked_allreduce.h),
  // with checksums as the job says unless `checksums` is false. `tamper`: the test's hook
  // on received messages (the gradients' collectives only). Throws PeerError naming the
  // worker at fault, or gloo's exceptions.
  void allreduce_on(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t elements,
                    std::size_t element_size, ReduceFn fn, bool checksums = true,
                    std::function<void(int, std::byte*, std::size_t)> tamper = {}) const {
    CheckedAllreduceOptions o;
    o.context = ctx;
    o.algorithm = opts.algorithm;
    o.checksums = checksums && opts.job.payload_checksums;
    o.timeout = to_ms_duration(opts.job.peer_timeout);
    o.rank_name = [](int r) { return "worker " + std::to_string(r); };
    o.tamper = std::move(tamper);
    // The root cause first: this worker's other threads (decisions, reports) would
    // otherwise report the closed connections of peers failing in turn.
    o.on_corrupted = [this](int, const std::string& what) {
      loop->post([this, s = unavailable(what)] { loop->fail(s.with_context(name())); });
    };
    checked_allreduce(o, data, elements, element_size, fn);
  }
  static ReduceFn sum_floats() { return static_cast<ReduceFn>(&gloo::sum<float>); }

  // Times this link's all-reduce over a size sweep (as the job's buckets will run: the
  // same compression); every worker returns the same fit.
  Result<AllReduceCost> calibrate(int li) {
    Link& link = *links[static_cast<std::size_t>(li)];
    const Bytes total = layout.total_bytes();
    // From 4 KiB up to the model (at most 8 MiB and ~50 ms at the nominal rate): the
    // sizes the policies' buckets take.
    const double rate = opts.job.bandwidth.bytes_per_second();
    Bytes top = std::min<Bytes>(8 * kMiB, std::max<Bytes>(64 * kKiB, total));
    if (rate > 0)
      top = std::min<Bytes>(top, std::max<Bytes>(64 * kKiB, static_cast<Bytes>(rate * 0.05)));
    std::vector<double> sizes;
    for (Bytes s = 4 * kKiB; s < top; s *= 4) sizes.push_back(static_cast<double>(s));
    sizes.push_back(static_cast<double>(top));
    std::vector<float> data(static_cast<std::size_t>(top / 4), 1.0f);
    std::vector<double> medians;
    try {
      reduce_floats(link, data.data(), 1024);  // warm-up: connections, buffers
      for (double s : sizes) {
        std::vector<TimeNs> t;
        for (int r = 0; r < opts.calibration_repeats; ++r) {
          const TimeNs t0 = mono_now();
          reduce_floats(link, data.data(), static_cast<std::size_t>(s / 4));
          t.push_back(mono_now() - t0);
        }
        std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
        medians.push_back(static_cast<double>(t[t.size() / 2]));
      }
      // Every worker fits the same numbers: the mean of the workers' medians.
      allreduce_on(link.ctx, medians.data(), medians.size(), sizeof(double),
                   static_cast<ReduceFn>(&gloo::sum<double>));
    } catch (const std::exception& e) {
      return unavailable(name() + ": calibrating link " + std::to_string(li) + ": " + e.what());
    }
    for (double& m : medians) m /= opts.job.workers;
    std::string sweep =
        "link " + std::to_string(li) + " all-reduce times (mean of the workers' medians):";
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      sweep += " " + format_size(static_cast<Bytes>(sizes[i])) + " " +
               format_time(static_cast<TimeNs>(medians[i]));
    }
    sweeps.push_back(std::move(sweep));
    return fit_line(sizes, medians);
  }

  // The slowest worker's compute factor (every collective waits for it), and whether the
  // workers agree on checksums: a worker without them would take a peer's checksum
  // messages for data, so this one collective runs without, and a disagreement fails
  // every worker, naming the setting (as the PS path's hello does).
  Result<double> slowest_factor() {
    // The wire's dtype too (compression): elements of another size would be taken apart
    // wrongly. The maximum of x and of -x is the minimum's negation: equal when all agree.
    const double cs = opts.job.payload_checksums ? 1 : 0;
    const double wire = static_cast<double>(opts.job.wire_dtype);
    double v[5] = {opts.compute_factor, cs, 1 - cs, wire, -wire};
    try {
      allreduce_on(control, v, 5, sizeof(double), static_cast<ReduceFn>(&gloo::max<double>), false);
    } catch (const std::exception& e) {
      return unavailable(name() + ": " + e.what());
    }
    if (v[1] == 1 && v[2] == 1) {
      return invalid_argument(
          name() +
          ": the workers disagree on checksums (some run with --no-checksum): every "
          "worker of the job or none");
    }
    if (v[3] != -v[4]) {
      return invalid_argument(
          name() +
          ": the workers disagree on compression (--compression): every worker of the "
          "job the same");
    }
    return v[0];
  }

  Status build() {
    const JobOptions& job = opts.job;
    AllReduceContext ctx;
    ctx.profile = &job.profile;
    ctx.layout = &layout;
    ctx.workers = job.workers;
    // First, on the control context: the workers' agreement on checksums comes with it,
    // before any collective that uses them.
    QS_ASSIGN_OR_RETURN(ctx.compute_factor, slowest_factor());
    for (int li = 0; li < static_cast<int>(links.size()); ++li) {
      QS_ASSIGN_OR_RETURN(AllReduceCost c, calibrate(li));
      fits.push_back(c);
    }
    ctx.links = fits;
    QS_ASSIGN_OR_RETURN(policy, make_allreduce_policy(job.policy, job.policy_options, ctx));
    staged = policy->forward_gate() == ForwardGate::kPolicy;
    delayed = staged && source->applies_delayed_updates();
    // Worker 0 decides for all (see "replicating a policy" above): DeFT's knapsacks and
    // ByteScheduler's fusion both depend on when each input arrived. Delayed updates are
    // handed over at points of worker 0's input stream (track), one worker or many.
    if ((job.workers > 1 && policy->communicates()) || delayed) {
      if (opts.rank == 0) {
        policy =
            std::make_unique<RecordingPolicy>(std::move(policy), [this](const PolicyRecord& r) {
              if (opts.job.workers > 1) record(r);
              if (delayed) track(r);
            });
        recording = job.workers > 1;
      } else {
        auto replica = std::make_unique<ReplicaPolicy>(
            std::move(policy), [this] { loop->post([this] { training->recheck_gates(); }); },
            [this](const PolicyRecord& r) {
              if (delayed) track(r);
            });
        this->replica = replica.get();
        policy = std::move(replica);
      }
    }
    if (opts.compute) {
      device = opts.compute(*timer);
      if (!device) return invalid_argument("the compute factory made no compute");
    } else {
      device = std::make_unique<EmulatedCompute>(
          job.profile, opts.compute_factor, *timer,
          opts.record_trace ? SpanRecorder(&trace, opts.rank, 0, false) : SpanRecorder(),
          [this](const ComputeStep& s) { source->on_backward(s.layer, s.iteration); });
    }
    compute = std::make_unique<SnapshotCompute>(*this, *device);
    LoopOptions lo;
    lo.iterations = job.iterations;
    lo.start_on_first_gradient =
        static_cast<bool>(opts.compute);  // a real model's (open-ended) run
    lo.before_backward = [this](std::int64_t it) {
      if (it == opts.die_at_iteration) {
        std::fprintf(stderr, "%s died at iteration %lld (fault injection)\n", name().c_str(),
                     static_cast<long long>(it));
        std::fflush(stderr);
        std::_Exit(3);
      }
      return true;
    };
    lo.failed = [this](const Status& s) { loop->fail(s.with_context(name())); };
    // The caller's buffers (PyTorch) hear when a layer's sums are in. Known content is
    // checked per bucket instead (finish()): a bucket that merged iterations (DeFT) holds
    // a sum over several, which a per-layer check of one iteration would call wrong.
    if (opts.tensors != nullptr) {
      lo.layer_ready = [this](int layer, std::int64_t it) {
        return source->on_layer_ready(layer, it);
      };
    }
    training = std::make_unique<TrainingLoop>(job.profile, layout, *policy, *timer, *compute, *this,
                                              std::move(lo));

    return Status::ok();
  }

  // ---- staging: under DeFT's delayed updates a bucket of iteration i may run after the
  // backward of i + 1 rewrote the gradients, and carries the sum over a range of
  // iterations first..last. So when a layer's backward ends its gradients are added to the
  // running sum of their range (policy->merged_from: decided when the iteration started),
  // which the link threads read when they reduce its buckets; the sum's buffer goes back
  // to a pool once every byte of the range was read. A replica may not know the range of
  // an iteration yet when its backward ends (it applies worker 0's inputs as it reaches
  // them): that iteration is copied aside and added to its range as soon as it is known,
  // at the latest when a bucket carrying it is issued. So the staging holds a few
  // buffers of the model's gradients' size (a range being summed, one whose buckets are
  // still queued, an iteration aside, one spare), however many iterations DeFT merges and
  // however long the run; the sums are those of adding the iterations in order, as before.
  class SnapshotCompute final : public Compute {
   public:
    SnapshotCompute(Impl& w, Compute& inner) : w_(w), inner_(inner) {}
    void run(const ComputeStep& step, TimeNs earliest, Done done) override {
      if (step.pass != Pass::kBackward || !w_.staged)
        return inner_.run(step, earliest, std::move(done));
      inner_.run(step, earliest, [this, step, done = std::move(done)](TimeNs end) {
        w_.snapshot(step.layer, step.iteration);
        done(end);
      });
    }

   private:
    Impl& w_;
    Compute& inner_;
  };

  // A buffer of the model's gradients' size: a spare, or a new one (uninitialised).
  StagingBuffer take_staging_buffer() {
    std::lock_guard lock(mu);
    if (!staging_spare.empty()) {
      StagingBuffer b = std::move(staging_spare.back());
      staging_spare.pop_back();
      return b;
    }
    ++staging_buffers;
    staging_buffers_max = std::max(staging_buffers, staging_buffers_max);
    return std::make_unique_for_overwrite<float[]>(
        static_cast<std::size_t>(layout.total_bytes() / 4));
  }
  // mu held. One spare is kept (the next range needs one soon); the rest are freed.
  void give_back_locked(StagingBuffer b) {
    if (staging_spare.empty()) {
      staging_spare.push_back(std::move(b));
    } else {
      --staging_buffers;
    }
  }

  // The running sum of the range starting at `first` (loop thread).
  float* range_sum(std::int64_t first) {
    {
      std::lock_guard lock(mu);
      auto r = staged_ranges.find(first);
      if (r != staged_ranges.end()) return r->second.sums.get();
    }
    StagingBuffer b = take_staging_buffer();
    float* at = b.get();
    std::lock_guard lock(mu);
    staged_ranges[first].sums = std::move(b);
    return at;
  }

  // Adds `layer`'s gradients of iteration `it` (at `from`, laid out as the staging
  // buffers: the registry's when null) to the range sum `to` whose first iteration is
  // `first`: the first iteration is copied, the others added, in order.
  void add_layer(float* to, const float* from, int layer, std::int64_t it, std::int64_t first) {
    for (TensorId t = layout.first_tensor(layer); t < layout.end_tensor(layer); ++t) {
      const TensorBuffer& b = buffers[static_cast<std::size_t>(t)];
      const std::size_t n = static_cast<std::size_t>(b.elements);
      const float* src = from != nullptr ? from + base_of(t) : b.gradient;
      float* dst = to + base_of(t);
      if (it == first) {
        std::memcpy(dst, src, n * sizeof(float));
      } else {
        for (std::size_t k = 0; k < n; ++k) dst[k] += src[k];
      }
    }
  }

  // Loop thread: the backward of `layer` in iteration `it` ended.
  void snapshot(int layer, std::int64_t it) {
    settle_aside();
    const std::int64_t first = policy->merged_from(it);
    if (first < 0) {  // a replica that has not applied worker 0's start of `it` yet
      Aside& a = aside[it];
      if (!a.gradients) {
        a.gradients = take_staging_buffer();
        a.layers.assign(static_cast<std::size_t>(layout.num_layers()), 0);
      }
      for (TensorId t = layout.first_tensor(layer); t < layout.end_tensor(layer); ++t) {
        const TensorBuffer& b = buffers[static_cast<std::size_t>(t)];
        std::memcpy(a.gradients.get() + base_of(t), b.gradient,
                    static_cast<std::size_t>(b.elements) * sizeof(float));
      }
      a.layers[static_cast<std::size_t>(layer)] = 1;
      return;
    }
    add_layer(range_sum(first), nullptr, layer, it, first);
  }

  // Loop thread: the iterations set aside whose range is known now join it, in order.
  void settle_aside() {
    while (!aside.empty()) {
      auto a = aside.begin();
      const std::int64_t first = policy->merged_from(a->first);
      if (first < 0) return;
      float* to = range_sum(first);
      for (int l = 0; l < layout.num_layers(); ++l) {
        if (a->second.layers[static_cast<std::size_t>(l)])
          add_layer(to, a->second.gradients.get(), l, a->first, first);
      }
      {
        std::lock_guard lock(mu);
        give_back_locked(std::move(a->second.gradients));
      }
      aside.erase(a);
    }
  }

  std::size_t base_of(TensorId t) {
    if (bases.empty()) {
      std::size_t at = 0;
      for (const TensorInfo& ti : layout.tensors()) {
        bases.push_back(at);
        at += static_cast<std::size_t>(ti.bytes / 4);
      }
    }
    return bases[static_cast<std::size_t>(t)];
  }

  // ---- delayed updates (a real model under DeFT): which sums update which layer when ----
  //
  // Fed worker 0's policy inputs in worker 0's order (its own RecordingPolicy, or the
  // replica applying them, each input before the policy acts on it), so every worker
  // hands over the same updates at the same points. A layer's update over iterations
  // [first, last] is due before the forward pass after `last` when every byte of it was
  // issued during that backward pass (the iteration's update is not delayed: Fig. 9's
  // first batch; the layer's forward waits for its sums, as WFBP's); otherwise before
  // the first forward pass that worker 0 began after every sum of it was reduced; after
  // training, at once. A worker never waits for more than worker 0 had (its replica
  // applies a completion only once it completed that collective itself).
  void track(const PolicyRecord& r) {
    switch (r.kind) {
      case kCollectiveDone: {
        auto b = delayed_buckets.find(r.id);
        QS_CHECK(b != delayed_buckets.end());
        const std::pair range{b->second.first_iteration, b->second.last_iteration};
        Progress& p = progress_of(range);
        for (const Chunk& c : b->second.chunks) {
          const int l = layout.tensor(c.tensor).layer;
          const auto li = static_cast<std::size_t>(l);
          p.reduced[li] += c.length;
          if (p.reduced[li] != layout.layer_bytes(l)) continue;
          ++p.layers_reduced;
          const LayerUpdate u{l, range.first, range.second, true};
          if (!p.handed[li]) {
            due.push_back(u);
          } else if (Status s = source->on_update_ready(u); !s.is_ok()) {
            loop->fail(s.with_context(name()));
          }
        }
        if (p.layers_reduced == layout.num_layers()) merged_progress.erase(range);
        delayed_buckets.erase(b);
        if (training_over) hand_over(kAfterTraining);
        break;
      }
      case kForwardStart:
        if (r.layer == 0) {
          // The layers of the iteration just computed whose every byte is on its way.
          for (auto& [range, p] : merged_progress) {
            if (range.second != r.iteration) continue;
            for (int l = 0; l < layout.num_layers(); ++l) {
              const auto li = static_cast<std::size_t>(l);
              if (p.issued[li] == layout.layer_bytes(l) && p.reduced[li] < p.issued[li]) {
                p.handed[li] = 1;
                due.push_back(LayerUpdate{l, range.first, range.second, false});
              }
            }
          }
          hand_over(r.iteration + 1);
        }
        break;
      case kTrainingEnd:
        training_over = true;
        hand_over(kAfterTraining);
        break;
      default:
        break;
    }
  }

  struct Progress {
    std::vector<Bytes> issued, reduced;  // per layer
    std::vector<char> handed;            // per layer: handed over before its sums were in
    int layers_reduced = 0;
  };
  Progress& progress_of(std::pair<std::int64_t, std::int64_t> range) {
    Progress& p = merged_progress[range];
    if (p.issued.empty()) {
      const auto n = static_cast<std::size_t>(layout.num_layers());
      p.issued.assign(n, 0);
      p.reduced.assign(n, 0);
      p.handed.assign(n, 0);
    }
    return p;
  }

  void hand_over(std::int64_t before) {
    Status s = source->on_updates(before, due);
    due.clear();
    if (!s.is_ok()) loop->fail(s.with_context(name()));
  }

  // ---- replication transport: worker 0's inputs to the others, in batches ----
  bool replicating() const { return replica != nullptr || recording; }

  void record(const PolicyRecord& r) {
    {
      std::lock_guard lock(mu);
      records.push_back(r);
    }
    cv.notify_all();
  }

  void replication_sender() {
    try {
      while (true) {
        bool end = false;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return stopping || !records.empty(); });
          if (records.empty()) return;  // stopping
          send_batch.count = 0;
          while (!records.empty() && send_batch.count < 64) {
            end |= records.front().kind == kEndOfStream;
            send_batch.records[send_batch.count++] = records.front();
            records.pop_front();
          }
          send_batch.crc = opts.job.payload_checksums ? batch_crc(send_batch) : 0;
        }
        for (int r = 1; r < opts.job.workers; ++r) {
          try {
            replica_buf->send(r, kReplicaSlot);
            if (!replica_buf->waitSend(to_ms_duration(opts.job.peer_timeout)))
              return;  // aborted: stopping
          } catch (const std::exception& e) {
            throw std::runtime_error("lost worker " + std::to_string(r) + ": " + e.what());
          }
        }
        if (end) return;
      }
    } catch (const std::exception& ex) {
      if (stopping) return;
      Status s = unavailable(std::string("replicating the policy: ") + ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    }
  }

  void replication_receiver() {
    try {
      while (true) {
        replica_buf->recv(0, kReplicaSlot);
        if (!replica_buf->waitRecv(nullptr, std::chrono::hours(24))) return;  // aborted: stopping
        if (opts.job.payload_checksums && batch_crc(recv_batch) != recv_batch.crc) {
          throw PeerError(0,
                          "corrupted data from worker 0: a batch of its policy's inputs failed its "
                          "CRC32C check; "
                          "not applied");
        }
        std::vector<PolicyRecord> got(
            recv_batch.records,
            recv_batch.records + std::clamp<std::int64_t>(recv_batch.count, 0, 64));
        bool end = false;
        for (const PolicyRecord& r : got) end |= r.kind == kEndOfStream;
        loop->post([this, got = std::move(got)] {
          last_done = mono_now();  // worker 0 is alive
          for (const PolicyRecord& r : got) replica->deliver(r);
        });
        if (end) return;
      }
    } catch (const std::exception& ex) {
      if (stopping) return;
      const bool named = dynamic_cast<const PeerError*>(&ex) != nullptr;
      Status s = unavailable(std::string(named ? "" : "lost worker 0 (its policy's decisions): ") +
                             ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    }
  }

  // ---- the Exchange (loop thread) ----
  void all_reduce(const CollectiveBucket& b) override {
    const std::uint64_t key = bucket_key(b);
    // The policy issued it, so it knows the range of every iteration the bucket carries.
    if (staged) settle_aside();
    if (delayed) {
      delayed_buckets.emplace(b.id, b);
      Progress& p = progress_of({b.first_iteration, b.last_iteration});
      for (const Chunk& c : b.chunks)
        p.issued[static_cast<std::size_t>(layout.tensor(c.tensor).layer)] += c.length;
    }
    ++outstanding;
    {
      std::lock_guard lock(mu);
      links[static_cast<std::size_t>(b.link)]->queue.push_back(Entry{b, key});
    }
    cv.notify_all();
    if (opts.rank != 0 && opts.job.workers > 1) report(key, b.link);
  }
  void flush() override {}
  Status check(const CollectiveBucket& b) const override {
    if (b.link < 0 || b.link >= static_cast<int>(links.size())) {
      return internal_error("policy used link " + std::to_string(b.link) + " of " +
                            std::to_string(links.size()));
    }
    for (const Chunk& c : b.chunks) {
      if (c.offset % 4 != 0 || c.length % 4 != 0) {
        return internal_error("a chunk of tensor " + std::to_string(c.tensor) +
                              " is not float32-aligned");
      }
    }
    return Status::ok();
  }
  Traffic take_traffic(TimeNs) override { return meter.take(); }

  // Tells worker 0 that this worker issued `key` (loop thread): queued for the report
  // thread, since a gloo send completes only once worker 0 posted its receive, a round
  // trip the loop (and the emulated GPU's timers) should not wait for.
  void report(std::uint64_t key, int link) {
    {
      std::lock_guard lock(mu);
      reports_out.push_back(ControlMessage{key, link, 1});
    }
    cv.notify_all();
  }

  void report_thread() {
    try {
      while (true) {
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return stopping.load() || !reports_out.empty(); });
          if (stopping) return;
          report_msg = sealed(reports_out.front(), opts.job.payload_checksums);
          reports_out.pop_front();
        }
        report_buf->send(0, kReportSlot);
        if (!report_buf->waitSend(to_ms_duration(opts.job.peer_timeout)))
          return;  // aborted: stopping
      }
    } catch (const std::exception& ex) {
      if (stopping) return;
      Status s = unavailable(std::string("lost worker 0 (reporting a bucket): ") + ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    }
  }

  // A collective ended (posted to the loop thread by a link thread).
  void completed(int li, const CollectiveBucket& b, TimeNs t0, TimeNs t1) {
    --outstanding;
    last_done = mono_now();
    const Bytes m = b.bytes();
    meter.add(li, t0, t1, m);
    run_bytes += m;
    ++run_messages;
    if (opts.record_trace) {
      SpanRecorder(&trace, opts.rank, li + 1, false)
          .add(t0, t1,
               "ar #" + std::to_string(b.id) + " it " + std::to_string(b.first_iteration) +
                   (b.last_iteration != b.first_iteration ? "-" + std::to_string(b.last_iteration)
                                                          : "") +
                   " " + format_size(m));
    }
    on_done_listener->on_collective_done(b);
  }

  // ---- link threads ----
  struct Entry {
    CollectiveBucket bucket;
    std::uint64_t key;
  };
  struct Link {
    std::shared_ptr<gloo::Context> ctx;
    std::deque<Entry> queue;  // guarded by mu
    std::thread thread;
    std::unique_ptr<gloo::transport::UnboundBuffer> decision_buf;  // followers
    ControlMessage decision{};
    std::unique_ptr<gloo::transport::UnboundBuffer> send_buf;  // worker 0's decisions
    ControlMessage out{};
    std::vector<float> data;      // the bucket being reduced (link thread only)
    std::vector<std::byte> wire;  // compression: the same in the wire's dtype
  };

  // `count` floats at `data` summed across the workers on the link's context, in place,
  // on the wire as the job says. Compression: the ring (or bcube) runs on 2-byte
  // elements; this worker's values are rounded once, every partial sum is added in
  // float32 and rounded as it is passed on, and every worker ends with the same rounded
  // sums, widened back here.
  void reduce_floats(Link& link, float* data, std::size_t count,
                     std::function<void(int, std::byte*, std::size_t)> tamper = {}) {
    const transport::WireDType wire = opts.job.wire_dtype;
    if (wire == transport::WireDType::kFloat32) {
      allreduce_on(link.ctx, data, count, sizeof(float), sum_floats(), true, std::move(tamper));
      return;
    }
    link.wire.resize(count * 2);
    encode_floats(data, count, wire, link.wire.data());
    allreduce_on(link.ctx, link.wire.data(), count, 2,
                 wire == transport::WireDType::kBFloat16 ? &reduce_bf16 : &reduce_fp16, true,
                 std::move(tamper));
    decode_floats(link.wire.data(), count, wire, data);
  }

  void link_thread(int li) {
    Link& link = *links[static_cast<std::size_t>(li)];
    const bool leader = opts.rank == 0;
    const int n = opts.job.workers;
    try {
      ControlMessage& out = link.out;
      while (true) {
        Entry e;
        if (leader) {
          // The earliest bucket every worker has issued.
          std::unique_lock lock(mu);
          std::deque<Entry>::iterator pick;
          cv.wait(lock, [&] {
            if (stopping) return true;
            pick = std::find_if(link.queue.begin(), link.queue.end(), [&](const Entry& q) {
              auto r = reports.find(q.key);
              return n == 1 || (r != reports.end() && r->second >= n - 1);
            });
            return pick != link.queue.end();
          });
          if (stopping) return;
          e = std::move(*pick);
          link.queue.erase(pick);
          reports.erase(e.key);
          lock.unlock();
          out = sealed(ControlMessage{e.key, li, 2}, opts.job.payload_checksums);
          for (int r = 1; r < n; ++r) {
            try {
              link.send_buf->send(r, kDecisionSlot + static_cast<std::uint64_t>(li));
              if (!link.send_buf->waitSend(to_ms_duration(opts.job.peer_timeout)))
                return;  // aborted: stopping
            } catch (const std::exception& e) {
              throw std::runtime_error("lost worker " + std::to_string(r) + ": " + e.what());
            }
          }
        } else {
          // No deadline here: a link may idle for a long compute phase; the loop's
          // watchdog detects a stall, and a dead worker 0 closes the pair at once. gloo's
          // error names no peer (another wait of the control context that timed out
          // closes its pairs: "Application timeout caused pair closure"): this one is
          // worker 0's.
          try {
            link.decision_buf->recv(0, kDecisionSlot + static_cast<std::uint64_t>(li));
            if (!link.decision_buf->waitRecv(nullptr, std::chrono::hours(24)))
              return;  // aborted: stopping
          } catch (const std::exception& e) {
            throw std::runtime_error(
                std::string("lost worker 0 (its decisions of which bucket runs next): ") +
                e.what());
          }
          check_control(link.decision, opts.job.payload_checksums, 0,
                        "a decision of which bucket runs next");
          const std::uint64_t key = link.decision.key;
          std::unique_lock lock(mu);
          std::deque<Entry>::iterator pick;
          std::deque<Entry>* from = nullptr;
          const bool found =
              cv.wait_for(lock, std::chrono::nanoseconds(opts.job.peer_timeout), [&] {
                for (auto& other : links) {
                  pick = std::find_if(other->queue.begin(), other->queue.end(),
                                      [&](const Entry& q) { return q.key == key; });
                  if (pick != other->queue.end()) {
                    from = &other->queue;
                    return true;
                  }
                }
                return stopping.load();
              });
          if (stopping) return;
          if (!found) {
            throw std::runtime_error(
                "worker 0 runs a bucket this worker never issued within the peer timeout (the "
                "policy cut "
                "different buckets on different workers)");
          }
          e = std::move(*pick);
          from->erase(pick);
        }
        run_bucket(li, link, e.bucket);
      }
    } catch (const std::exception& ex) {
      if (stopping) return;
      Status s = unavailable("link " + std::to_string(li) + ": " + ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    }
  }

  void run_bucket(int li, Link& link, const CollectiveBucket& b) {
    // One chunk of this iteration's gradients: reduced in place in its sum buffer (no copy
    // at all when the caller's sum is its gradient, as PyTorch's is).
    if (!staged && b.chunks.size() == 1) {
      const Chunk& c = b.chunks[0];
      const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                        count = static_cast<std::size_t>(c.length / 4);
      const TensorBuffer& t = buffers[static_cast<std::size_t>(c.tensor)];
      if (t.sum != t.gradient)
        std::memcpy(t.sum + first, t.gradient + first, count * sizeof(float));
      const TimeNs t0 = mono_now();
      reduce(li, link, b, t.sum + first, count);
      const TimeNs t1 = mono_now();
      finish(li, b, t0, t1, nullptr);
      return;
    }
    const Bytes m = b.bytes();
    link.data.resize(static_cast<std::size_t>(m / 4));
    float* out = link.data.data();
    // Gather: this worker's gradients, summed over the bucket's iterations.
    for (const Chunk& c : b.chunks) {
      const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                        count = static_cast<std::size_t>(c.length / 4);
      if (staged) {
        const float* src;
        {
          std::lock_guard lock(mu);
          auto r = staged_ranges.find(b.first_iteration);
          if (r == staged_ranges.end()) {
            throw std::runtime_error("no gradients staged for iterations " +
                                     std::to_string(b.first_iteration) + ".." +
                                     std::to_string(b.last_iteration));
          }
          src = r->second.sums.get() + base_of_locked(c.tensor) + first;
        }
        std::memcpy(out, src, count * sizeof(float));
      } else {
        std::memcpy(out, buffers[static_cast<std::size_t>(c.tensor)].gradient + first,
                    count * sizeof(float));
      }
      out += count;
    }
    if (staged) {  // every byte of the range read: its buffer is free
      std::lock_guard lock(mu);
      auto r = staged_ranges.find(b.first_iteration);
      if ((r->second.read += m) == layout.total_bytes()) {
        give_back_locked(std::move(r->second.sums));
        staged_ranges.erase(r);
      }
    }
    const TimeNs t0 = mono_now();
    reduce(li, link, b, link.data.data(), link.data.size());
    const TimeNs t1 = mono_now();
    // Scatter into the sums (posting the completion first would let the loop reuse them):
    // with delayed updates, into the source's buffer for the bucket's iterations. Known
    // content's sums are read by no one (its chunks are checked in the link's buffer), and
    // under DeFT two buckets of one chunk may run at once on two links: both would write
    // the one sum buffer at the same time, a data race, so staged known content skips it.
    const bool read_back = !(staged && source == known.get());
    const float* in = link.data.data();
    for (std::size_t i = 0; read_back && i < b.chunks.size(); ++i) {
      const Chunk& c = b.chunks[i];
      const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                        count = static_cast<std::size_t>(c.length / 4);
      float* to = delayed ? source->merged_sum(c.tensor, b.first_iteration, b.last_iteration)
                          : buffers[static_cast<std::size_t>(c.tensor)].sum;
      if (to == nullptr)
        throw std::runtime_error("no buffer for the merged sums of " + describe(b));
      std::memcpy(to + first, in, count * sizeof(float));
      in += count;
    }
    finish(li, b, t0, t1, link.data.data());
  }

  // Reduces the bucket's gradients at `data` across the workers on the link's context,
  // every message checked (checked_allreduce.h); an error names the bucket and the worker
  // at fault (a corrupted message's sender, the peer a wait timed out on).
  void reduce(int li, Link& link, const CollectiveBucket& b, float* data, std::size_t count) {
    std::function<void(int, std::byte*, std::size_t)> tamper;
    if (opts.tamper_received) {
      tamper = [this, li](int from, std::byte* p, std::size_t n) {
        opts.tamper_received(li, from, p, n);
      };
    }
    try {
      reduce_floats(link, data, count, std::move(tamper));
    } catch (const std::exception& e) {
      throw std::runtime_error("all-reduce of " + describe(b) + ": " + e.what());
    }
  }

  // Known content: checks every reduced element exactly (before the loop may reuse the
  // buffers), then hands the completion to the loop.
  // `reduced`: the bucket's elements in chunk order (the link's buffer), or null when the
  // one chunk was reduced in place in its sum buffer. Checked there, before the scatter:
  // under DeFT two buckets of one chunk (different iterations) may run at once on two
  // links, and the sum buffer holds whichever scattered last.
  void finish(int li, const CollectiveBucket& b, TimeNs t0, TimeNs t1, const float* reduced) {
    const bool check = opts.verify && opts.tensors == nullptr;
    for (std::size_t i = 0; check && i < b.chunks.size(); ++i) {
      const Chunk& c = b.chunks[i];
      const std::size_t first = static_cast<std::size_t>(c.offset / 4),
                        count = static_cast<std::size_t>(c.length / 4);
      const float* at =
          reduced != nullptr ? reduced : buffers[static_cast<std::size_t>(c.tensor)].sum + first;
      Status s =
          opts.job.wire_dtype == transport::WireDType::kFloat32
              ? check_sum(at, static_cast<std::int64_t>(count), static_cast<std::int64_t>(first),
                          opts.job.workers, b.first_iteration, b.last_iteration, c.tensor)
              : check_compressed_allreduce(at, static_cast<std::int64_t>(count),
                                           static_cast<std::int64_t>(first), opts.job.workers,
                                           b.first_iteration, b.last_iteration, c.tensor,
                                           opts.job.wire_dtype);
      if (!s.is_ok()) {
        loop->post([this, s] { loop->fail(s.with_context(name())); });
        return;
      }
      if (reduced != nullptr) reduced += count;
    }
    loop->post([this, li, b, t0, t1, check] {
      if (check) {
        if (verified.size() <= static_cast<std::size_t>(b.last_iteration)) {
          verified.resize(static_cast<std::size_t>(b.last_iteration) + 1, 0);
        }
        for (std::int64_t it = b.first_iteration; it <= b.last_iteration; ++it)
          verified[static_cast<std::size_t>(it)] += b.bytes();
      }
      completed(li, b, t0, t1);
    });
  }

  std::size_t base_of_locked(TensorId t) { return bases[static_cast<std::size_t>(t)]; }

  // Worker 0: the other workers' reports.
  void control_thread() {
    std::vector<int> others;
    for (int r = 1; r < opts.job.workers; ++r) others.push_back(r);
    try {
      while (true) {
        report_rx->recv(others, kReportSlot);
        int from = -1;
        if (!report_rx->waitRecv(&from, std::chrono::hours(24))) return;  // aborted: stopping
        check_control(rx_msg, opts.job.payload_checksums, from, "a report of an issued bucket");
        {
          std::lock_guard lock(mu);
          ++reports[rx_msg.key];
        }
        cv.notify_all();
      }
    } catch (const PeerError& ex) {
      if (stopping) return;
      Status s = unavailable(ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    } catch (const std::exception& ex) {
      if (stopping) return;
      // gloo's error names no peer ("Application timeout caused pair closure"): the ones
      // this thread hears from are the candidates.
      std::string who;
      for (int r : others) who += (who.empty() ? "" : ", ") + std::to_string(r);
      Status s = unavailable(
          (others.size() == 1 ? "lost worker " + who : "lost one of workers {" + who + "}") +
          " (its reports of issued buckets): " + ex.what());
      loop->post([this, s] { loop->fail(s.with_context(name())); });
    }
  }

  void start_threads() {
    (void)base_of(0);  // bases are built before any thread reads them
    // The receive buffers exist before their threads start, so that stop can abort them.
    if (opts.rank != 0) {
      report_buf = control->createUnboundBuffer(&report_msg, sizeof report_msg);
      report_sender = std::thread([this] { report_thread(); });
    }
    if (opts.rank == 0 && opts.job.workers > 1) {
      report_rx = control->createUnboundBuffer(&rx_msg, sizeof rx_msg);
      control_rx_thread = std::thread([this] { control_thread(); });
    }
    if (replicating()) {
      replica_buf = opts.rank == 0 ? control->createUnboundBuffer(&send_batch, sizeof send_batch)
                                   : control->createUnboundBuffer(&recv_batch, sizeof recv_batch);
      replication_thread =
          std::thread([this] { opts.rank == 0 ? replication_sender() : replication_receiver(); });
    }
    for (std::size_t li = 0; li < links.size(); ++li) {
      Link& l = *links[li];
      if (opts.rank != 0)
        l.decision_buf = control->createUnboundBuffer(&l.decision, sizeof l.decision);
      if (opts.rank == 0 && opts.job.workers > 1)
        l.send_buf = control->createUnboundBuffer(&l.out, sizeof l.out);
      links[li]->thread = std::thread([this, li] { link_thread(static_cast<int>(li)); });
    }
  }

  void stop_threads() {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      stopping = true;
    }
    cv.notify_all();
    // Blocked receives are aborted until their thread has left (an abort before the
    // receive began is kept by gloo for the next wait).
    for (auto& l : links) {
      while (l->thread.joinable()) {
        if (l->decision_buf) l->decision_buf->abortWaitRecv();
        if (l->send_buf) l->send_buf->abortWaitSend();
        l->thread.join();
      }
    }
    while (replication_thread.joinable()) {
      if (opts.rank != 0) {
        replica_buf->abortWaitRecv();
      } else {
        replica_buf->abortWaitSend();
      }
      replication_thread.join();
    }
    while (report_sender.joinable()) {
      report_buf->abortWaitSend();
      report_sender.join();
    }
    while (control_rx_thread.joinable()) {
      report_rx->abortWaitRecv();
      control_rx_thread.join();
    }
  }

  bool done() const {
    return training->finished() && outstanding == 0 && (replica == nullptr || replica->complete());
  }

  // A worker waiting on its peers (a collective outstanding, a forward gate closed on
  // sums, or worker 0's decisions not yet come) with nothing from them for peer_timeout
  // fails, saying what it waited for. Waiting for its own compute (a PyTorch user's
  // evaluation pass) is not waiting on peers.
  void schedule_watchdog() {
    loop->schedule_after(std::max<TimeNs>(opts.job.peer_timeout / 4, kNsPerMs), [this] {
      if (done()) return;
      const bool on_peers = outstanding > 0 || training->blocked() || training->finished();
      if (on_peers && mono_now() - last_done > opts.job.peer_timeout) {
        const std::string what = outstanding > 0
                                     ? std::to_string(outstanding) + " buckets outstanding"
                                 : replica != nullptr ? "waiting for worker 0's decisions"
                                                      : "waiting for the other workers";
        // With two workers the silent one is known.
        const std::string who =
            opts.job.workers == 2
                ? "lost worker " + std::to_string(1 - opts.rank) + ": nothing from it"
                : "nothing from the other workers";
        loop->fail(unavailable(name() + ": " + who + " for " + format_time(opts.job.peer_timeout) +
                               " in iteration " + std::to_string(training->iteration()) + " (" +
                               what + "; a peer stalled or ended early)"));
        return;
      }
      schedule_watchdog();
    });
  }

  // A policy's QS_CHECK, gloo, or memory may throw: an error of this worker, never
  // std::terminate in the caller's process (a Python interpreter).
  Result<WorkerReport> run() {
    try {
      return run_inner();
    } catch (const std::exception& e) {
      stop_threads();
      return internal_error(name() + ": " + e.what());
    }
  }

  Result<WorkerReport> run_inner() {
    QS_RETURN_IF_ERROR(connect());
    QS_RETURN_IF_ERROR(build());
    start_threads();
    last_done = mono_now();
    schedule_watchdog();
    on_done_listener = training.get();
    training->start();
    if (finish_requested) training->finish_early(finish_iterations);
    // Until the last collective (those a policy issues at the end of training) is back,
    // and on a replica, until worker 0's last decision was applied.
    Status s = loop->run([this] { return done(); });
    if (s.is_ok() && replicating() && opts.rank == 0) {
      record(PolicyRecord{kEndOfStream, 0, 0, 0, 0});
      replication_thread.join();  // the sender leaves once the end is sent
    }
    if (s.is_ok()) s = training->check_complete().with_context(name());
    if (s.is_ok()) {
      // Nobody tears its contexts down while a peer still reads from them.
      try {
        gloo::BarrierOptions o(control);
        gloo::barrier(o);
      } catch (const std::exception& e) {
        s = unavailable(name() + ": final barrier: " + e.what());
      }
    }
    stop_threads();
    if (!s.is_ok()) return s;
    return make_report();
  }

  Result<WorkerReport> make_report() const {
    if (training->records().empty())
      return invalid_argument(name() + ": the run ended before its first iteration");
    WorkerReport r;
    r.worker_id = opts.rank;
    r.policy = opts.job.policy;
    r.congestion_control = "gloo " + std::string(gloo_algorithm_name(opts.algorithm));
    r.push_end = "collective";
    std::vector<double> util;
    for (const IterationRecord& rec : training->records()) {
      r.iteration_times.push_back(rec.time);
      util.push_back(rec.utilisation);
    }
    std::vector<TimeNs> steady(
        r.iteration_times.begin() +
            std::min<std::ptrdiff_t>(opts.warmup,
                                     static_cast<std::ptrdiff_t>(r.iteration_times.size()) - 1),
        r.iteration_times.end());
    std::sort(steady.begin(), steady.end());
    r.median_iteration = steady.empty() ? 0 : steady[steady.size() / 2];
    // Per iteration on average: a collective belongs to the iteration in which it ended,
    // which under delayed updates (DeFT) differs from worker to worker.
    // A bucket that merged iterations is counted once: what merging saves shows here.
    const auto iterations = static_cast<std::int64_t>(training->records().size());
    r.bytes_pushed_per_iteration = run_bytes / iterations;
    r.units_per_iteration = (run_messages + iterations / 2) / iterations;
    const IterationRecord& last = training->records().back();
    r.uplink_utilisation = steady_median(util, opts.warmup);
    r.uplink_gbps = last.traffic.busy > 0 ? 8.0 * static_cast<double>(last.traffic.bytes) /
                                                static_cast<double>(last.traffic.busy)
                                          : 0;
    for (std::size_t it = 0; it < verified.size(); ++it) {
      if (verified[it] == layout.total_bytes()) ++r.iterations_verified;
    }
    r.first_backward_at = training->first_backward_at();
    r.trace = trace;
    r.allreduce_fit = fits;
    r.notes = sweeps;
    for (std::string& n : policy->report()) r.notes.push_back(std::move(n));
    r.staging_buffers_max = staging_buffers_max;  // the threads are joined: nobody else writes it
    return r;
  }

  CollectiveOptions opts;
  TensorLayout layout;
  std::unique_ptr<transport::EventLoop> loop;
  TensorSource* source = nullptr;
  std::unique_ptr<KnownContent> known;
  std::vector<TensorBuffer> buffers;
  std::unique_ptr<StoreClient> store_client;
  std::vector<std::shared_ptr<gloo::transport::Device>> devices;
  std::shared_ptr<gloo::Context> control;
  std::vector<std::unique_ptr<Link>> links;
  std::vector<AllReduceCost> fits;
  std::vector<std::string> sweeps;  // the calibration's times, per link (report notes)
  std::unique_ptr<AllReducePolicy> policy;
  std::unique_ptr<LoopTimer> timer;
  std::unique_ptr<Compute> device;
  std::unique_ptr<Compute> compute;
  std::unique_ptr<TrainingLoop> training;
  ExchangeListener* on_done_listener = nullptr;
  bool staged = false;
  bool delayed = false;  // staged, and the source applies the updates (delayed_buckets ...)
  std::vector<std::size_t> bases;

  // Shared with the link and control threads.
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> stopping{false};  // set under mu (the waits' predicates read it there)
  std::unordered_map<std::uint64_t, int> reports;  // guarded by mu
  // Staging (above), guarded by mu: the running sums by their range's first iteration,
  // each with the bytes the link threads read from it; the spare; the buffers allocated
  // (sums, iterations aside, spare) now and at most.
  struct StagedRange {
    StagingBuffer sums;
    Bytes read = 0;
  };
  std::map<std::int64_t, StagedRange> staged_ranges;
  std::vector<StagingBuffer> staging_spare;
  std::int64_t staging_buffers = 0, staging_buffers_max = 0;
  std::thread control_rx_thread;
  std::unique_ptr<gloo::transport::UnboundBuffer> report_rx;
  std::unique_ptr<gloo::transport::UnboundBuffer> report_buf;
  ControlMessage report_msg{}, rx_msg{};
  std::deque<ControlMessage> reports_out;  // workers 1..N-1, guarded by mu
  std::thread report_sender;
  ReplicaPolicy* replica = nullptr;  // workers 1..N-1
  bool recording = false;            // worker 0
  std::deque<PolicyRecord> records;  // worker 0, guarded by mu
  RecordBatch send_batch, recv_batch;
  std::unique_ptr<gloo::transport::UnboundBuffer> replica_buf;
  std::thread replication_thread;

  // Loop thread only.
  std::unordered_map<std::uint64_t, CollectiveBucket> delayed_buckets;        // issued, by id
  std::map<std::pair<std::int64_t, std::int64_t>, Progress> merged_progress;  // by range
  std::vector<LayerUpdate> due;  // complete, not yet handed over
  // Staging: iterations whose range this replica does not know yet, each a copy of the
  // layers whose backward ended.
  struct Aside {
    StagingBuffer gradients;
    std::vector<char> layers;
  };
  std::map<std::int64_t, Aside> aside;
  bool training_over = false;
  bool finish_requested = false;  // finish() before training began
  std::int64_t finish_iterations = -1;
  std::int64_t outstanding = 0;
  TimeNs last_done = 0;
  std::vector<Bytes> verified;
  CollectiveMeter meter;
  Bytes run_bytes = 0;
  std::int64_t run_messages = 0;
  std::vector<TraceSpan> trace;
};

CollectiveWorker::CollectiveWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveWorker::~CollectiveWorker() = default;

Result<std::unique_ptr<CollectiveWorker>> CollectiveWorker::create(CollectiveOptions options) {
  QS_RETURN_IF_ERROR(validate_profile(options.job.profile));
  auto impl = std::make_unique<Impl>(std::move(options));
  QS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<CollectiveWorker>(new CollectiveWorker(std::move(impl)));
}

Result<WorkerReport> CollectiveWorker::run() { return impl_->run(); }

void CollectiveWorker::post(std::function<void()> fn) { impl_->loop->post(std::move(fn)); }

void CollectiveWorker::finish(std::int64_t iterations) {
  impl_->loop->post([impl = impl_.get(), iterations] {
    impl->finish_requested = true;
    impl->finish_iterations = iterations;
    if (impl->training) impl->training->finish_early(iterations);
  });
}

void CollectiveWorker::request_stop(const std::string& why) { impl_->loop->request_stop(why); }

void CollectiveWorker::feedback(const TrainingFeedback& f) {
  impl_->loop->post([impl = impl_.get(), f] {
    if (impl->training) impl->training->feedback(f);
  });
}

Result<WorkerReport> run_collective_worker(const CollectiveOptions& options) {
  QS_ASSIGN_OR_RETURN(auto w, CollectiveWorker::create(options));
  return w->run();
}

}  // namespace qs::runtime
