#include "advise_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "progress.h"
#include "quicksilver/sim/advisor.h"

namespace qs::cli {

void add_advise_flags(CLI::App* app, AdviseFlags* f) {
  f->app = app;
  add_sim_flags(app, &f->sim);
  app->add_flag("--allow-stale", f->allow_stale,
                "Rank the policies that delay updates too (DeFT): their merged updates change "
                "the optimisation, not only its speed");
  app->add_flag("--no-sensitivity", f->no_sensitivity,
                "Skip the sweep of the pick against bandwidth (0.1x..10x) and worker count");
}

int run_advise(const AdviseFlags& f) {
  const CLI::Option* policy = f.app->get_option_no_throw("--policy");
  if (policy != nullptr && policy->count() > 0) {
    return fail("quicksilver advise",
                invalid_argument("--policy: advise ranks every policy of the architecture; "
                                 "use `quicksilver simulate --policy P` for one"));
  }
  SimFlags sf = f.sim;
  sf.policy = "oracle";  // make_job validates the policy list; advise picks its own
  auto job = make_job(sf);
  if (!job) return fail("quicksilver advise", job.status());
  AdviseOptions o;
  o.allow_stale = f.allow_stale;
  o.sensitivity = !f.no_sensitivity;
  // Every core: advise runs alone (the planner inside a training job keeps its default).
  o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  auto advice = [&] {
    Progress progress("quicksilver advise", f.sim.json);
    progress.set("simulating every policy");
    o.progress = [&progress](std::string_view line) { progress.set(std::string(line)); };
    return advise(*job, o);
  }();
  if (!advice) return fail("quicksilver advise", advice.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& r = advice->ranking;
  if (f.sim.json) {
    nlohmann::json out;
    out["ranking"] = nlohmann::json::array();
    for (const AdvisedPolicy& a : r) {
      nlohmann::json knobs = nlohmann::json::object();
      for (const auto& [name, value] : a.knobs) knobs[name] = value;
      out["ranking"].push_back({{"policy", a.policy},
                                {"iteration_ms", to_ms(a.iteration_time)},
                                {"default_ms", to_ms(a.default_time)},
                                {"knobs", knobs}});
    }
    out["bound_ms"] = to_ms(advice->bound);
    out["sensitivity"] = advice->sensitivity;
    out["notes"] = advice->notes;
    out["simulations"] = advice->simulations;
    out["stopped"] = advice->stopped;
    out["seconds"] = seconds;
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("advised: %s, %d workers", job->profile.name.c_str(), job->cluster.workers);
  if (job->cluster.architecture == Architecture::kPs)
    std::printf(", %d servers (ps)", job->cluster.servers);
  else
    std::printf(" (allreduce)");
  std::printf(", %s; %d simulations (%d stopped once they lost) in %.1f s\n",
              format_rate(job->cluster.bandwidth).c_str(), advice->simulations, advice->stopped,
              seconds);
  std::printf("%-4s %-18s %11s %11s %9s  %s\n", "rank", "policy", "iteration", "defaults", "margin",
              "tuned knobs");
  for (std::size_t i = 0; i < r.size(); ++i) {
    const AdvisedPolicy& a = r[i];
    std::string knobs;
    for (const auto& [name, value] : a.knobs)
      knobs += (knobs.empty() ? "" : ", ") + name + " " + value;
    // The margin: how much slower the next entry is predicted.
    std::string margin = "-";
    if (i + 1 < r.size()) {
      char m[32];
      std::snprintf(m, sizeof m, "%+.1f%%",
                    100.0 * (static_cast<double>(r[i + 1].iteration_time) /
                                 static_cast<double>(a.iteration_time) -
                             1));
      margin = m;
    }
    std::printf("%-4zu %-18s %9.3fms %9.3fms %9s  %s\n", i + 1, a.policy.c_str(),
                to_ms(a.iteration_time), to_ms(a.default_time), margin.c_str(),
                knobs.empty() ? "-" : knobs.c_str());
  }
  std::printf("bound: %.3fms (oracle: compute only, no communication)\n", to_ms(advice->bound));
  for (const std::string& s : advice->sensitivity) std::printf("sensitivity: %s\n", s.c_str());
  for (const std::string& n : advice->notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace qs::cli
