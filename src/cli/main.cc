// The `quicksilver` command: the only place that reads flags (and, later, environment).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "advise_command.h"
#include "commands.h"
#include "quicksilver/core/check.h"
#include "runtime_commands.h"
#include "tune_command.h"

int main(int argc, char** argv) {
  // `quicksilver run --script FILE ARGS...`: everything after the script's path is the
  // script's own (its flags are not ours to parse).
  std::vector<std::string> script_args;
  // `quicksilver profile ...`: the measurement is PyTorch's (python/quicksilver/profile.py,
  // which parses its own flags); this takes --python (the interpreter), finds the package
  // and hands over.
  if (argc > 1 && std::string(argv[1]) == "profile") {
    std::vector<std::string> args;
    std::string python;
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--python" && i + 1 < argc) {
        python = argv[++i];
      } else if (a.starts_with("--python=")) {
        python = a.substr(9);
      } else if (a == "--python") {
        std::cerr << "quicksilver profile: --python needs a PATH (see quicksilver --help)\n";
        return 2;
      } else {
        args.push_back(a);
      }
    }
    return qs::cli::run_profile(args, python, "/proc/self/exe");
  }
  if (argc > 1 && std::string(argv[1]) == "run") {
    for (int i = 2; i + 1 < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--script") {
        script_args.assign(argv + i + 2, argv + argc);
        argc = i + 2;
        break;
      }
    }
  }
  CLI::App app{"Quicksilver: gradient communication scheduling for data-parallel DNN training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "quicksilver 0.1.0");

  std::string models_device = "rtx3090";
  bool models_json = false;
  CLI::App* models = app.add_subcommand("models", "List the built-in model profiles");
  models->add_option("--device", models_device,
                     "Device model for compute times (k80, gtx1080ti, v100, rtx3090, a100)");
  models->add_flag("--json", models_json, "Print JSON");

  bool policies_markdown = false;
  std::string policies_architecture = "ps";
  CLI::App* policies =
      app.add_subcommand("policies", "List the registered policies and their knobs");
  policies->add_option("--architecture", policies_architecture, "ps or allreduce")
      ->capture_default_str();
  policies->add_flag(
      "--markdown", policies_markdown,
      "Print the knob table as docs/policies-ps.md and docs/policies-allreduce.md embed it");

  qs::cli::SimFlags sim_flags;
  CLI::App* simulate = app.add_subcommand("simulate", "Simulate schedulers on a model and network");
  qs::cli::add_sim_flags(simulate, &sim_flags);
  qs::cli::add_shared_job_flags(simulate, &sim_flags);

  qs::cli::CoordinatorFlags coordinator_flags;
  CLI::App* coordinator = app.add_subcommand(
      "coordinator", "Rendezvous for a job on real hosts: servers register, workers look up");
  qs::cli::add_coordinator_flags(coordinator, &coordinator_flags);
  qs::cli::RoleFlags server_flags, worker_flags;
  CLI::App* server = app.add_subcommand("server", "Run one parameter server of a job (real TCP)");
  qs::cli::add_server_flags(server, &server_flags);
  CLI::App* worker = app.add_subcommand("worker", "Run one worker of a job (real TCP)");
  qs::cli::add_worker_flags(worker, &worker_flags);
  qs::cli::TuneFlags tune_flags;
  CLI::App* tune = app.add_subcommand(
      "tune", "Search bytescheduler's partition/credit (or p3's slice) size by simulation");
  qs::cli::add_tune_flags(tune, &tune_flags);
  qs::cli::AdviseFlags advise_flags;
  CLI::App* advise = app.add_subcommand(
      "advise", "Rank every policy of the architecture, knobs tuned, by simulation");
  qs::cli::add_advise_flags(advise, &advise_flags);
  // Listed for --help only: main() hands `profile` to Python before parsing.
  app.add_subcommand(
      "profile",
      "Measure a PyTorch model into a profile JSON (flags: quicksilver profile --help; "
      "--python PATH: the interpreter)");
  bool cleanup_dry_run = false;
  CLI::App* cleanup = app.add_subcommand(
      "cleanup",
      "Remove what `quicksilver run` launchers killed outright left: namespaces, bridges, veths, "
      "qs-run-* directories, the allowed congestion controls (a live run's are never touched)");
  cleanup->add_flag("--dry-run", cleanup_dry_run, "Only print what would be removed");
  qs::cli::RunFlags run_flags;
  CLI::App* run = app.add_subcommand(
      "run", "Run a whole local cluster (processes), compare with the simulator");
  qs::cli::add_run_flags(run, &run_flags);
  run_flags.script_args = script_args;

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming the flag; exit 2 like every other bad input.
    std::cerr << "quicksilver: " << e.what() << " (see quicksilver --help)\n";
    return 2;
  }
  try {
    if (*models) return qs::cli::run_models(models_device, models_json);
    if (*policies) return qs::cli::run_policies(policies_markdown, policies_architecture);
    if (*simulate) return qs::cli::run_simulate(sim_flags);
    if (*tune) return qs::cli::run_tune(tune_flags);
    if (*advise) return qs::cli::run_advise(advise_flags);
    if (*coordinator) return qs::cli::run_coordinator(coordinator_flags);
    if (*server) return qs::cli::run_server_role(server_flags);
    if (*worker) return qs::cli::run_worker_role(worker_flags);
    if (*run) return qs::cli::run_cluster(run_flags, "/proc/self/exe");
    if (*cleanup) return qs::cli::run_cleanup(cleanup_dry_run);
  } catch (const qs::CheckFailure& e) {
    std::cerr << "quicksilver: internal error: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "quicksilver: error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
