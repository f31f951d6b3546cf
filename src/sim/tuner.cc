#include "quicksilver/sim/tuner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "quicksilver/core/check.h"

namespace qs {
namespace {

// A size as the policies cut it: a multiple of 4 bytes (fp32 alignment), at least 4.
Bytes to_size(double v) {
  const auto b = static_cast<Bytes>(std::llround(v / 4.0)) * 4;
  return std::max<Bytes>(4, b);
}

struct Point {
  Bytes part = 0;
  Bytes credit = 0;  // 0 for p3
  TimeNs time = kTimeNever;
};

// Strict total order on results: faster first, then the smaller partition, then the
// smaller credit (unique per point: the memo holds each (part, credit) once).
bool better(const Point& a, const Point& b) {
  if (a.time != b.time) return a.time < b.time;
  if (a.part != b.part) return a.part < b.part;
  return a.credit < b.credit;
}

class Search {
 public:
  Search(const Profile& profile, const PolicyOptions& base, const ClusterConfig& cluster,
         const SimOptions& sim, bool p3, std::function<void(int)> on_simulation)
      : profile_(profile),
        base_(base),
        cluster_(cluster),
        sim_(sim),
        p3_(p3),
        on_simulation_(std::move(on_simulation)) {}

  // Simulates (part, credit) once; later calls hit the memo. Updates the best point.
  Result<Point> eval(Bytes part, Bytes credit) {
    if (p3_) credit = 0;
    const auto key = std::make_pair(part, credit);
    auto it = memo_.find(key);
    if (it != memo_.end()) return Point{part, credit, it->second};
    auto r =
        simulate(profile_, p3_ ? "p3" : "bytescheduler", options(part, credit), cluster_, sim_);
    if (!r) return r.status().with_context("tuning at partition " + format_size(part));
    memo_.emplace(key, r->iteration_time);
    if (on_simulation_) on_simulation_(static_cast<int>(memo_.size()));
    Point p{part, credit, r->iteration_time};
    if (better(p, best_)) best_ = p;
    return p;
  }

  PolicyOptions options(Bytes part, Bytes credit) const {
    PolicyOptions o = base_;
    if (p3_) {
      o.slice_size = part;
    } else {
      o.partition_size = part;
      o.credit_size = credit;
    }
    return o;
  }

  const Point& best() const { return best_; }
  std::vector<Point> all() const {
    std::vector<Point> v;
    for (const auto& [k, time] : memo_) v.push_back(Point{k.first, k.second, time});
    return v;
  }
  int simulations() const { return static_cast<int>(memo_.size()); }

 private:
  const Profile& profile_;
  const PolicyOptions& base_;
  const ClusterConfig& cluster_;
  const SimOptions& sim_;
  bool p3_;
  std::function<void(int)> on_simulation_;
  std::map<std::pair<Bytes, Bytes>, TimeNs> memo_;
  Point best_;
};

}  // namespace

Result<TuneResult> tune(const Profile& profile, const PolicyOptions& base,
                        const ClusterConfig& cluster, const SimOptions& sim, const TuneOptions& t) {
  if (t.policy != "bytescheduler" && t.policy != "p3") {
    return invalid_argument("tune: policy '" + t.policy +
                            "' has no knobs to tune (bytescheduler, p3)");
  }
  if (t.min_size < 4 || t.max_size < t.min_size) {
    return invalid_argument("tune: the size range must satisfy 4B <= min <= max");
  }
  if (t.grid_points < 1 || t.credit_doublings < 0 || t.refine_rounds < 0 || t.starts < 0) {
    return invalid_argument(
        "tune: grid points must be >= 1; credit doublings, refine rounds and starts >= 0");
  }
  if (t.credit_doublings > 20 || t.grid_points > 1000 || t.max_size > (Bytes{1} << 40)) {
    return invalid_argument(
        "tune: at most 20 credit doublings, 1000 grid points and a 1 TiB size range");
  }
  const bool p3 = t.policy == "p3";
  Search s(profile, base, cluster, sim, p3, t.on_simulation);

  // The defaults first: the result can only improve on them.
  const Bytes def_part = p3 ? base.slice_size : base.partition_size;
  auto def = s.eval(def_part, base.credit_size);
  if (!def) return def.status();

  // Grid: partitions log-spaced over [min, max]; credits partition * 2^k.
  const double lo = std::log(static_cast<double>(t.min_size));
  const double hi = std::log(static_cast<double>(t.max_size));
  const double log_step = t.grid_points > 1 ? (hi - lo) / (t.grid_points - 1) : 0.0;
  for (int i = 0; i < t.grid_points; ++i) {
    const Bytes part = to_size(std::exp(lo + log_step * i));
    const int doublings = p3 ? 0 : t.credit_doublings;
    for (int k = 0; k <= doublings; ++k) {
      auto r = s.eval(part, part << k);
      if (!r) return r.status();
    }
  }

  // Local refinement: a pattern search in log space from each of the best `starts` grid
  // points (the landscape is rugged: several local optima a few percent apart). From the
  // current point it moves to the best of its neighbours (both knobs, and diagonals) while
  // that improves, then halves the step, refine_rounds times.
  std::vector<Point> seeds = s.all();
  std::sort(seeds.begin(), seeds.end(), better);
  if (static_cast<int>(seeds.size()) > t.starts) seeds.resize(static_cast<std::size_t>(t.starts));
  auto part_at = [&](double l) { return std::clamp(to_size(std::exp(l)), t.min_size, t.max_size); };
  auto credit_at = [&](double l) {
    return std::clamp(to_size(std::exp(l)), t.min_size, t.max_size << t.credit_doublings);
  };
  for (const Point& seed : seeds) {
    Point cur = seed;
    double part_step = log_step > 0 ? log_step / 2 : std::log(2.0) / 2;
    double credit_step = std::log(2.0) / 2;
    for (int round = 0; round < t.refine_rounds; ++round) {
      for (int moves = 0; moves < 32; ++moves) {
        const double lp = std::log(static_cast<double>(cur.part));
        const double lc = std::log(static_cast<double>(std::max<Bytes>(cur.credit, 4)));
        Point next = cur;
        for (int dp = -1; dp <= 1; ++dp) {
          for (int dc = -1; dc <= 1; ++dc) {
            if ((dp == 0 && dc == 0) || (p3 && dc != 0)) continue;
            const Bytes part = dp == 0 ? cur.part : part_at(lp + dp * part_step);
            const Bytes credit = dc == 0 ? cur.credit : credit_at(lc + dc * credit_step);
            auto r = s.eval(part, credit);
            if (!r) return r.status();
            if (better(*r, next)) next = *r;
          }
        }
        if (next.part == cur.part && next.credit == cur.credit) break;  // local optimum
        cur = next;
      }
      part_step /= 2;
      credit_step /= 2;
    }
  }

  const Point& b = s.best();
  TuneResult out;
  out.options = s.options(b.part, b.credit);
  out.partition_size = b.part;
  out.credit_size = b.credit;
  out.iteration_time = b.time;
  out.default_time = def->time;
  out.simulations = s.simulations();
  QS_CHECK(out.iteration_time <= out.default_time);
  return out;
}

}  // namespace qs
