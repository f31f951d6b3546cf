#include "quicksilver/core/text_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace qs {

Result<std::vector<TwoColumnLine>> parse_two_columns(const std::string& text,
                                                     const std::string& source,
                                                     const std::string& expected) {
  std::vector<TwoColumnLine> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    TwoColumnLine l;
    std::string extra;
    if (!(fields >> l.first)) continue;  // blank
    l.where = source + ":" + std::to_string(lineno);
    if (!(fields >> l.second) || (fields >> extra))
      return invalid_argument(l.where + ": expected " + expected);
    out.push_back(std::move(l));
  }
  return out;
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 when there is none (RFC 3629).
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const std::size_t left = s.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](std::size_t k, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return k < left && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out.push_back('?');
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

Result<std::string> read_text_file(const std::string& path, const std::string& what,
                                   std::int64_t max_bytes) {
  const std::string kind = what.empty() ? "file" : what;
  // O_NONBLOCK: opening a FIFO without a writer must not wait; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return not_found(path + ": no such file");
    return not_found(path + ": cannot open " + kind + ": " + std::strerror(e));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error(path + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return invalid_argument(path + ": is a directory");
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file (" + kind + ")");
  const auto limit_text = [&] {
    return path + ": " + kind + " is larger than the limit of " + std::to_string(max_bytes >> 20) +
           " MiB";
  };
  if (st.st_size > max_bytes) return invalid_argument(limit_text());
  std::string out;
  out.resize(static_cast<std::size_t>(st.st_size) + 1);  // one more: a file that grew is caught
  std::size_t have = 0;
  while (true) {
    if (have == out.size()) {
      if (static_cast<std::int64_t>(have) > max_bytes) return invalid_argument(limit_text());
      out.resize(
          std::min<std::size_t>(out.size() * 2 + 4096, static_cast<std::size_t>(max_bytes) + 1));
    }
    const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error(path + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  if (static_cast<std::int64_t>(have) > max_bytes) return invalid_argument(limit_text());
  out.resize(have);
  return out;
}

}  // namespace qs
