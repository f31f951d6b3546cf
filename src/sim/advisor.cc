#include "quicksilver/sim/advisor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "quicksilver/policy/registry.h"
#include "quicksilver/sim/simulator.h"

namespace qs {
namespace {

// The byte sizes the search may reach, `quicksilver tune`'s range: smaller units cost
// per-unit overheads the simulator's link model does not charge, and make every
// simulation slower.
constexpr Bytes kMinTuned = 64 * kKiB;
constexpr Bytes kMaxTuned = 64 * kMiB;

// The knobs the search varies: the policy's byte sizes that scale with the tensors
// (partitions, credits, slices, buckets: Knob::scales). Left as given: Mercury's packet (a
// transport parameter, the paper's fixed size), flags and times (what they change is not
// the schedule's speed alone), and the PS placement's split threshold (every policy's:
// the servers' balance).
// Two policies plan their own partitions, and their plans cost far more than a simulation
// of the others at small sizes: US-Byte's unequal partitions (ResNet-18 on 4 workers at
// 64 KiB: 2 s a simulation, against milliseconds at its default) and DeFT's knapsack.
// They are ranked with their own knobs.
}  // namespace

std::vector<const Knob*> tuned_knobs(const PolicySpec& spec) {
  std::vector<const Knob*> out;
  if (spec.delays_updates || spec.name == "usbyte") return out;
  for (const std::string& name : spec.knobs) {
    const Knob* k = policy_registry().find_knob(name);
    if (k == nullptr || name == "split_threshold") continue;
    if (k->type == KnobType::kBytes && k->scales) out.push_back(k);
  }
  return out;
}

namespace {

// A job larger than this is swept on a proxy of kProxyWorkers workers: every simulation
// of a PS job costs in proportion to N x its units, and VGG-16's defaults alone take about
// 15 s of CPU at 256 workers (docs/benchmarks.md).
constexpr int kProxyAbove = 32;
constexpr int kProxyWorkers = 16;
// The search goes further on a PS job: a job of more than 4 workers is searched on 4, with
// its own servers up to 16 (a search simulates 40 to 70 points, most at partitions far
// below the defaults, and a 4-worker simulation costs a quarter of a 16-worker one). Keeping
// the servers keeps the job's placement slices: the same units per worker and the same
// bytes per worker link. A job of up to 32 workers then has its pick finished on itself
// (PolicySearch::finish). The picks stay within 2 % of the full tuner's on the benchmark
// set (bench/advise_bench.sh, docs/benchmarks.md). All-reduce jobs are searched on
// themselves: their simulations cost milliseconds, and the ring's and tree's steps depend
// on the worker count.
constexpr int kSearchProxyAbove = 4;
constexpr int kSearchProxyWorkers = 4;

// The proxy: `workers` workers (kProxyWorkers), the same rates and latency, and either as
// many servers per worker as the job (so each link carries the same bytes per iteration as
// the job's) or the job's servers up to `max_servers`. What it does not keep: the job's
// incast fan-in (and, scaled, its finer placement slices); so the search only picks the
// knobs there, and the pick is simulated on the job itself. Hosts of unequal rates are not
// proxied.
ClusterConfig proxy_cluster(const ClusterConfig& c, int above = kProxyAbove,
                            int workers = kProxyWorkers, int max_servers = 0) {
  if (c.workers <= above || !c.worker_bandwidth.empty() || !c.server_bandwidth.empty() ||
      !c.server_shares.empty()) {
    return c;
  }
  ClusterConfig p = c;
  p.servers = max_servers > 0
                  ? std::min(c.servers, max_servers)
                  : std::max<int>(1, static_cast<int>(std::lround(static_cast<double>(workers) *
                                                                  c.servers / c.workers)));
  p.workers = workers;
  return p;
}

// The search's simulations: the warm-up and two measured iterations (the steady state of
// a deterministic simulation is reached by then); the pick is simulated again with the
// job's own options, so that its prediction is what `simulate` would print.
SimOptions search_options(const SimOptions& job) {
  SimOptions s = job;
  s.iterations = std::min(job.iterations, job.warmup + 2);
  return s;
}

// `o` for a simulation whose only question is whether it beats `best`: it stops once its
// statistic is known to be at least that (SimOptions::stop_at_least; kTimeNever, or `stop`
// false: no bound), and then reports `best`, which a strict comparison with the best so far
// (never larger than `best`) rejects as it would the whole run's time. Exact: the search
// takes the same path, and every point it keeps was simulated whole.
SimOptions beating(SimOptions o, TimeNs best, bool stop) {
  o.stop_at_least = best == kTimeNever || !stop ? 0 : best;
  return o;
}

// Whether a run on the job's cluster may stop once it repeats an iteration exactly
// (SimOptions::stop_when_steady): a deterministic simulation that does is taken to have
// reached its steady state (every zoo profile's policy does by its second measured
// iteration but a few on ResNet-50 at 256 workers, which then run whole:
// docs/benchmarks.md "advise"), and the job's statistic of its remaining iterations is that
// same value. Policies that delay updates (their merged iterations alternate) and
// time-varying rates (no two iterations alike) need the whole run.
bool steady_applies(const Job& job, const PolicySpec& spec) {
  return (!job.cluster.schedule || job.cluster.schedule->is_constant()) && !spec.delays_updates;
}

// Whether `r`, a simulation of the job's cluster for `short_run.iterations` iterations,
// gives the job's own prediction: it ran the job's iterations, or it ran the warm-up and two
// more and those two are equal to the nanosecond (steady_applies).
bool is_jobs_prediction(const Job& job, const PolicySpec& spec, const SimOptions& short_run,
                        const SimResult& r) {
  if (short_run.iterations >= job.sim.iterations) return !r.at_least;
  const auto& t = r.iteration_times;
  return !r.at_least && steady_applies(job, spec) && short_run.iterations == job.sim.warmup + 2 &&
         t.size() == static_cast<std::size_t>(short_run.iterations) &&
         t[t.size() - 1] == t[t.size() - 2];
}

// A point simulated on the job itself, as `simulate` would predict it, at less cost: the
// run stops once it repeats an iteration (steady_applies; the same prediction as a run of
// the warm-up and two more iterations whose last two are equal, without simulating those
// again when they are not), or once it is known not to beat `beat` (beating(); `stop`).
Result<SimResult> simulate_job(const Job& job, const PolicySpec& spec, const PolicyOptions& o,
                               TimeNs beat = kTimeNever, bool stop = false) {
  SimOptions s = beating(job.sim, beat, stop);
  s.stop_when_steady = steady_applies(job, spec);
  return simulate(job.profile, spec.name, o, job.cluster, s);
}

Bytes clamp_size(double v) {
  const auto b = static_cast<Bytes>(std::llround(v / 4.0)) * 4;  // whole float32 elements
  return std::clamp<Bytes>(b, kMinTuned, kMaxTuned);
}

// Runs fn(i) for i in [0, n) on `threads` threads; each thread calls `done` when no i is
// left for it (if given).
void parallel_for(int n, int threads, const std::function<void(int)>& fn,
                  const std::function<void()>& done = {}) {
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < n; i = next++) fn(i);
    if (done) done();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, n); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

// The threads of AdviseOptions::threads that no policy's search occupies (one policy's
// search is sequential, and the dearest, bytescheduler's, outlasts the others together):
// a search lends them its independent points, a knob's scan and a finishing step's two
// directions.
class IdleThreads {
 public:
  explicit IdleThreads(int idle) : idle_(idle) {}
  void add() { ++idle_; }
  // Runs fn(i) for i in [0, n) on the calling thread and on every idle thread it can take
  // (at most n - 1). `speculative`: only when at least one is idle (false: not run).
  bool run(int n, const std::function<void(int)>& fn, bool speculative) {
    int taken = 0;
    for (int v = idle_.load(); taken < n - 1 && v > 0;) {
      if (idle_.compare_exchange_weak(v, v - 1)) {
        ++taken;
        v = idle_.load();
      }
    }
    if (speculative && taken == 0) return false;
    parallel_for(n, taken + 1, fn);
    idle_ += taken;
    return true;
  }

 private:
  std::atomic<int> idle_;
};

// One policy's search: a coarse scan of each tuned knob, then a pattern search in log2 of
// them (each alone, then all together), steps of 4x then 2x, at most two passes, every
// point simulated once (memo). A point is kept only when strictly faster, so ties keep
// the default.
class PolicySearch {
 public:
  PolicySearch(const Job& job, const PolicySpec& spec, IdleThreads* idle, bool stop_losers)
      : job_(job),
        spec_(spec),
        idle_(idle),
        stop_losers_(stop_losers),
        knobs_(tuned_knobs(spec)),
        search_(search_options(job.sim)),
        proxy_(
            job.cluster.architecture == Architecture::kPs
                ? proxy_cluster(job.cluster, kSearchProxyAbove, kSearchProxyWorkers, kProxyWorkers)
                : proxy_cluster(job.cluster)) {}

  // The default point with the job's options; an error when the job refuses it.
  Status start() {
    best_options_ = job_.policy_options;
    auto r = simulate_job(job_, spec_, best_options_);
    ++simulations_;
    if (!r) return r.status();
    default_time_ = r->iteration_time;
    compute_time_ = r->compute_time;
    return Status::ok();
  }

  // The search, then the pick with the job's own options: kept only when faster than the
  // defaults there too.
  void tune() {
    best_time_ = default_time_;
    if (knobs_.empty()) return;  // nothing to search: the defaults are the pick
    const PolicyOptions defaults = best_options_;
    best_time_ = eval(best_options_, kTimeNever);
    // A coarse scan of each knob alone over the whole range first (the landscape is not
    // convex: bytescheduler's best partition may sit far below its default with a credit
    // far below its own), then the pattern search from the best point found.
    for (const Knob* k : knobs_) scan(*k);
    for (int pass = 0; pass < 2; ++pass) {
      bool moved = false;
      // Each knob alone, then all together: a partition and its credit move along a ridge
      // (credit = partition x 2^k, as `tune`'s grid has it) that single moves cannot follow.
      for (const Knob* k : knobs_) moved |= tune_direction({k});
      if (knobs_.size() > 1) moved |= tune_direction(knobs_);
      if (!moved) break;
    }
    // The finishing already simulated its pick on the job: when that was the job's own
    // prediction, it is not simulated again.
    std::optional<TimeNs> full_known;
    if (proxy_.workers != job_.cluster.workers && job_.cluster.workers <= kProxyAbove) {
      full_known = finish();
    }
    TimeNs full = default_time_;
    if (key(best_options_) != key(defaults) && full_known) {
      full = *full_known;
    } else if (key(best_options_) != key(defaults)) {
      // Kept only when faster than the defaults: the run stops once it cannot be.
      auto r = simulate_job(job_, spec_, best_options_, default_time_, stop_losers_);
      count(r);
      if (r) full = r->iteration_time;
    }
    if (full < default_time_) {
      best_time_ = full;
    } else {
      best_options_ = defaults;
      best_time_ = default_time_;
    }
  }

  AdvisedPolicy result() const {
    AdvisedPolicy a;
    a.policy = spec_.name;
    a.options = best_options_;
    for (const Knob* k : knobs_) a.knobs.emplace_back(k->name, k->display(best_options_));
    a.iteration_time = best_time_;
    a.default_time = default_time_;
    a.simulations = simulations_;
    a.stopped = stopped_;
    return a;
  }
  TimeNs compute_time() const { return compute_time_; }

 private:
  SimOptions bounded(TimeNs best) const { return beating(search_, best, stop_losers_); }
  void count(const Result<SimResult>& r) {
    ++simulations_;
    if (r && r->at_least) ++stopped_;
  }

  std::vector<Bytes> key(const PolicyOptions& o) const {
    std::vector<Bytes> k;
    for (const Knob* knob : knobs_) k.push_back(knob->get_int(o));
    return k;
  }

  // The time of `o` (kTimeNever where the policy or the simulator refuses it), or `best`
  // when it is known not to beat it (beating()).
  TimeNs eval(const PolicyOptions& o, TimeNs best) {
    const auto k = key(o);
    if (auto it = memo_.find(k); it != memo_.end()) return it->second;
    auto r = simulate(job_.profile, spec_.name, o, proxy_, bounded(best));
    count(r);
    const TimeNs t = r ? r->iteration_time : kTimeNever;
    memo_.emplace(k, t);
    return t;
  }

  // Simulates the points of `points` not simulated yet, together on idle threads (see
  // IdleThreads::run; `speculative`: points the caller may not need, only when a thread
  // is idle), into `memo`, simulated on `cluster`, each only as far as it takes to know
  // whether it beats `best`. The caller then reads them in its own order, so the search's
  // path is the sequential one.
  template <typename Value, typename Make>
  void prefetch(const std::vector<PolicyOptions>& points, std::map<std::vector<Bytes>, Value>* memo,
                const ClusterConfig& cluster, TimeNs best, bool speculative, Make make) {
    if (idle_ == nullptr) return;
    std::vector<const PolicyOptions*> todo;
    std::vector<std::vector<Bytes>> keys;
    for (const PolicyOptions& o : points) {
      auto k = key(o);
      if (memo->count(k) == 0 && std::find(keys.begin(), keys.end(), k) == keys.end()) {
        todo.push_back(&o);
        keys.push_back(std::move(k));
      }
    }
    if (todo.size() < 2) return;  // one point: the sequential path simulates it
    std::vector<std::optional<Result<SimResult>>> out(todo.size());
    const bool ran = idle_->run(
        static_cast<int>(todo.size()),
        [&](int i) {
          const auto u = static_cast<std::size_t>(i);
          out[u] = simulate(job_.profile, spec_.name, *todo[u], cluster, bounded(best));
        },
        speculative);
    if (!ran) return;
    for (std::size_t i = 0; i < todo.size(); ++i) {
      count(*out[i]);
      memo->emplace(keys[i], make(*out[i]));
    }
  }
  void prefetch_proxy(const std::vector<PolicyOptions>& points) {
    prefetch(points, &memo_, proxy_, best_time_, false,
             [](const Result<SimResult>& r) { return r ? r->iteration_time : kTimeNever; });
  }

  // The proxy's pick finished on the job itself: each window knob alone doubled or halved
  // while that is faster there, at most kFinishSimulations points. What the proxy misses
  // is a window that must grow with the fan-in (bytescheduler's credit: at 16 workers
  // ResNet-50 wants 4 MiB where 4 workers want 512 KiB); the sizes that cut the gradients
  // into units (Knob::cuts: partitions, slices) carry over from the proxy, and the job's
  // simulations at small units are the search's dearest (VGG-16 at 16 workers and 64 KiB
  // partitions: 0.2 s each, against 0.01 s at the defaults), so they are left as the proxy
  // picked them. Returns the pick's time when its simulation there is the job's own
  // prediction (is_jobs_prediction); none when the policy has no window to finish.
  std::optional<TimeNs> finish() {
    static constexpr int kFinishSimulations = 6;
    std::vector<const Knob*> windows;
    for (const Knob* k : knobs_) {
      if (!k->cuts) windows.push_back(k);
    }
    if (windows.empty()) return std::nullopt;
    std::map<std::vector<Bytes>, JobPoint>& seen = finish_memo_;
    auto job_point = [&](const Result<SimResult>& r) {
      return JobPoint{r ? r->iteration_time : kTimeNever,
                      r && is_jobs_prediction(job_, spec_, search_, *r)};
    };
    auto on_job = [&](const PolicyOptions& o, TimeNs beat) {
      const auto k = key(o);
      if (auto it = seen.find(k); it != seen.end()) return it->second.time;
      auto r = simulate(job_.profile, spec_.name, o, job_.cluster, bounded(beat));
      count(r);
      const JobPoint p = job_point(r);
      seen.emplace(k, p);
      return p.time;
    };
    TimeNs best = on_job(best_options_, kTimeNever);
    for (bool moved = true; moved && static_cast<int>(seen.size()) < kFinishSimulations;) {
      moved = false;
      for (const Knob* k : windows) {
        // Both directions at once when a thread is idle (the second is simulated in vain
        // when the first is faster).
        if (static_cast<int>(seen.size()) + 2 <= kFinishSimulations) {
          std::vector<PolicyOptions> both;
          for (const double f : {2.0, 0.5}) {
            PolicyOptions o = best_options_;
            k->set_int(&o, clamp_size(static_cast<double>(k->get_int(best_options_)) * f));
            both.push_back(o);
          }
          prefetch(both, &seen, job_.cluster, best, true, job_point);
        }
        for (const double f : {2.0, 0.5}) {
          if (static_cast<int>(seen.size()) >= kFinishSimulations) break;
          PolicyOptions o = best_options_;
          const Bytes v = clamp_size(static_cast<double>(k->get_int(best_options_)) * f);
          if (v == k->get_int(best_options_)) continue;
          k->set_int(&o, v);
          const TimeNs t = on_job(o, best);
          if (t < best) {
            best = t;
            best_options_ = o;
            moved = true;
            break;
          }
        }
      }
    }
    const JobPoint& pick = seen.at(key(best_options_));
    if (pick.jobs && pick.time != kTimeNever) return pick.time;
    return std::nullopt;
  }

  // Tries `k` at every power of 4 times kMinTuned up to kMaxTuned (6 points), the others
  // held; keeps the fastest.
  void scan(const Knob& k) {
    std::vector<PolicyOptions> points;
    for (Bytes v = kMinTuned; v <= kMaxTuned; v *= 4) {
      points.push_back(best_options_);
      k.set_int(&points.back(), v);
    }
    // Each point differs from the best so far in k alone, which it sets: the same points
    // whichever of them turns out the best.
    prefetch_proxy(points);
    for (Bytes v = kMinTuned; v <= kMaxTuned; v *= 4) {
      if (v == k.get_int(best_options_)) continue;
      PolicyOptions o = best_options_;
      k.set_int(&o, v);
      const TimeNs t = eval(o, best_time_);
      if (t < best_time_) {
        best_time_ = t;
        best_options_ = o;
      }
    }
  }

  // Moves the knobs of `direction` together (each scaled by the same factor) while that
  // is faster: 4x steps in the better direction, then one 2x step each way. True when it
  // moved.
  bool tune_direction(const std::vector<const Knob*>& direction) {
    bool moved = false;
    for (const double step : {4.0, 2.0}) {
      for (bool improving = true; improving;) {
        improving = false;
        for (const double f : {step, 1 / step}) {
          PolicyOptions o = best_options_;
          bool changed = false;
          for (const Knob* k : direction) {
            const Bytes v = clamp_size(static_cast<double>(k->get_int(best_options_)) * f);
            changed |= v != k->get_int(best_options_);
            k->set_int(&o, v);
          }
          if (!changed) continue;
          const TimeNs t = eval(o, best_time_);
          if (t < best_time_) {
            best_time_ = t;
            best_options_ = o;
            improving = moved = true;
            break;
          }
        }
        if (step == 2.0) break;  // the fine step is tried once
      }
    }
    return moved;
  }

  const Job& job_;
  const PolicySpec& spec_;
  IdleThreads* idle_;
  const bool stop_losers_;
  const std::vector<const Knob*> knobs_;
  const SimOptions search_;    // the search's (search_options)
  const ClusterConfig proxy_;  // the search's cluster (proxy_cluster)
  PolicyOptions best_options_;
  TimeNs best_time_ = kTimeNever, default_time_ = kTimeNever, compute_time_ = 0;
  std::map<std::vector<Bytes>, TimeNs> memo_;  // the proxy's points
  struct JobPoint {
    TimeNs time;
    bool jobs;  // the job's own prediction (is_jobs_prediction)
  };
  std::map<std::vector<Bytes>, JobPoint> finish_memo_;  // the job's points (finish)
  int simulations_ = 0, stopped_ = 0;
};

Rate scaled(Rate r, double f) {
  return Rate{std::llround(static_cast<double>(r.bits_per_second) * f)};
}

ClusterConfig with_bandwidth(ClusterConfig c, double f) {
  c.bandwidth = scaled(c.bandwidth, f);
  for (auto* rates : {&c.worker_bandwidth, &c.server_bandwidth}) {
    for (Rate& r : *rates) r = scaled(r, f);
  }
  if (c.schedule) c.schedule = c.schedule->scaled(f);
  return c;
}

std::string knob_text(const AdvisedPolicy& p) {
  std::string s;
  for (const auto& [name, value] : p.knobs) s += (s.empty() ? "" : ", ") + name + " " + value;
  return s.empty() ? p.policy : p.policy + " (" + s + ")";
}

// The sweep: the top candidates, with their tuned knobs, at other bandwidths and worker
// counts (not re-tuned: what the pick is sensitive to, not a new search).
void sweep(const Job& job, const AdviseOptions& o, Advice* advice) {
  const std::size_t top = std::min<std::size_t>(3, advice->ranking.size());
  struct Point {
    std::string varied;
    double factor;
    std::string value;
    ClusterConfig cluster;
  };
  std::vector<Point> points;
  // A large job is swept on its proxy (there are no worker-count points then).
  const ClusterConfig base = proxy_cluster(job.cluster);
  const bool proxied = base.workers != job.cluster.workers;
  for (const double f : {0.1, 0.3, 3.0, 10.0}) {
    ClusterConfig c = with_bandwidth(base, f);
    if (c.bandwidth.bits_per_second < 1'000'000) continue;
    points.push_back({"bandwidth", f, format_rate(c.bandwidth), std::move(c)});
  }
  for (const int w : {job.cluster.workers / 2, job.cluster.workers * 2}) {
    if (proxied || w < 2 || w > 2 * kProxyAbove || w == job.cluster.workers) continue;
    ClusterConfig c = job.cluster;
    c.workers = w;
    c.worker_bandwidth.clear();
    points.push_back(
        {"workers", static_cast<double>(w) / job.cluster.workers, std::to_string(w), std::move(c)});
  }
  // Latency per message (MG-WFBP's alpha): what favours fewer, larger messages.
  const TimeNs l = job.cluster.latency;
  for (const TimeNs lat : {l > 0 ? l / 10 : 100 * kNsPerUs, l > 0 ? l * 10 : kNsPerMs}) {
    if (lat == l || lat <= 0) continue;
    ClusterConfig c = base;
    c.latency = lat;
    points.push_back({"latency", l > 0 ? static_cast<double>(lat) / static_cast<double>(l) : 0,
                      format_time(lat), std::move(c)});
  }
  // The warm-up and one measured iteration: a sweep point tells who leads, roughly.
  SimOptions sweep_options = job.sim;
  sweep_options.iterations = std::min(job.sim.iterations, job.sim.warmup + 1);
  // The pick first at every point, then the others only as far as it takes to know whether
  // they beat it there (beating(): a run that cannot reports the pick's time, which the
  // strict comparison below rejects).
  std::vector<TimeNs> times(points.size() * top, kTimeNever);
  std::atomic<int> stopped{0};
  auto simulate_candidate = [&](std::size_t p, std::size_t c, TimeNs beat) {
    const AdvisedPolicy& a = advice->ranking[c];
    auto r = simulate(job.profile, a.policy, a.options, points[p].cluster,
                      beating(sweep_options, beat, o.stop_losers));
    if (r) times[p * top + c] = r->iteration_time;
    if (r && r->at_least) ++stopped;
  };
  parallel_for(static_cast<int>(points.size()), o.threads,
               [&](int p) { simulate_candidate(static_cast<std::size_t>(p), 0, kTimeNever); });
  const int others = static_cast<int>(points.size() * (top - 1));
  parallel_for(others, o.threads, [&](int i) {
    const auto p = static_cast<std::size_t>(i) / (top - 1);
    simulate_candidate(p, 1 + static_cast<std::size_t>(i) % (top - 1), times[p * top]);
  });
  advice->simulations += static_cast<int>(times.size());
  advice->stopped += stopped;
  const std::string pick = advice->ranking.front().policy;
  for (std::size_t p = 0; p < points.size(); ++p) {
    std::size_t best = 0;
    for (std::size_t c = 1; c < top; ++c) {
      if (times[p * top + c] < times[p * top + best]) best = c;
    }
    if (times[p * top + best] == kTimeNever) continue;
    advice->sweep.push_back({points[p].varied, points[p].factor, points[p].value,
                             advice->ranking[best].policy, times[p * top + best]});
  }
  // The pick's unbroken run of swept rates around the job's, and who leads past each end.
  std::vector<const SensitivityPoint*> down, up;  // nearest to the job's rate first
  for (const SensitivityPoint& s : advice->sweep) {
    if (s.varied == "bandwidth") (s.factor < 1 ? down : up).push_back(&s);
  }
  std::sort(down.begin(), down.end(), [](auto* a, auto* b) { return a->factor > b->factor; });
  std::sort(up.begin(), up.end(), [](auto* a, auto* b) { return a->factor < b->factor; });
  auto run = [&](const std::vector<const SensitivityPoint*>& side, std::string* end,
                 std::string* other) {
    for (const SensitivityPoint* s : side) {
      if (s->best != pick) {
        for (const AdvisedPolicy& a : advice->ranking) {
          if (a.policy == s->best) *other = knob_text(a) + " at " + s->value;
        }
        return;
      }
      *end = s->value;
    }
  };
  std::string lo = format_rate(job.cluster.bandwidth), hi = lo, below_who, above_who;
  run(down, &lo, &below_who);
  run(up, &hi, &above_who);
  std::string line =
      lo == hi ? pick + " leads at " + lo + " only" : pick + " stays best from " + lo + " to " + hi;
  if (!below_who.empty()) line += "; below, " + below_who;
  if (!above_who.empty()) line += "; above, " + above_who;
  if (below_who.empty() && above_who.empty()) line += " (the whole sweep, 0.1x to 10x)";
  if (proxied) {
    line += " (swept on a " + std::to_string(base.workers) + "-worker proxy of this job)";
  }
  advice->sensitivity.push_back(line);
  for (const SensitivityPoint& s : advice->sweep) {
    if (s.varied == "bandwidth") continue;
    advice->sensitivity.push_back("with " + s.value +
                                  (s.varied == "workers" ? " workers" : " latency") + ": " +
                                  s.best + (s.best == pick ? "" : " leads instead"));
  }
}

}  // namespace

Result<Advice> advise(const Job& job, const AdviseOptions& o) {
  if (o.threads < 1) return invalid_argument("advise: threads must be >= 1");
  const Architecture arch = job.cluster.architecture;
  Advice advice;
  std::vector<const PolicySpec*> specs;
  for (const std::string& name : policy_registry().names(arch)) {
    const PolicySpec* spec = policy_registry().find(name, arch);
    if (spec == nullptr || !spec->communicates) continue;
    if (spec->delays_updates && !o.allow_stale) {
      advice.notes.push_back(name +
                             ": left out, its delayed updates change the optimisation (give "
                             "--allow-stale to rank it)");
      continue;
    }
    specs.push_back(spec);
  }
  IdleThreads idle(std::max(0, o.threads - static_cast<int>(specs.size())));
  std::vector<std::unique_ptr<PolicySearch>> searches;
  for (const PolicySpec* s : specs)
    searches.push_back(std::make_unique<PolicySearch>(job, *s, &idle, o.stop_losers));
  // The searches with knobs to tune first (the longest first: each is sequential), then
  // the defaults-only policies fill the other threads.
  std::vector<std::size_t> order(searches.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return tuned_knobs(*specs[a]).size() > tuned_knobs(*specs[b]).size();
  });
  std::vector<Status> started(searches.size());
  std::mutex progress_mu;
  parallel_for(
      static_cast<int>(searches.size()), o.threads,
      [&](int j) {
        const std::size_t i = order[static_cast<std::size_t>(j)];
        PolicySearch& s = *searches[i];
        started[i] = s.start();
        if (started[i].is_ok()) s.tune();
        if (o.progress) {
          const AdvisedPolicy r = s.result();
          std::lock_guard<std::mutex> lock(progress_mu);
          o.progress(r.policy + ": " + std::to_string(r.simulations) + " simulations");
        }
      },
      [&] { idle.add(); });
  for (std::size_t i = 0; i < searches.size(); ++i) {
    AdvisedPolicy r = searches[i]->result();
    advice.simulations += r.simulations;
    advice.stopped += r.stopped;
    if (!started[i].is_ok()) {
      advice.notes.push_back(r.policy + ": left out, this job refuses its knobs (" +
                             started[i].message() + ")");
      continue;
    }
    advice.bound = searches[i]->compute_time();
    advice.ranking.push_back(std::move(r));
  }
  if (advice.ranking.empty()) {
    std::string why;
    for (const std::string& n : advice.notes) why += "; " + n;
    return invalid_argument("advise: no policy of this architecture can run this job" + why);
  }
  // Fastest first; equal times keep the registry's rank (stable sort of rank order).
  std::stable_sort(advice.ranking.begin(), advice.ranking.end(),
                   [](const AdvisedPolicy& a, const AdvisedPolicy& b) {
                     return a.iteration_time < b.iteration_time;
                   });
  if (o.sensitivity && advice.ranking.size() > 1) sweep(job, o, &advice);
  return advice;
}

}  // namespace qs
