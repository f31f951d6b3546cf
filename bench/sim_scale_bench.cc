// The simulator at the scale its users outgrow testbeds at (issue 14): one training
// iteration of a model on N workers and N servers for growing N, each in a child process
// so that its peak RSS is its own. Prints a table (N, units over all workers, events, wall
// and CPU time, peak RSS, time per event) and the growth between the first and last rows
// as exponents of N (events ~ N^a). docs/benchmarks.md "Simulator at scale" records it.
//
// Run: ./build/bench/sim_scale_bench [--sizes=16,64,256,1024] [--model=vgg16]
//                                    [--policy=mercury] [--packet-size=32KiB] [--iterations=1]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "quicksilver/core/units.h"
#include "quicksilver/model/zoo.h"
#include "quicksilver/sim/simulator.h"

namespace {

struct Row {
  int n = 0;
  std::int64_t units = 0;  // over all workers, per iteration
  std::uint64_t events = 0, queue_events = 0;
  double iteration_ms = 0, wall_s = 0, cpu_s = 0, rss_mb = 0;
};

bool flag(const char* arg, const char* name, std::string* value) {
  const std::size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "16,64,256,1024", model = "vgg16", policy = "mercury", packet = "32KiB",
              iterations = "1";
  for (int i = 1; i < argc; ++i) {
    if (!flag(argv[i], "--sizes", &sizes) && !flag(argv[i], "--model", &model) &&
        !flag(argv[i], "--policy", &policy) && !flag(argv[i], "--packet-size", &packet) &&
        !flag(argv[i], "--iterations", &iterations)) {
      std::fprintf(
          stderr,
          "usage: %s [--sizes=N,...] [--model=M] [--policy=P] [--packet-size=S] [--iterations=K]\n",
          argv[0]);
      return 2;
    }
  }
  auto profile = qs::load_model(model, "rtx3090");
  auto packet_size = qs::parse_size(packet);
  if (!profile || !packet_size) {
    std::fprintf(stderr, "%s\n",
                 (!profile ? profile.status() : packet_size.status()).message().c_str());
    return 2;
  }
  qs::PolicyOptions options;
  options.packet_size = *packet_size;
  qs::SimOptions sim;
  sim.iterations = std::stoi(iterations);
  sim.warmup = 0;

  std::printf(
      "%s, %s, %s packets, N workers and N servers at 10 Gbps, %d iteration(s), one child process "
      "each\n\n",
      model.c_str(), policy.c_str(), packet.c_str(), sim.iterations);
  std::printf(
      "| N | units / iteration | events | through the queue | iteration (simulated) | wall | CPU | "
      "peak RSS | CPU per event |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  std::stringstream list(sizes);
  for (std::string item; std::getline(list, item, ',');) {
    Row row;
    row.n = std::stoi(item);
    qs::ClusterConfig cluster;
    cluster.workers = cluster.servers = row.n;
    int pipe_fd[2];
    if (pipe(pipe_fd) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(pipe_fd[0]);
      const auto start = std::chrono::steady_clock::now();
      auto r = qs::simulate(*profile, policy, options, cluster, sim);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!r) {
        std::fprintf(stderr, "N=%d: %s\n", row.n, r.status().message().c_str());
        _exit(1);
      }
      char buf[256];
      const int len = std::snprintf(buf, sizeof buf, "%lld %llu %llu %.6f %.6f",
                                    static_cast<long long>(r->messages_per_iteration) * row.n,
                                    static_cast<unsigned long long>(r->events),
                                    static_cast<unsigned long long>(r->queue_events),
                                    static_cast<double>(r->iteration_time) / 1e6, wall);
      if (write(pipe_fd[1], buf, static_cast<std::size_t>(len)) != len) _exit(1);
      _exit(0);
    }
    close(pipe_fd[1]);
    char buf[256] = {};
    std::size_t got = 0;
    for (ssize_t k; (k = read(pipe_fd[0], buf + got, sizeof buf - 1 - got)) > 0;)
      got += static_cast<std::size_t>(k);
    close(pipe_fd[0]);
    int status = 0;
    rusage usage{};
    if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return 1;
    long long units = 0;
    unsigned long long events = 0, queue_events = 0;
    if (std::sscanf(buf, "%lld %llu %llu %lf %lf", &units, &events, &queue_events,
                    &row.iteration_ms, &row.wall_s) != 5) {
      return 1;
    }
    row.units = units;
    row.events = events;
    row.queue_events = queue_events;
    row.cpu_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    row.rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
    std::printf("| %d | %lld | %llu | %llu | %.1f ms | %.2f s | %.2f s | %.0f MB | %.0f ns |\n",
                row.n, units, events, queue_events, row.iteration_ms, row.wall_s, row.cpu_s,
                row.rss_mb,
                1e9 * row.cpu_s / static_cast<double>(std::max<unsigned long long>(events, 1)));
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (rows.size() >= 2) {
    const Row& a = rows.front();
    const Row& b = rows.back();
    const double dn = std::log(static_cast<double>(b.n) / a.n);
    auto exponent = [&](double x, double y) { return std::log(y / x) / dn; };
    std::printf(
        "\ngrowth from N=%d to N=%d, as N^a: units %.2f, events %.2f, CPU %.2f, wall %.2f, peak "
        "RSS %.2f\n",
        a.n, b.n, exponent(static_cast<double>(a.units), static_cast<double>(b.units)),
        exponent(static_cast<double>(a.events), static_cast<double>(b.events)),
        exponent(a.cpu_s, b.cpu_s), exponent(a.wall_s, b.wall_s), exponent(a.rss_mb, b.rss_mb));
  }
  return 0;
}
