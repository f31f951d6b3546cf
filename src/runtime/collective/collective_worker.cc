// The all-reduce worker (quicksilver/runtime/collective.h): the one training loop over the
// node's event loop (Timer), the emulated GPU or a real one (Compute) and a collective
// engine (Communicator: gloo by default) as the Exchange.
//
// The worker is composed of units that know only the Communicator interface:
//   agreement.h        which bucket each link runs next (worker 0 decides, the others follow)
//   bucket_reducer.h   a link's data path: gather, reduce, scatter, check
//   policy_replica.h   worker 0's policy replayed on the others (timing-dependent policies)
//   gradient_staging.h DeFT's running sums over merged iterations
//   delayed_updates.h  which sums update which layer when (a real model under DeFT)
//   calibration.h      the start-up agreement and each link's a + b*M fit
//   watchdog.h         a stall of the peers detected and named
// and the engine, made once in connect(): gloo_communicator.h, or the caller's.
//
// Threads: the loop thread runs the training loop, the policy and every listener call;
// one thread per link runs that link's collectives, one at a time; the agreement and the
// replication have threads of their own. The link threads touch the tensor buffers only
// for the chunks of the bucket they run, which the loop does not write meanwhile (see
// gradient_staging.h).
#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "../runtime_internal.h"
#include "agreement.h"
#include "bucket_reducer.h"
#include "calibration.h"
#include "delayed_updates.h"
#include "gradient_staging.h"
#include "policy_replica.h"
#include "quicksilver/core/check.h"
#include "quicksilver/core/thread_name.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/runtime/collective.h"
#include "quicksilver/transport/clock.h"
#include "watchdog.h"
#ifdef QS_HAVE_GLOO
#include "gloo_communicator.h"
#endif

namespace qs::runtime {

struct CollectiveWorker::Impl final : CollectiveExchange {
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

  // From any thread: run() fails with `s` (the loop thread records it).
  void fail_later(const Status& s) {
    loop->post([this, s] { loop->fail(s.with_context(name())); });
  }

  // The engine: the caller's, or gloo through the coordinator's store.
  Status connect() {
    if (opts.communicator) {
      QS_ASSIGN_OR_RETURN(comm, opts.communicator());
    } else {
#ifdef QS_HAVE_GLOO
      GlooSettings g;
      g.rank = opts.rank;
      g.workers = opts.job.workers;
      g.store = opts.store;
      g.secret = opts.secret;
      g.connect_timeout = opts.job.connect_timeout;
      g.peer_timeout = opts.job.peer_timeout;
      g.links = opts.links;
      g.algorithm = opts.algorithm;
      g.via_rank = opts.via_rank;
      g.via = opts.via;
      g.log = opts.log;
      QS_ASSIGN_OR_RETURN(comm, connect_gloo(g));
#else
      return internal_error("built without gloo");  // refused by create()
#endif
    }
    if (comm == nullptr || comm->rank() != opts.rank || comm->size() != opts.job.workers ||
        comm->links() != static_cast<int>(opts.links.size())) {
      return invalid_argument(name() + ": the engine's ranks or links differ from the job's");
    }
    return Status::ok();
  }

  Status build() {
    const JobOptions& job = opts.job;
    AllReduceContext ctx;
    ctx.profile = &job.profile;
    ctx.layout = &layout;
    ctx.workers = job.workers;
    // First, on the control channel: the workers' agreement on checksums comes with it,
    // before any collective that uses them.
    QS_ASSIGN_OR_RETURN(ctx.compute_factor, agree_at_start(*comm, name(), opts.compute_factor,
                                                           job.payload_checksums, job.wire_dtype));
    CalibrationSettings cs;
    cs.model_bytes = layout.total_bytes();
    cs.bytes_per_second = job.bandwidth.bytes_per_second();
    cs.repeats = opts.calibration_repeats;
    cs.checksums = job.payload_checksums;
    cs.wire = job.wire_dtype;
    for (int li = 0; li < comm->links(); ++li) {
      std::string sweep;
      QS_ASSIGN_OR_RETURN(AllReduceCost c, calibrate_link(*comm, li, cs, name(), &sweep));
      fits.push_back(c);
      sweeps.push_back(std::move(sweep));
    }
    ctx.links = fits;
    QS_ASSIGN_OR_RETURN(policy, make_allreduce_policy(job.policy, job.policy_options, ctx));
    staged = policy->forward_gate() == ForwardGate::kPolicy;
    delayed = staged && source->delayed_updates() != nullptr;
    if (delayed) {
      updates = std::make_unique<DelayedUpdates>(
          layout, *source->delayed_updates(),
          [this](const Status& s) { loop->fail(s.with_context(name())); });
    }
    own_order = job.workers > 1 && !delayed && policy->communicates() && policy->fixed_order();
    replicate_policy();
    if (staged) {
      staging = std::make_unique<GradientStaging>(
          layout, buffers, [this](std::int64_t it) { return policy->merged_from(it); });
    }
    BucketReducer::Settings rs;
    rs.links = static_cast<int>(opts.links.size());
    rs.workers = job.workers;
    rs.wire = job.wire_dtype;
    rs.checksums = job.payload_checksums;
    rs.check = reducer_checks = opts.verify && opts.tensors == nullptr;
    rs.scatter = !(staged && source == known.get());
    rs.tamper = opts.tamper_received;
    reducer = std::make_unique<BucketReducer>(std::move(rs), *comm, buffers, staging.get(),
                                              delayed ? source->delayed_updates() : nullptr,
                                              [this](const Status& s) { fail_later(s); });
    agreement = std::make_unique<BucketAgreement>(
        *comm, job.payload_checksums, job.peer_timeout, [this](const Status& s) { fail_later(s); },
        own_order);
    return build_loop();
  }

  // Worker 0 decides for all (policy_replica.h): DeFT's knapsacks and ByteScheduler's fusion
  // depend on when each input arrived; delayed updates are handed over at points of its
  // stream (DelayedUpdates::track). A policy whose buckets the job fixes (fixed_order)
  // decides on every worker, and worker 0's stream carries only its iteration starts and
  // end (own_order_policy): a worker whose loop ended apart fails at once (EndWatch).
  void replicate_policy() {
    const JobOptions& job = opts.job;
    if (!((job.workers > 1 && policy->communicates()) || delayed)) return;
    if (own_order) {
      if (opts.rank != 0)
        end_watch = std::make_unique<EndWatch>([this](const Status& s) { fail_later(s); });
      policy = own_order_policy(
          std::move(policy), [this](const PolicyRecord& r) { replication->record(r); },
          end_watch.get());
      recording = opts.rank == 0;
    } else if (opts.rank == 0) {
      policy = std::make_unique<RecordingPolicy>(std::move(policy), [this](const PolicyRecord& r) {
        if (opts.job.workers > 1) replication->record(r);
        if (delayed) updates->track(r);
      });
      recording = job.workers > 1;
    } else {
      auto r = std::make_unique<ReplicaPolicy>(
          std::move(policy), [this] { loop->post([this] { training->recheck_gates(); }); },
          [this](const PolicyRecord& rec) {
            if (delayed) updates->track(rec);
          },
          [this](const Status& s) { fail_later(s); });
      replica = r.get();
      policy = std::move(r);
    }
    if (recording || replica != nullptr || end_watch != nullptr) {
      replication = std::make_unique<ReplicationChannel>(
          *comm, job.payload_checksums, job.peer_timeout,
          [this](std::vector<PolicyRecord> got) {
            loop->post([this, got = std::move(got)] {
              watchdog->heard();  // worker 0 is alive
              for (const PolicyRecord& r : got) {
                if (replica != nullptr) replica->deliver(r);
                if (end_watch == nullptr) continue;
                if (r.kind == kIterationStart) agreement->leader_started(r.iteration);
                end_watch->deliver(r);
              }
            });
          },
          [this](const Status& s) { fail_later(s); });
    }
  }

  Status build_loop() {
    const JobOptions& job = opts.job;
    QS_ASSIGN_OR_RETURN(
        device, make_compute(opts.compute, *timer, job.profile, opts.compute_factor, *source,
                             opts.record_trace ? &trace : nullptr, opts.rank));
    if (staged) staging_compute = std::make_unique<StagingCompute>(*staging, *device);
    LoopOptions lo;
    lo.iterations = job.iterations;
    lo.start_on_first_gradient = static_cast<bool>(opts.compute);  // a real model's run
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
    Compute& compute = staged ? *staging_compute : *device;
    training = std::make_unique<TrainingLoop>(job.profile, layout, *policy, *timer, compute, *this,
                                              std::move(lo));
    watchdog = std::make_unique<PeerWatchdog>(*loop, job.peer_timeout, opts.rank, job.workers,
                                              [this] { return watch(); });
    return Status::ok();
  }

  // ---- the Exchange (loop thread) ----
  void all_reduce(const CollectiveBucket& b) override {
    // The policy issued it, so it knows the range of every iteration the bucket carries.
    if (staged) staging->settle();
    if (delayed) updates->issued(b);
    ++outstanding;
    agreement->issued(b);
  }
  void flush() override {}
  Status check(const CollectiveBucket& b) const override {
    if (b.link < 0 || b.link >= static_cast<int>(opts.links.size())) {
      return internal_error("policy used link " + std::to_string(b.link) + " of " +
                            std::to_string(opts.links.size()));
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

  // A collective ended (posted to the loop thread by a link thread).
  void completed(int li, const CollectiveBucket& b, TimeNs t0, TimeNs t1) {
    --outstanding;
    watchdog->heard();
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
  void link_thread(int li) {
    try {
      while (std::optional<CollectiveBucket> b = agreement->next(li)) {
        TimeNs t0 = 0, t1 = 0;
        if (!reducer->run(li, *b, &t0, &t1)) continue;  // a wrong sum: the job fails
        loop->post([this, li, b = std::move(*b), t0, t1] {
          if (reducer_checks) {
            if (verified.size() <= static_cast<std::size_t>(b.last_iteration))
              verified.resize(static_cast<std::size_t>(b.last_iteration) + 1, 0);
            for (std::int64_t it = b.first_iteration; it <= b.last_iteration; ++it)
              verified[static_cast<std::size_t>(it)] += b.bytes();
          }
          completed(li, b, t0, t1);
        });
      }
    } catch (const std::exception& ex) {
      if (stopping) return;
      fail_later(unavailable("link " + std::to_string(li) + ": " + ex.what()));
    }
  }

  void start_threads() {
    agreement->start();
    if (replication) replication->start();
    for (int li = 0; li < comm->links(); ++li)
      link_threads.emplace_back([this, li] {
        name_this_thread("qs-link" + std::to_string(li));
        link_thread(li);
      });
  }

  void stop_threads() {
    if (stopping.exchange(true)) return;
    if (agreement) agreement->request_stop();
    // Blocked waits are interrupted until their thread has left (an interruption before
    // the wait began is kept for the next wait).
    for (std::size_t li = 0; li < link_threads.size(); ++li) {
      while (link_threads[li].joinable()) {
        agreement->interrupt(static_cast<int>(li));
        link_threads[li].join();
      }
    }
    if (replication) replication->stop();
    if (agreement) agreement->stop();
  }

  bool done() const {
    return training->finished() && outstanding == 0 &&
           (replica == nullptr || replica->complete()) &&
           (end_watch == nullptr || end_watch->complete());
  }

  PeerWatchdog::State watch() const {
    PeerWatchdog::State s;
    s.done = done();
    s.on_peers = outstanding > 0 || training->blocked() || training->finished();
    s.waiting_for = outstanding > 0      ? std::to_string(outstanding) + " buckets outstanding"
                    : replica != nullptr ? "waiting for worker 0's decisions"
                                         : "waiting for the other workers";
    s.iteration = training->iteration();
    return s;
  }

  // A policy's QS_CHECK, the engine, or memory may throw: an error of this worker, never
  // std::terminate in the caller's process (a Python interpreter).
  Result<WorkerReport> run() {
    Result<WorkerReport> r = internal_error("unset");
    try {
      r = run_inner();
    } catch (const std::exception& e) {
      r = internal_error(name() + ": " + e.what());
    }
    if (!r.is_ok()) {
      stop_threads();
      // A failed worker's connections close as it fails, not when its owner lets it go
      // (a Python traceback can hold the session until the interpreter ends): a peer
      // waiting on it fails at once, naming it.
      if (comm) comm->close();
    }
    return r;
  }

  Result<WorkerReport> run_inner() {
    QS_RETURN_IF_ERROR(connect());
    QS_RETURN_IF_ERROR(build());
    start_threads();
    watchdog->start();
    on_done_listener = training.get();
    training->start();
    if (finish_requested) training->finish_early(finish_iterations);
    // Until the last collective (those a policy issues at the end of training) is back,
    // and on a replica, until worker 0's last decision was applied.
    Status s = loop->run([this] { return done(); });
    if (s.is_ok() && recording) replication->end_stream();
    if (s.is_ok()) s = training->check_complete().with_context(name());
    if (s.is_ok()) {
      // Nobody tears its connections down while a peer still reads from them.
      try {
        comm->barrier();
      } catch (const std::exception& e) {
        s = unavailable(name() + ": final barrier: " + e.what() +
                        " (a worker that failed closes its connections: its own error says why)");
      }
    }
    stop_threads();
    if (!s.is_ok()) return s;
    return make_report();
  }

  Result<WorkerReport> make_report() const;

  CollectiveOptions opts;
  TensorLayout layout;
  std::unique_ptr<transport::EventLoop> loop;
  TensorSource* source = nullptr;
  std::unique_ptr<KnownContent> known;
  std::vector<TensorBuffer> buffers;
  std::unique_ptr<Communicator> comm;
  std::vector<AllReduceCost> fits;
  std::vector<std::string> sweeps;  // the calibration's times, per link (report notes)
  std::unique_ptr<AllReducePolicy> policy;
  std::unique_ptr<LoopTimer> timer;
  std::unique_ptr<Compute> device;
  std::unique_ptr<StagingCompute> staging_compute;
  std::unique_ptr<TrainingLoop> training;
  std::unique_ptr<PeerWatchdog> watchdog;
  ExchangeListener* on_done_listener = nullptr;
  bool staged = false;   // the policy gates forward passes (DeFT): gradients are staged
  bool delayed = false;  // staged, and the source applies the updates
  std::unique_ptr<GradientStaging> staging;
  std::unique_ptr<DelayedUpdates> updates;
  std::unique_ptr<BucketAgreement> agreement;
  std::unique_ptr<ReplicationChannel> replication;
  ReplicaPolicy* replica = nullptr;  // workers 1..N-1
  bool own_order = false;  // the agreement runs each worker's own order (EndWatch: 1..N-1)
  std::unique_ptr<EndWatch> end_watch;
  bool recording = false;  // worker 0 with others to replicate to
  std::vector<std::thread> link_threads;
  std::unique_ptr<BucketReducer> reducer;
  bool reducer_checks = false;  // known content: every sum checked (iterations_verified)
  std::atomic<bool> stopping{false};

  // Loop thread only.
  bool finish_requested = false;  // finish() before training began
  std::int64_t finish_iterations = -1;
  std::int64_t outstanding = 0;
  std::vector<Bytes> verified;
  CollectiveMeter meter;
  Bytes run_bytes = 0;
  std::int64_t run_messages = 0;
  std::vector<TraceSpan> trace;
};

// The run's figures, its fits and the policy's notes (the threads are joined).
Result<WorkerReport> CollectiveWorker::Impl::make_report() const {
  WorkerReport r;
  r.worker_id = opts.rank;
  r.policy = opts.job.policy;
  r.congestion_control = "gloo " + std::string(gloo_algorithm_name(opts.algorithm));
  r.push_end = "collective";
  // A job of one pass has no whole iteration (a PyTorch loop of one step, or a session
  // policy="auto" closed after one): a report without figures.
  if (training->records().empty()) return r;
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
  r.staging_buffers_max = staging ? staging->buffers_max() : 0;
  return r;
}

CollectiveWorker::CollectiveWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveWorker::~CollectiveWorker() = default;

Result<std::unique_ptr<CollectiveWorker>> CollectiveWorker::create(CollectiveOptions options) {
  QS_RETURN_IF_ERROR(validate_profile(options.job.profile));
  if (!options.communicator && !have_gloo()) {
    return invalid_argument(
        "this quicksilver was built without gloo (configure with -DQS_WITH_GLOO=ON; Debian: "
        "libgloo-dev)");
  }
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
