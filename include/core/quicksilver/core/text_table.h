// Two-column text files: the bandwidth trace ("TIME RATE" lines) and the all-reduce fit
// ("SIZE TIME" lines) share one reader, so that both treat comments, blank lines and
// malformed lines the same way and name the line that is wrong.
#pragma once

#include <string>
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
Result<std::vector<TwoColumnLine>> parse_two_columns(const std::string& text, const std::string& source,
                                                      const std::string& expected);

// The whole file at `path`; not_found "path: cannot open <what>" when it cannot be read.
Result<std::string> read_text_file(const std::string& path, const std::string& what);

}  // namespace qs
