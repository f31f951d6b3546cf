// Exchange: the third seam of the training loop. It moves a unit of gradient to where it
// is summed and reports when it was delivered and when its sum is back in the worker's
// parameter buffer. Implementations: the simulated parameter-server network and the
// simulated a+bM all-reduce links (sim/), the TCP parameter-server transport and gloo
// collectives (runtime/: Worker::Impl, CollectiveWorker::Impl).
//
// Two interfaces, one per architecture (PsExchange, CollectiveExchange): the one
// TrainingLoop is constructed with a PS policy and a PsExchange or an all-reduce policy
// and a CollectiveExchange, so that mixing them does not compile.
//
// The loop calls push() (PS) or all_reduce() (all-reduce) for each of its policy's
// decisions, once any user-level startup delay has passed, then flush() once the policy
// callback that made them returned, so that units handed over in one callback compete by
// priority. The exchange reports back through the ExchangeListener it was given, always on
// the loop's thread, and never from inside push(), all_reduce() or flush() except
// on_drained() (an exchange may start sending there, but defers completions to its Timer
// or event loop).
#pragma once

#include <algorithm>
#include <cstdint>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"
#include "quicksilver/policy/allreduce_policy.h"
#include "quicksilver/policy/ps_policy.h"

namespace qs {

// What an exchange measured of one iteration (Exchange::take_traffic).
struct Traffic {
  Bytes bytes = 0;            // gradient payload sent (PS: pushed; all-reduce: reduced)
  std::int64_t messages = 0;  // units pushed, or collectives run
  // Bytes put on the uplink, framing included where there is any (the simulator: = bytes,
  // or their compressed size).
  std::uint64_t wire_bytes = 0;
  // How long the uplink (all-reduce: the primary link) was busy with them: in the
  // simulator, the serialisation time; over TCP, the time the transport held bytes its
  // peers had not yet acknowledged (Prophet 4.2 times a push until the server answers).
  // wire_bytes x float32_per_wire_byte / busy is the bandwidth the monitor reports to the
  // policy: the rate its (float32) units move at, compressed or not.
  TimeNs busy = 0;
  // All-reduce only: the time from the iteration's first collective's start to its last
  // one's end on the primary link, over which `busy` is a utilisation (MG-WFBP's model).
  // 0 for PS, whose utilisation the loop measures "while pushing" (Mercury III-B).
  TimeNs window = 0;
  // Float32 bytes a wire byte carries: 1, or 2 with compression (bf16/fp16 on the wire).
  double float32_per_wire_byte = 1.0;
};

// What an all-reduce exchange counts of its collectives until take() (the simulated links
// and gloo alike): bytes and collectives on every link; on the primary link (0) the busy
// time and the window from the first start to the last end (Traffic).
class CollectiveMeter {
 public:
  void add(int link, TimeNs start, TimeNs end, Bytes bytes) {
    if (link == 0) {
      if (first_ < 0) first_ = start;
      last_ = std::max(last_, end);
      busy_ += end - start;
    }
    bytes_ += bytes;
    ++messages_;
  }
  Traffic take() {
    const Traffic t{bytes_, messages_, static_cast<std::uint64_t>(bytes_), busy_,
                    first_ >= 0 && last_ > first_ ? last_ - first_ : 0};
    *this = CollectiveMeter();
    return t;
  }

 private:
  TimeNs first_ = -1, last_ = 0, busy_ = 0;
  Bytes bytes_ = 0;
  std::int64_t messages_ = 0;
};

// Implemented by the training loop.
class ExchangeListener {
 public:
  virtual ~ExchangeListener() = default;
  // PS: the server acknowledged `unit` (it has all of this worker's bytes of it).
  virtual void on_push_acked(const PushUnit& unit) = 0;
  // PS: the sum of `unit` (this iteration's) is in the parameter buffer since `at`.
  virtual void on_pulled(const PushUnit& unit, TimeNs at) = 0;
  // All-reduce: `bucket` was reduced on every worker; its sums are in the buffers.
  virtual void on_collective_done(const CollectiveBucket& bucket) = 0;
  // PS: everything handed over was on the wire by `at` (nothing queued, last byte sent).
  virtual void on_drained(TimeNs at) = 0;
  // PS: whether some gradient made ready this iteration is not yet known to be on the
  // wire (the loop's "while pushing" period is open), and whether every ready byte has
  // been handed to the exchange (only the exchange still holds some).
  virtual bool pushing() const = 0;
  virtual bool all_ready_handed() const = 0;
  // A failure the loop cannot continue past (the first one wins).
  virtual void on_error(Status why) = 0;
};

// What both kinds of exchange offer the loop.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // Starts sending what is queued, most urgent first, as far as the link allows.
  virtual void flush() = 0;
  // This iteration's traffic (the counters restart); `now` ends any busy period still open.
  virtual Traffic take_traffic(TimeNs now) = 0;

 protected:
  Exchange() = default;
};

// A parameter-server exchange: units to their servers, sums pulled back.
class PsExchange : public Exchange {
 public:
  // Queues `unit` for its server. Precondition: check(unit) passed.
  virtual void push(const PushUnit& unit) = 0;
  // What the exchange adds to the engine's checks of a policy's decision (e.g. the wire's
  // 32-bit length field).
  virtual Status check(const PushUnit& unit) const;
};

// An all-reduce exchange: buckets reduced on their links.
class CollectiveExchange : public Exchange {
 public:
  // Queues `bucket` on its link; may start it at once.
  virtual void all_reduce(const CollectiveBucket& bucket) = 0;
  // What the exchange adds to the engine's checks of a bucket (e.g. the number of links).
  virtual Status check(const CollectiveBucket& bucket) const;
};

}  // namespace qs
