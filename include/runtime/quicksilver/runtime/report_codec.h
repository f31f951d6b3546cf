// The worker's report as one line of JSON: what `quicksilver worker --json` prints and the
// launcher (quicksilver/launch/launcher.h) reads back from each child process. One codec
// for both ends, so that a field added to WorkerReport is written and read in one place.
#pragma once

#include <string>
#include <string_view>

#include "quicksilver/core/status.h"
#include "quicksilver/runtime/runtime.h"

namespace qs::runtime {

// One line (no newline), compact JSON; the trace as [track, start_ns, end_ns, name] rows.
std::string report_to_json(const WorkerReport& report);
// Parses a line report_to_json wrote. Fields a report lacks keep WorkerReport's defaults;
// the trace's spans get host = the report's worker id. Errors: not JSON, wrong types.
Result<WorkerReport> report_from_json(std::string_view line);

}  // namespace qs::runtime
