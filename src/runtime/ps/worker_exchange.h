// The PS worker's Exchange (engine/exchange.h) over the transport: the policy's units
// onto the wire through one Sender across every server connection (Mercury IV-C's sending
// buffer), the acknowledgements and pulls back to the loop (the tensor constructor writes
// each pulled sum into the caller's buffer, widened from the wire's dtype), and the busy
// time the bandwidth monitor reads. The worker (worker.cc) owns the connections, the
// rendezvous and the watchdog, and hands this the frames that answer a push. One thread
// (the worker's event loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../runtime_internal.h"
#include "quicksilver/engine/training_loop.h"
#include "quicksilver/transport/connection.h"
#include "quicksilver/transport/event_loop.h"
#include "quicksilver/transport/sender.h"
#include "worker_parts.h"

namespace qs::runtime {

class WorkerExchange final : public PsExchange {
 public:
  // `buffers` by tensor id (checked against the layout); `record` gets the queueing
  // delays after the warm-up, the acknowledgement round trips and the trace's spans.
  WorkerExchange(const WorkerOptions& opts, const JobLayout& jl, QueueDiscipline discipline,
                 transport::EventLoop& loop, std::vector<TensorBuffer> buffers,
                 WorkerRecord& record);

  // The connections, server s at [s], once the rendezvous made them.
  void set_connections(std::vector<transport::Connection*> conns);
  // Training begins: the loop this exchange answers, and the traffic counted from now.
  void start(TrainingLoop* training);
  // The iteration stamped on pushes and expected of answers.
  void set_iteration(std::int64_t it) { iteration_ = it; }

  // A header from server `s` that answers a push (an acknowledgement or a pull): checked
  // against the units this worker awaits; a pull's payload lands in the tensor's buffer.
  Result<transport::PayloadTarget> on_answer_header(const transport::Header& h, int s);
  // That frame arrived whole: the loop is told.
  Status on_answer(const transport::Header& h, int s);
  // Connection `index` can take bytes again.
  void on_writable(int index);

  // When a push, acknowledgement or pull header last moved (the watchdog's progress).
  TimeNs last_progress() const { return last_progress_; }
  void reset_progress() { last_progress_ = loop_.now(); }
  const OutstandingUnits& outstanding() const { return outstanding_; }

  // ---- PsExchange ----
  Status check(const PushUnit& u) const override;
  void push(const PushUnit& u) override;
  void flush() override;
  Traffic take_traffic(TimeNs now) override;

 private:
  std::string name() const { return "worker " + std::to_string(opts_.worker_id); }
  std::uint64_t bytes_written() const;
  void check_drained();

  const WorkerOptions& opts_;
  const JobLayout& jl_;
  transport::EventLoop& loop_;
  WorkerRecord& record_;
  std::unique_ptr<transport::Sender> sender_;
  std::vector<transport::Connection*> conns_;  // by server id
  TrainingLoop* training_ = nullptr;
  transport::DataRules rules_;
  std::vector<TensorBuffer> buffers_;  // by tensor id
  // Compression (JobOptions::wire_dtype): float32 bytes per wire byte (1: none), and each
  // tensor's bytes on the wire.
  const std::uint64_t wire_scale_;
  std::vector<std::vector<std::byte>> wire_buf_;
  std::int64_t iteration_ = 0;
  TensorId urgent_end_ = 0;
  OutstandingUnits outstanding_;  // pushed this iteration, not yet acked and pulled
  TimeNs last_progress_ = 0;      // the last push, ack or pull header
  static constexpr TimeNs kDrainPoll = 100 * kNsPerUs;
  // Since when the transport holds undelivered bytes (-1: none), and this iteration's
  // total of such time (the bandwidth monitor's busy time).
  TimeNs transport_since_ = -1, transport_total_ = 0;
  transport::EventLoop::TimerId drain_timer_ = 0;
  // This iteration's traffic.
  std::uint64_t bytes_at_start_ = 0;
  Bytes bytes_pushed_ = 0;
  std::int64_t units_pushed_ = 0;
};

}  // namespace qs::runtime
