// The interpreter rule (quicksilver/launch/python.h).
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "quicksilver/launch/python.h"

extern char** environ;

namespace qs {
namespace {

bool executable_file(const std::string& p) {
  struct stat st {};
  return !p.empty() && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(p.c_str(), X_OK) == 0;
}

// The first executable `python3` in the colon-separated `path` (an empty entry is the
// current directory, as for execvp), or "".
std::string find_on_path(const std::string& path) {
  std::size_t start = 0;
  while (start <= path.size() && !path.empty()) {
    const std::size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/python3";
    if (executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return {};
}

// Empty when `python` imports torch; else why not: the last line of what it wrote on
// stderr (Python's "ModuleNotFoundError: No module named 'torch'"), or its exit status.
std::string torch_import_error(const std::string& python) {
  if (!executable_file(python)) return "no such executable file";
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::string("pipe failed: ") + std::strerror(errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<std::string> argv_s{python, "-c", "import torch"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return std::string("cannot execute: ") + std::strerror(rc);
  }
  std::string err;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      // Only the end matters (the last line); a long traceback is not kept whole.
      err.append(buf, static_cast<std::size_t>(n));
      if (err.size() > 64 * 1024) err.erase(0, err.size() - 4096);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ' || err.back() == '\r'))
    err.pop_back();
  std::string last = err.substr(err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
  if (last.size() > 200) last = last.substr(0, 200) + "...";
  if (!last.empty()) return "cannot import torch: " + last;
  if (WIFSIGNALED(status))
    return "cannot import torch: killed by signal " + std::to_string(WTERMSIG(status));
  return "cannot import torch: exit status " +
         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && std::filesystem::equivalent(a, b, ec) && !ec;
}

}  // namespace

Result<std::string> choose_python(const PythonSearch& s) {
  if (!s.given.empty()) return s.given;
  std::vector<std::string> tried{"--python: not given"};
  if (s.build.empty()) {
    tried.push_back("the build's: none recorded (built without QS_WITH_TORCH)");
  } else if (executable_file(s.build)) {
    return s.build;
  } else {
    tried.push_back("the build's (" + s.build + "): no such executable file");
  }
  const std::string on_path = find_on_path(s.path);
  std::string rejected;  // the candidate that failed the import, so as not to start it twice
  if (on_path.empty()) {
    tried.push_back("python3 on PATH: none");
  } else if (std::string why = torch_import_error(on_path); why.empty()) {
    return on_path;
  } else {
    tried.push_back("python3 on PATH (" + on_path + "): " + why);
    rejected = on_path;
  }
  if (same_file(rejected, s.system)) {
    tried.push_back(s.system + ": the same as python3 on PATH");
  } else if (std::string why = torch_import_error(s.system); why.empty()) {
    return s.system;
  } else {
    tried.push_back(s.system + ": " + why);
  }
  std::string msg = "no Python interpreter that imports torch (tried ";
  for (std::size_t i = 0; i < tried.size(); ++i) msg += (i > 0 ? "; " : "") + tried[i];
  msg +=
      "): pass --python PATH (an interpreter that imports torch), or install torch "
      "(Debian 12: scripts/setup.sh, as root, installs python3-torch for /usr/bin/python3)";
  return not_found(msg);
}

}  // namespace qs
