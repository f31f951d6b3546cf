// `quicksilver run --script` (quicksilver/launch/script.h).
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

#include "quicksilver/launch/script.h"
#include "quicksilver/runtime/netns.h"
#include "quicksilver/runtime/runtime.h"
#include "rate_shaper.h"
#include "stop_signals.h"

namespace qs {
namespace {

// A port nobody listens on now (the kernel's choice for an ephemeral bind). Rank 0's
// torch.distributed store binds it moments later.
Result<int> free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  if (port <= 0) return io_error("no free port for MASTER_PORT");
  return port;
}

// Set by SIGINT/SIGTERM/SIGHUP while run_script runs with catch_signals (a handler can
// only reach a global); read by its wait loop.
volatile std::sig_atomic_t g_script_interrupted = 0;
void on_script_signal(int) { g_script_interrupted = 1; }

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

}  // namespace

bool runs_under_python(std::string_view script) {
  return script.size() > 3 && script.ends_with(".py");
}

Result<ScriptRunResult> run_script(const ScriptLaunchOptions& o) {
  if (o.script.empty()) return invalid_argument("--script: no script given");
  if (access(o.script.c_str(), R_OK) != 0)
    return not_found("--script: cannot read '" + o.script + "'");
  const bool python = runs_under_python(o.script);
  if (python && o.python.empty())
    return invalid_argument("--script " + o.script + ": no Python interpreter given");
  if (o.workers < 1 || o.workers > runtime::kMaxWorkers) {
    return invalid_argument("--workers must be in 1.." + std::to_string(runtime::kMaxWorkers));
  }
  QS_RETURN_IF_ERROR(runtime::check_link_shaping(o.shaping, o.netns));
  if (o.schedule && !o.netns)
    return invalid_argument(
        "--bandwidth-trace with --script needs --netns (loopback is not shaped)");
  auto log = [&](const std::string& m) {
    if (o.log) o.log(m);
  };
  g_script_interrupted = 0;
  const runtime::StopSignals stop_signals(o.catch_signals, on_script_signal);
  // The emulated cluster: one namespace per worker; torn down on return.
  std::unique_ptr<runtime::NetnsCluster> cluster;
  std::string master_addr = o.master_addr;
  if (o.netns) {
    QS_RETURN_IF_ERROR(runtime::NetnsCluster::available().with_context("--netns"));
    runtime::NetnsOptions no;
    no.hosts = o.workers;
    no.rate = o.schedule ? o.schedule->segments()[0].rate : o.bandwidth;
    no.congestion = o.congestion;
    static_cast<runtime::LinkShaping&>(no) = o.shaping;
    QS_ASSIGN_OR_RETURN(cluster, runtime::NetnsCluster::create(no));
    master_addr = cluster->address(0);
  }
  int port = o.master_port;
  if (port == 0) {
    QS_ASSIGN_OR_RETURN(port, free_port());
  }
  std::string python_path = o.python_path;
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    python_path += (python_path.empty() ? "" : ":") + std::string(old);
  }

  ScriptRunResult result;
  result.exit_codes.assign(static_cast<std::size_t>(o.workers), -1);
  std::vector<pid_t> pids(static_cast<std::size_t>(o.workers), -1);
  auto terminate = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) kill(-p, sig);  // its process group: the script and whatever it started
    }
  };
  for (int r = 0; r < o.workers; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      terminate(SIGKILL);
      for (pid_t p : pids) {
        if (p > 0) waitpid(p, nullptr, 0);
      }
      return io_error("fork failed");
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (getppid() == 1) _exit(125);
      if (cluster) {
        Status st = runtime::NetnsCluster::enter(cluster->namespace_name(r));
        if (!st.is_ok()) {
          dprintf(2, "quicksilver run: %s\n", st.message().c_str());
          _exit(126);
        }
        setenv("GLOO_SOCKET_IFNAME", cluster->interface_name(r).c_str(), 1);
      }
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(o.workers).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(o.workers).c_str(), 1);
      setenv("MASTER_ADDR", master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!python_path.empty()) setenv("PYTHONPATH", python_path.c_str(), 1);
      for (const auto& [name, value] : o.env) setenv(name.c_str(), value.c_str(), 1);
      // As torchrun does: N processes on one machine, one thread each unless told.
      setenv("OMP_NUM_THREADS", "1", 0);
      // A Python script runs under the interpreter; anything else (a LibTorch program) as is.
      std::vector<std::string> argv_s{o.python, o.script};
      if (!python) argv_s.erase(argv_s.begin());
      argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv_s[0].c_str(), argv.data());
      dprintf(2, "quicksilver run: cannot execute %s\n", argv_s[0].c_str());
      _exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  // The trace's time 0: the processes' start (rate_shaper.h; its first rate is set).
  launch::RateShaper shaper(cluster.get(), o.schedule ? &*o.schedule : nullptr, log);
  shaper.start();
  log("started " + std::to_string(o.workers) + " workers of " + o.script +
      " (MASTER_ADDR=" + master_addr + " MASTER_PORT=" + std::to_string(port) +
      (o.timeout > 0 ? ", timeout " + format_time(o.timeout) : "") + ")");

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point grace_end = Clock::time_point::max();
  int running = o.workers;
  bool termed = false;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < o.workers; ++r) {
        if (pids[static_cast<std::size_t>(r)] != pid) continue;
        pids[static_cast<std::size_t>(r)] = -1;
        --running;
        const int code = exit_code(status);
        result.exit_codes[static_cast<std::size_t>(r)] = code;
        if (code != 0 && result.first_failed < 0 && !termed) {
          result.first_failed = r;
          log("worker " + std::to_string(r) + " exited with status " + std::to_string(code));
          grace_end = Clock::now() + std::chrono::nanoseconds(o.grace);
        }
      }
      continue;
    }
    const auto now = Clock::now();
    const bool late = o.timeout > 0 && now - start > std::chrono::nanoseconds(o.timeout);
    if (late && !result.timed_out) {
      result.timed_out = true;
      log("timeout: terminating the workers still running");
      grace_end = now;
    }
    if (g_script_interrupted && !result.interrupted) {
      result.interrupted = true;
      log("interrupted: terminating the workers");
      grace_end = now;
    }
    if (now >= grace_end && running > 0) {
      if (!termed) {
        log("terminating " + std::to_string(running) + " workers still running");
        terminate(SIGTERM);
        termed = true;
        grace_end = now + std::chrono::seconds(3);
      } else {
        terminate(SIGKILL);
        grace_end = Clock::time_point::max();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace qs
