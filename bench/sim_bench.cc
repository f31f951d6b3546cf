// Simulator benchmarks (issue 3): events simulated per second; the wall time of the whole
// Mercury Fig. 11 sweep; one VGG-16 iteration with 32 KiB packets and 64 workers.
// Run: ./build/bench/sim_bench  (Google Benchmark; --benchmark_repetitions=5 for medians)
#include <benchmark/benchmark.h>

#include "quicksilver/model/zoo.h"
#include "quicksilver/policy/ps_policy.h"
#include "quicksilver/sim/simulator.h"

namespace qs {
namespace {

Profile zoo(const char* name) { return *load_model(name, "rtx3090"); }

// Events per second of the PS engine on Mercury with 32 KiB packets, VGG-16, 4x4.
void BM_EventsPerSecond(benchmark::State& state) {
  const Profile p = zoo("vgg16");
  ClusterConfig c;
  SimOptions o;
  o.iterations = 2;
  std::uint64_t events = 0;
  for (auto _ : state) {
    auto r = simulate(p, "mercury", {}, c, o);
    events += r->events;
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EventsPerSecond)->Unit(benchmark::kMillisecond);

// Mercury Fig. 11: normalised speed vs bandwidth (1..40 Gbps, every integer), VGG-16 and
// BERT-Base on an RTX 3090, every PS policy; one worker and one PS as in the paper's
// model (eq. 1-2), 2 iterations each (the second is the steady state).
void BM_Fig11Sweep(benchmark::State& state) {
  const Profile models[] = {zoo("vgg16"), zoo("bert_base")};
  SimOptions o;
  o.iterations = 2;
  o.warmup = 1;
  int sims = 0;
  for (auto _ : state) {
    for (const Profile& p : models) {
      for (int gbps = 1; gbps <= 40; ++gbps) {
        ClusterConfig c;
        c.workers = 1;
        c.servers = 1;
        c.bandwidth = Rate::gbps(gbps);
        for (const std::string& policy : ps_policy_names()) {
          auto r = simulate(p, policy, {}, c, o);
          benchmark::DoNotOptimize(r);
          ++sims;
        }
      }
    }
  }
  state.counters["simulations"] = sims / static_cast<double>(state.iterations());
}
BENCHMARK(BM_Fig11Sweep)->Unit(benchmark::kMillisecond);

// One VGG-16 iteration, 32 KiB packets, 64 workers and 64 servers.
void BM_Vgg16Mercury64Workers(benchmark::State& state) {
  const Profile p = zoo("vgg16");
  ClusterConfig c;
  c.workers = 64;
  c.servers = 64;
  SimOptions o;
  o.iterations = 1;
  o.warmup = 0;
  std::uint64_t events = 0;
  for (auto _ : state) {
    auto r = simulate(p, "mercury", {}, c, o);
    events = r->events;
  }
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_Vgg16Mercury64Workers)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace qs

BENCHMARK_MAIN();
