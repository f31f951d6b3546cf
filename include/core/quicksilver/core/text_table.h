// Two-column text files: the bandwidth trace ("TIME RATE" lines) and the all-reduce fit
// ("SIZE TIME" lines) share one reader, so that both treat comments, blank lines and
// malformed lines the same way and name the line that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"

namespace qs {

struct TwoColumnLine {
  std::string first, second;
  std::string where;  // "source:line", for errors about the values
};

// The lines of `text` that hold two whitespace-separated fields. `#` starts a comment;
// blank lines are skipped. A line with one field or more than two is an error
// "source:line: expected <expected>" (expected names the form, quotes included).
Result<std::vector<TwoColumnLine>> parse_two_columns(const std::string& text,
                                                     const std::string& source,
                                                     const std::string& expected);

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF). Names that reach JSON output must be: the JSON writer refuses anything else.
bool is_valid_utf8(std::string_view s);
// `s` with every byte that is not part of well-formed UTF-8 replaced by '?' (for names
// taken from outside, such as a file name).
std::string sanitize_utf8(std::string_view s);

// Input files are bounded before they are read: a device (/dev/zero), a FIFO or a file
// larger than `max_bytes` is refused without reading (or blocking on) it.
inline constexpr std::int64_t kMaxTextFileBytes = std::int64_t{16} << 20;  // 16 MiB

// The whole regular file at `path`, at most `max_bytes` long. Errors: not_found "path: no
// such file" (or "path: cannot open <what>: <reason>"); invalid_argument "path: is a
// directory", "path: not a regular file (<what>)", "path: <what> is larger than the limit
// of N MiB". Never blocks: the file is opened O_NONBLOCK and checked with fstat first.
Result<std::string> read_text_file(const std::string& path, const std::string& what,
                                   std::int64_t max_bytes = kMaxTextFileBytes);

}  // namespace qs
