#include "tune_command.h"

#include <cstdio>

#include "progress.h"
#include "quicksilver/sim/tuner.h"

namespace qs::cli {

void add_tune_flags(CLI::App* app, TuneFlags* f) {
  add_sim_flags(app, &f->sim);
  app->add_option("--tune-policy", f->tune_policy,
                  "Policy whose knobs are searched: bytescheduler or p3")
      ->capture_default_str();
  app->add_option("--tune-min", f->min_size, "Smallest partition (slice) size searched")
      ->capture_default_str();
  app->add_option("--tune-max", f->max_size, "Largest partition (slice) size searched")
      ->capture_default_str();
  app->add_option("--grid-points", f->grid_points, "Log-spaced partition sizes on the grid")
      ->capture_default_str();
  app->add_option("--credit-doublings", f->credit_doublings,
                  "Credits on the grid: partition * 2^k, k = 0..this")
      ->capture_default_str();
  app->add_option("--refine-rounds", f->refine_rounds,
                  "Pattern-search rounds after the grid (step halves each)")
      ->capture_default_str();
  app->add_option("--starts", f->starts, "Refinement starts from this many best points")
      ->capture_default_str();
}

int run_tune(const TuneFlags& f) {
  SimFlags sf = f.sim;
  sf.policy = "oracle";  // make_job validates the policy list; the tuner picks its own
  auto job = make_job(sf);
  if (!job) return fail("quicksilver", job.status());
  if (job->cluster.architecture != Architecture::kPs) {
    return fail("quicksilver", "tune: bytescheduler and p3 run on --architecture ps");
  }
  TuneOptions t;
  t.policy = f.tune_policy;
  t.grid_points = f.grid_points;
  t.credit_doublings = f.credit_doublings;
  t.refine_rounds = f.refine_rounds;
  t.starts = f.starts;
  auto lo = parse_size(f.min_size);
  auto hi = parse_size(f.max_size);
  if (!lo) return fail("quicksilver", lo.status().with_context("--tune-min"));
  if (!hi) return fail("quicksilver", hi.status().with_context("--tune-max"));
  t.min_size = *lo;
  t.max_size = *hi;
  auto r = [&] {
    Progress progress("quicksilver tune", f.sim.json);
    progress.set("searching " + t.policy + "'s knobs");
    t.on_simulation = [&progress, &t](int n) {
      progress.set(std::to_string(n) + " simulations of " + t.policy + " so far");
    };
    return tune(job->profile, job->policy_options, job->cluster, job->sim, t);
  }();
  if (!r) return fail("quicksilver", r.status());
  const bool p3 = t.policy == "p3";
  // --json: the table's one JSON object alone (its rows name the tuned knobs' results).
  if (!f.sim.json)
    std::printf("tuned %s: %s %s", t.policy.c_str(), p3 ? "slice" : "partition",
                format_size(r->partition_size).c_str());
  if (!p3 && !f.sim.json) std::printf(", credit %s", format_size(r->credit_size).c_str());
  if (!f.sim.json)
    std::printf(
        "; iteration %.3fms (defaults %.3fms, %+.1f%%); %d simulations (grid %d x %d, %d refine "
        "rounds from %d starts)\n\n",
        to_ms(r->iteration_time), to_ms(r->default_time),
        100.0 * (static_cast<double>(r->iteration_time) - static_cast<double>(r->default_time)) /
            static_cast<double>(r->default_time),
        r->simulations, t.grid_points, p3 ? 1 : t.credit_doublings + 1, t.refine_rounds, t.starts);

  std::vector<Row> rows;
  struct Entry {
    std::string policy, label;
    PolicyOptions options;
  };
  // Short labels keep the table's policy column (18 characters) aligned.
  const std::string tag = p3 ? "p3" : "bs";
  const std::vector<Entry> entries = {{t.policy, tag + "-default", job->policy_options},
                                      {t.policy, tag + "-tuned", r->options},
                                      {"mercury", "mercury", job->policy_options}};
  for (const Entry& e : entries) {
    auto s = simulate(job->profile, e.policy, e.options, job->cluster, job->sim);
    if (!s) return fail("quicksilver", s.status().with_context(e.label));
    s->policy = e.label;
    rows.push_back(Row{std::move(*s), std::nullopt});
  }
  if (f.sim.json) {
    print_json(*job, rows);
  } else {
    print_table(*job, rows, "simulated");
  }
  return 0;
}

}  // namespace qs::cli
