#include "quicksilver/sim/auto_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "quicksilver/policy/registry.h"
#include "quicksilver/sim/simulator.h"

namespace qs {
namespace {

// Seconds per gigabit, the variable of the secant steps.
double per_gbit(Rate r) { return 1e9 / static_cast<double>(r.bits_per_second); }
Rate from_per_gbit(double x) { return Rate{std::llround(1e9 / x)}; }

std::string ms(TimeNs t) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", to_ms(t));
  return b;
}

// "0.185 Gbit/s": a rate the search found, to three digits.
std::string gbit(Rate r) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g Gbit/s", static_cast<double>(r.bits_per_second) / 1e9);
  return b;
}

std::string percent(double share) { return std::to_string(std::lround(share * 100)) + " %"; }

}  // namespace

std::string auto_candidate(const std::string& policy, const PolicyOptions& options,
                           Architecture architecture) {
  std::string s = policy;
  const PolicySpec* spec = policy_registry().find(policy, architecture);
  if (spec == nullptr) return s;
  for (const Knob* k : tuned_knobs(*spec)) s += " " + k->name + "=" + k->display(options);
  return s;
}

std::string auto_start_policy(Architecture a) {
  return a == Architecture::kAllReduce ? "ddp" : "mercury";
}

Result<Rate> effective_rate(const std::function<Result<TimeNs>(Rate)>& predict, TimeNs measured) {
  const double slowest = per_gbit(kAutoSlowest), fastest = per_gbit(kAutoFastest);
  double lo = fastest, hi = slowest;  // the bracket, in seconds per gigabit
  const double target = static_cast<double>(measured);
  auto f = [&](double x) -> Result<double> {
    QS_ASSIGN_OR_RETURN(const TimeNs t, predict(from_per_gbit(x)));
    return static_cast<double>(t) - target;
  };
  double x0 = 0.1, x1 = 1.0;
  QS_ASSIGN_OR_RETURN(double f0, f(x0));
  QS_ASSIGN_OR_RETURN(double f1, f(x1));
  for (int step = 0; step < 16; ++step) {
    if (std::abs(f1) <= 0.002 * target) return from_per_gbit(x1);
    // f < 0: the rate 1/x is too fast for the measured time.
    if (f1 < 0) {
      lo = std::max(lo, x1);
    } else {
      hi = std::min(hi, x1);
    }
    double x = f1 != f0 ? x1 - f1 * (x1 - x0) / (f1 - f0) : -1;
    if (!(x > lo && x < hi)) {
      if (hi == slowest && f1 < 0 && x1 >= hi / 2) {
        x = hi;  // probe the slowest rate: the measured time may need slower still
      } else if (lo == fastest && f1 > 0 && x1 <= 2 * lo) {
        x = lo;
      } else {
        x = std::sqrt(lo * hi);  // bisection on the log
      }
    }
    x0 = x1;
    f0 = f1;
    x1 = x;
    QS_ASSIGN_OR_RETURN(f1, f(x1));
    if (x1 <= fastest && f1 >= 0) return kAutoFastest;  // compute-bound: no rate explains more
    if (x1 >= slowest && f1 <= 0) return kAutoSlowest;
  }
  return from_per_gbit(x1);
}

namespace {

// Whether a and b are within kAutoTrialRateBand of each other (b > 0).
bool within_band(double a, double b) {
  return b > 0 && a / b > 1 / kAutoTrialRateBand && a / b < kAutoTrialRateBand;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// What the last trial measured, against the running candidate's measurement now.
struct TrialMemory {
  const AutoTrialled& trialled;
  const std::string& current;  // the running candidate (auto_candidate)
  TimeNs measured;             // what it measures now

  bool has(const std::string& name) const {
    return std::find(trialled.candidates.begin(), trialled.candidates.end(), name) !=
           trialled.candidates.end();
  }
  // The trial's pick runs and measures as it did then (kAutoTrialRateBand).
  bool pick_as_measured() const {
    return current == trialled.pick &&
           within_band(static_cast<double>(measured), static_cast<double>(trialled.pick_measured));
  }
  // What the trial measured a candidate at (0: not measured, or not known).
  TimeNs time(const std::string& name) const {
    for (std::size_t i = 0; i < trialled.candidates.size() && i < trialled.measured.size(); ++i) {
      if (trialled.candidates[i] == name) return trialled.measured[i];
    }
    return 0;
  }
  // The trial measured the candidate slower than the running one measures now, and the
  // running one measures no faster than it did in that trial. A policy's iteration does not
  // get faster as the network slows or the hosts load, so the candidate is slower still (the
  // digits CNN on gloo at 2 hosts: a trial measured mgwfbp at 10.58 ms and ddp at 2.73 ms;
  // ddp later measured 4.58 ms, the trial no longer held at that rate, and a prediction
  // switched to mgwfbp for the window's last passes: 0.75 of the best fixed policy).
  bool measured_slower(const std::string& name) const {
    const TimeNs then = time(current);
    return then > 0 && measured >= then && name != current && time(name) > measured;
  }
  // The trial's pick runs and every other candidate it measured is measured slower.
  bool all_slower() const {
    if (current != trialled.pick || trialled.candidates.size() < 2) return false;
    for (const std::string& n : trialled.candidates) {
      if (n != current && !measured_slower(n)) return false;
    }
    return true;
  }
};

// decide_auto's rules (its comment), on `d` with its rate, prediction and ranking in.
void choose(const std::string& running, const PolicyOptions& options, Architecture arch,
            TimeNs measured, TimeNs switch_cost, int horizon, const AutoTrialled& trialled,
            const AutoOptions& rules, AutoDecision* out) {
  AutoDecision& d = *out;
  const AdvisedPolicy& best = d.ranking.front();
  d.next.policy = running;
  d.next.options = options;
  d.next.iteration_time = d.predicted;
  const std::string rate = gbit(d.network);
  auto candidate = [arch](const AdvisedPolicy& a) {
    return auto_candidate(a.policy, a.options, arch);
  };
  const std::string current = auto_candidate(running, options, arch);
  const TrialMemory memory{trialled, current, measured};
  // Near-ties: measured in turn, unless every one of them was in the last trial, at about
  // this rate or with the trial's pick measuring as it did (kAutoTrialRateBand).
  std::vector<const AdvisedPolicy*> near;
  for (std::size_t i = 0; i < d.ranking.size() && static_cast<int>(i) < rules.trial_max; ++i) {
    if (static_cast<double>(d.ranking[i].iteration_time) <=
        static_cast<double>(best.iteration_time) * (1 + rules.trial_band)) {
      near.push_back(&d.ranking[i]);
      d.near.push_back(candidate(d.ranking[i]));
    }
  }
  const bool same_rate = within_band(static_cast<double>(d.network.bits_per_second),
                                     static_cast<double>(trialled.network.bits_per_second));
  const bool pick_as_measured = memory.pick_as_measured();
  // The last trial still holds: at about this rate, or its pick measuring as it did, or its
  // pick running with every other candidate measured slower.
  const bool trial_holds =
      !trialled.candidates.empty() && (same_rate || pick_as_measured || memory.all_slower());
  bool measured_before = trial_holds;
  for (const std::string& n : d.near) measured_before &= memory.has(n);
  const TimeNs gain = d.predicted - best.iteration_time;
  // A candidate is the running one when it is its policy with its knobs.
  auto is_running = [&](const AdvisedPolicy& a) { return candidate(a) == current; };
  // While the last trial holds and its pick runs, what it measured (slower than the pick) is
  // not measured again: only the near candidates it did not measure are (the digits CNN on
  // gloo re-ran a candidate measured at 21 ms against the pick's 12 ms for 36 passes).
  const bool pick_runs = trial_holds && current == trialled.pick;
  std::vector<AdvisedPolicy> others;
  for (const AdvisedPolicy* a : near) {
    if (!is_running(*a) && !(pick_runs && memory.has(candidate(*a)))) others.push_back(*a);
  }
  // The pick runs and measures as it did, and only the estimate of the rate moved: the job
  // did not, and the trial's near-tie was decided at its rate. A candidate that is near only
  // at the estimate's new rate is not measured, nor taken for a gain inside the near-tie's
  // band (the digits CNN on gloo at 2 hosts: ddp measured 4.03 ms against its trial's
  // 4.21, the estimate went from 0.154 to 0.265 Gbit/s, and a trial of a candidate near
  // only there ran inside the measured window at 1.6 times ddp's time).
  const bool estimate_moved = pick_runs && pick_as_measured && !same_rate;
  if (estimate_moved) others.clear();
  // A trial is run when its switches cost at most rules.trial_budget of the iterations
  // until the next decision: one to each other candidate, and one to the pick after them
  // (the digits CNN on gloo, 4 ms an iteration and 35 ms a switch, re-ran a trial inside
  // every 200-pass window without it: 0.85 to 0.89 of the best fixed policy).
  const double trial_cost =
      static_cast<double>(others.size() + 1) * static_cast<double>(std::max(switch_cost, kNsPerMs));
  const bool affordable =
      trial_cost <= rules.trial_budget * horizon * static_cast<double>(d.predicted);
  if (near.size() >= 2 && !others.empty() && !measured_before && affordable) {
    d.trial = std::move(others);
    d.reason = joined(d.near) + " predicted within " + percent(rules.trial_band) +
               " of each other at about " + rate + ": measuring each (" + current + " measured " +
               ms(measured) + ")";
    return;
  }
  // Measured already: the trial's pick is kept, or taken back when a prediction has
  // switched away from it since and the running one measures slower than it did (the
  // trial measured; the simulator guessed).
  const AdvisedPolicy* pick = nullptr;
  for (const AdvisedPolicy& a : d.ranking) {
    if (candidate(a) == trialled.pick) pick = &a;
  }
  if (measured_before && pick_runs) {  // measured_before implies the trial holds
    d.reason = current + " measured fastest of " + joined(trialled.candidates) +
               " at about this rate (a trial): kept";
  } else if (measured_before && pick != nullptr && measured > trialled.pick_measured) {
    d.change = true;
    d.next = *pick;
    d.reason = trialled.pick + " measured fastest of " + joined(trialled.candidates) +
               " at about this rate (a trial): switched back from " + current;
  } else if (is_running(best)) {
    d.reason = running + " is still predicted fastest (" + ms(d.predicted) + ")";
  } else if (memory.measured_slower(candidate(best))) {
    d.reason = best.policy + " is predicted " + ms(gain) +
               " faster, but the last trial measured it at " + ms(memory.time(candidate(best))) +
               ", slower than " + current + " measures now (" + ms(measured) +
               ", no faster than its " + ms(memory.time(current)) + " then): kept " + running;
  } else if (pick_runs && memory.has(candidate(best))) {
    // The trial measured the best slower than its pick, which runs: measured beats
    // predicted (the digits CNN on gloo at 200 Mbit/s: a trial measured mgwfbp at 12.8 ms
    // and ddp at 4.3 ms; the next decision, under ddp, predicted mgwfbp 5.5 % faster).
    d.reason = best.policy + " is predicted " + ms(gain) +
               " faster, but the last trial (which still holds) measured it slower than " +
               current + ": kept " + running;
  } else if (estimate_moved &&
             static_cast<double>(gain) <= rules.trial_band * static_cast<double>(d.predicted)) {
    d.reason = best.policy + " is predicted " + ms(gain) + " faster at about " + rate +
               ", inside the near-tie's band; " + current + " measures as in the last trial (" +
               ms(measured) + " against " + ms(trialled.pick_measured) +
               "), only the rate's estimate moved: kept " + running;
  } else if (static_cast<double>(gain) <= rules.min_gain * static_cast<double>(d.predicted)) {
    d.reason = best.policy + " is predicted " + ms(gain) + " faster, under " +
               percent(rules.min_gain) + " of an iteration: kept " + running;
  } else if (gain * horizon <= switch_cost) {
    d.reason = best.policy + " is predicted " + ms(gain) + " an iteration faster, " +
               ms(gain * horizon) + " over the next " + std::to_string(horizon) +
               " iterations, less than a switch costs (" + ms(switch_cost) + "): kept " + running;
  } else {
    d.change = true;
    d.next = best;
    d.reason = "measured " + ms(measured) + " an iteration under " + running +
               ": the network is about " + rate + ", where " + best.policy + " is predicted " +
               ms(best.iteration_time) + " against " + ms(d.predicted);
  }
}

}  // namespace

Result<AutoDecision> decide_auto(const Job& job, const std::string& running,
                                 const PolicyOptions& options, TimeNs measured, TimeNs switch_cost,
                                 int horizon, bool allow_stale, const AutoTrialled& trialled,
                                 const AutoOptions& rules) {
  if (measured <= 0) return invalid_argument("decide_auto: no iteration measured");
  if (horizon < 1) return invalid_argument("decide_auto: horizon must be >= 1");
  auto at = [&job](Rate r) {
    Job j = job;
    j.cluster.bandwidth = r;
    j.cluster.schedule.reset();
    return j;
  };
  AutoDecision d;
  QS_ASSIGN_OR_RETURN(d.network, effective_rate(
                                     [&](Rate r) -> Result<TimeNs> {
                                       const Job j = at(r);
                                       QS_ASSIGN_OR_RETURN(
                                           const SimResult s,
                                           simulate(j.profile, running, options, j.cluster, j.sim));
                                       return s.iteration_time;
                                     },
                                     measured));
  const Job there = at(d.network);
  QS_ASSIGN_OR_RETURN(const SimResult now,
                      simulate(there.profile, running, options, there.cluster, there.sim));
  d.predicted = now.iteration_time;
  AdviseOptions ao;
  ao.allow_stale = allow_stale;
  ao.sensitivity = false;
  ao.threads = rules.threads;
  QS_ASSIGN_OR_RETURN(const Advice advice, advise(there, ao));
  d.ranking = advice.ranking;
  choose(running, options, job.cluster.architecture, measured, switch_cost, horizon, trialled,
         rules, &d);
  return d;
}

}  // namespace qs
