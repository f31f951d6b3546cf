// Thread names for the tools people inspect a stuck or slow job with (top -H, perf, gdb,
// py-spy): the runtime's threads say what they are ("qs-link0", "qs-agreement").
#pragma once

#include <pthread.h>

#include <string>

namespace qs {

// Names the calling thread; Linux keeps the first 15 characters.
inline void name_this_thread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace qs
