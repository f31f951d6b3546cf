#include "quicksilver/core/text_table.h"

#include <fstream>
#include <sstream>

namespace qs {

Result<std::vector<TwoColumnLine>> parse_two_columns(const std::string& text, const std::string& source,
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
    if (!(fields >> l.second) || (fields >> extra)) return invalid_argument(l.where + ": expected " + expected);
    out.push_back(std::move(l));
  }
  return out;
}

Result<std::string> read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open" + (what.empty() ? "" : " " + what));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return ss.str();
}

}  // namespace qs
