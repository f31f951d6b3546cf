#include "quicksilver/engine/training_loop.h"

#include <algorithm>

#include "quicksilver/core/check.h"

namespace qs {

// The policies' sinks: a decision is checked, then handed to the exchange at once or,
// after a user-level startup delay, by a timer (followed by a flush of its own).
class TrainingLoop::PsSink final : public PushSink {
 public:
  explicit PsSink(TrainingLoop& loop) : loop_(loop) {}
  void push(const PushUnit& unit, TimeNs delay) override { loop_.push_decision(unit, delay); }

 private:
  TrainingLoop& loop_;
};

class TrainingLoop::CollectiveSinkImpl final : public CollectiveSink {
 public:
  explicit CollectiveSinkImpl(TrainingLoop& loop) : loop_(loop) {}
  void all_reduce(const CollectiveBucket& bucket, TimeNs delay) override {
    loop_.all_reduce_decision(bucket, delay);
  }

 private:
  TrainingLoop& loop_;
};

TrainingLoop::TrainingLoop(const Profile& profile, const TensorLayout& layout, Timer& timer,
                           Compute& compute, Exchange& exchange, LoopOptions options)
    : profile_(profile),
      layout_(layout),
      timer_(timer),
      compute_(compute),
      exchange_(exchange),
      options_(std::move(options)) {
  const auto layers = static_cast<std::size_t>(layout_.num_layers());
  layer_got_.assign(layers, 0);
  ready_at_.assign(layers, -1);
  // An open-ended run (finish_early) gives a large bound: reserve for a plausible run only.
  records_.reserve(static_cast<std::size_t>(std::clamp(options_.iterations, 0, 4096)));
}

TrainingLoop::TrainingLoop(const Profile& profile, const TensorLayout& layout, PsPolicy& policy,
                           Timer& timer, Compute& compute, PsExchange& exchange,
                           LoopOptions options)
    : TrainingLoop(profile, layout, timer, compute, exchange, std::move(options)) {
  ps_ = &policy;
  ps_exchange_ = &exchange;
  ps_sink_ = std::make_unique<PsSink>(*this);
}

TrainingLoop::TrainingLoop(const Profile& profile, const TensorLayout& layout,
                           AllReducePolicy& policy, Timer& timer, Compute& compute,
                           CollectiveExchange& exchange, LoopOptions options)
    : TrainingLoop(profile, layout, timer, compute, exchange, std::move(options)) {
  ar_ = &policy;
  ar_exchange_ = &exchange;
  ar_sink_ = std::make_unique<CollectiveSinkImpl>(*this);
  // Grown as iterations are reduced: an open-ended run (PyTorch) bounds iterations at 2^30.
}

TrainingLoop::~TrainingLoop() = default;

bool TrainingLoop::communicates() const { return ps_ ? ps_->communicates() : ar_->communicates(); }

void TrainingLoop::fail(Status s) {
  if (!error_.is_ok() || s.is_ok()) return;
  error_ = std::move(s);
  if (options_.failed) options_.failed(error_);
}

std::vector<TimeNs> TrainingLoop::durations() const {
  std::vector<TimeNs> out;
  out.reserve(records_.size());
  for (const IterationRecord& r : records_) out.push_back(r.time);
  return out;
}

void TrainingLoop::start() {
  first_backward_at_ = timer_.now();
  last_end_ = first_backward_at_;
  begin_iteration(0);
}

// ---- the compute chain ----

void TrainingLoop::begin_iteration(std::int64_t it) {
  if (options_.before_backward && !options_.before_backward(it)) return;
  iteration_ = it;
  iteration_start_ = last_end_;
  waiting_backward_ = true;
  backward_held_ = false;
  try_backward();
}

void TrainingLoop::try_backward() {
  if (!waiting_backward_) return;
  if (ar_ && ar_->forward_gate() == ForwardGate::kPolicy && !ar_->backward_ready()) {
    backward_held_ = true;
    return;
  }
  waiting_backward_ = false;
  std::fill(layer_got_.begin(), layer_got_.end(), 0);
  std::fill(ready_at_.begin(), ready_at_.end(), -1);
  got_total_ = 0;
  backward_ = true;
  blocked_ = false;
  const TimeNs now = timer_.now();
  if (ps_) {
    // Prophet's bandwidth monitor (Prophet 4.2): the rate the exchange achieved last
    // iteration, bytes over the time it was busy with them. As in Prophet, the policy's
    // own waits do not count: a monitor that saw them as a slower network would make the
    // policy wait longer still.
    if (monitor_.bits_per_second > 0) ps_->on_bandwidth_estimate(monitor_, now);
    ps_->on_iteration_start(iteration_, now, *ps_sink_);
  } else if (options_.start_on_first_gradient) {
    start_pending_ = true;  // on_backward_done
  } else {
    ar_->on_iteration_start(iteration_, now, *ar_sink_);
  }
  exchange_.flush();
  // A backward that waited for its gate starts when the gate opened; otherwise when the
  // previous step ended.
  run_backward(layout_.num_layers() - 1, backward_held_    ? now
                                         : iteration_ == 0 ? first_backward_at_
                                                           : 0);
}

void TrainingLoop::run_backward(int layer, TimeNs earliest) {
  layer_ = layer;
  compute_.run(ComputeStep{Pass::kBackward, layer, iteration_}, earliest,
               [this](TimeNs end) { on_backward_done(end); });
}

void TrainingLoop::on_backward_done(TimeNs end) {
  if (!error_.is_ok()) return;
  last_end_ = end;
  const int l = layer_;
  const TimeNs now = timer_.now();
  if (communicates()) {
    if (ps_) {
      if (const Bytes b = layout_.layer_bytes(l); b > 0) {
        ready_bytes_ += b;
        if (pending_since_ < 0) pending_since_ = now;
      }
      ps_->on_gradient_ready(l, now, *ps_sink_);
    } else {
      if (start_pending_) {
        start_pending_ = false;
        ar_->on_iteration_start(iteration_, now, *ar_sink_);
      }
      ar_->on_gradient_ready(l, now, *ar_sink_);
    }
    exchange_.flush();
  }
  if (l > 0) {
    run_backward(l - 1, 0);
  } else {
    try_forward(0, false);
  }
}

bool TrainingLoop::gate_open(int l) const {
  if (!communicates()) return true;
  const ForwardGate gate = ps_ ? ForwardGate::kPerLayer : ar_->forward_gate();
  switch (gate) {
    case ForwardGate::kAfterAll:
      return got_total_ == layout_.total_bytes();
    case ForwardGate::kPerLayer:
      return layer_got_[static_cast<std::size_t>(l)] == layout_.layer_bytes(l);
    case ForwardGate::kPolicy:
      return ar_->forward_ready(l);
  }
  return true;
}

void TrainingLoop::try_forward(int l, bool was_blocked) {
  layer_ = l;
  backward_ = false;
  if (!gate_open(l)) {
    blocked_ = true;
    return;
  }
  blocked_ = false;
  const TimeNs now = timer_.now();
  if (ps_) {
    ps_->on_forward_start(l, now, *ps_sink_);
  } else {
    ar_->on_forward_start(l, now, *ar_sink_);
  }
  exchange_.flush();
  // The forward starts when its gate opened, or when the previous step ended, whichever is
  // later. A per-layer gate opened when the layer's sums were complete (which an emulated
  // GPU may learn late, after its wake-up); any other gate, when it was found open, which
  // is now if the forward had to wait for it.
  const bool per_layer = ps_ != nullptr || ar_->forward_gate() == ForwardGate::kPerLayer;
  const TimeNs ready = ready_at_[static_cast<std::size_t>(l)];
  const TimeNs earliest = per_layer ? std::max<TimeNs>(ready, 0) : (was_blocked ? now : 0);
  compute_.run(ComputeStep{Pass::kForward, l, iteration_}, earliest,
               [this](TimeNs end) { on_forward_done(end); });
}

void TrainingLoop::on_forward_done(TimeNs end) {
  if (!error_.is_ok()) return;
  last_end_ = end;
  if (layer_ + 1 < layout_.num_layers()) {
    try_forward(layer_ + 1, false);
    return;
  }
  end_iteration(end);
}

void TrainingLoop::end_iteration(TimeNs end) {
  const TimeNs now = timer_.now();
  IterationRecord r;
  r.time = end - iteration_start_;
  if (ps_ && communicates()) end_pending(now);
  r.pushing = pending_total_;
  r.traffic = exchange_.take_traffic(now);
  const auto busy = static_cast<double>(r.traffic.busy);
  if (ps_) {
    r.utilisation = !communicates()      ? 0.0
                    : pending_total_ > 0 ? busy / static_cast<double>(pending_total_)
                                         : 1.0;
    r.gbps = pending_total_ > 0 ? 8.0 * static_cast<double>(r.traffic.wire_bytes) /
                                      static_cast<double>(pending_total_)
                                : 0.0;
    if (r.traffic.busy > 0) {
      // The rate the policy's units move at: the wire's bytes counted as the float32 bytes
      // they carry (with compression, twice as many: the policies plan in float32 bytes).
      monitor_ = Rate{static_cast<std::int64_t>(static_cast<double>(r.traffic.wire_bytes) *
                                                r.traffic.float32_per_wire_byte * 8e9 / busy)};
    }
  } else {
    r.utilisation = r.traffic.window > 0 ? busy / static_cast<double>(r.traffic.window) : 0.0;
  }
  records_.push_back(r);
  ready_bytes_ = handed_bytes_ = 0;
  pending_total_ = 0;
  if (options_.verify_bytes && ps_ && communicates()) {
    const std::string where = "iteration " + std::to_string(iteration_);
    Status s = check_exact_cover(std::move(pushed_), layout_).with_context("push, " + where);
    if (s.is_ok())
      s = check_exact_cover(std::move(pulled_), layout_).with_context("pull, " + where);
    pushed_.clear();
    pulled_.clear();
    if (!s.is_ok()) return fail(s);
  }
  if (options_.iteration_ended) options_.iteration_ended(iteration_);
  if (!error_.is_ok()) return;
  if (iteration_ + 1 < options_.iterations) {
    begin_iteration(iteration_ + 1);
    return;
  }
  end_training(now);
}

void TrainingLoop::end_training(TimeNs now) {
  iteration_ = options_.iterations;
  if (ar_ && communicates()) {
    ar_->on_training_end(now, *ar_sink_);
    exchange_.flush();
  }
  if (options_.finished) options_.finished();
}

void TrainingLoop::finish_early(std::int64_t iterations) {
  if (finished() || !error_.is_ok()) return;
  if (iterations >= 0) {
    if (iterations > iteration_) {  // the loop has those iterations' gradients to go through
      options_.iterations = static_cast<int>(iterations);
      return;
    }
    // iterations == iteration_: the one begun has no gradient and never will (a policy with
    // start_on_first_gradient has not heard of it); fewer would be a driver's error.
    if (iterations < iteration_ || (backward_ && layer_ < layout_.num_layers() - 1)) {
      return fail(internal_error("finish_early: " + std::to_string(iterations) +
                                 " iterations, fewer than the loop computed"));
    }
    options_.iterations = static_cast<int>(iteration_);
    waiting_backward_ = false;
    end_training(timer_.now());
    return;
  }
  // Begun: some backward step of this iteration ended (the chain moved past layer L's
  // backward, or into the forward pass).
  const bool begun = !waiting_backward_ && (!backward_ || layer_ < layout_.num_layers() - 1);
  if (begun) {
    options_.iterations = static_cast<int>(iteration_ + 1);
    return;
  }
  options_.iterations = static_cast<int>(iteration_);
  waiting_backward_ = false;
  end_training(timer_.now());
}

// ---- what the exchange reports ----

void TrainingLoop::on_push_acked(const PushUnit& unit) {
  if (!error_.is_ok()) return;
  ps_->on_push_acked(unit, timer_.now(), *ps_sink_);
  exchange_.flush();
}

void TrainingLoop::on_pulled(const PushUnit& unit, TimeNs at) {
  if (!error_.is_ok()) return;
  if (options_.verify_bytes) pulled_.push_back(unit.chunk);
  const int l = layout_.tensor(unit.chunk.tensor).layer;
  Bytes& got = layer_got_[static_cast<std::size_t>(l)];
  got += unit.chunk.length;
  got_total_ += unit.chunk.length;
  if (got > layout_.layer_bytes(l)) {
    return fail(internal_error("layer " + std::to_string(l) + " pulled more bytes than it has"));
  }
  if (got == layout_.layer_bytes(l)) layer_complete(l, at);
}

void TrainingLoop::layer_complete(int l, TimeNs at) {
  ready_at_[static_cast<std::size_t>(l)] = at;
  if (options_.layer_ready) {
    Status s = options_.layer_ready(l, iteration_);
    if (!s.is_ok()) return fail(std::move(s));
  }
  if (blocked_ && layer_ == l) try_forward(l, true);
}

void TrainingLoop::on_collective_done(const CollectiveBucket& b) {
  if (!error_.is_ok()) return;
  const bool current = b.first_iteration <= iteration_ && iteration_ <= b.last_iteration;
  for (const Chunk& c : b.chunks) {
    for (std::int64_t it = b.first_iteration; it <= b.last_iteration; ++it) {
      const auto i = static_cast<std::size_t>(it);
      if (reduced_per_iteration_.size() <= i) reduced_per_iteration_.resize(i + 1, 0);
      reduced_per_iteration_[i] += c.length;
      if (options_.verify_bytes) {
        if (covered_.size() <= i) covered_.resize(i + 1);
        covered_[i].push_back(c);
      }
    }
    if (current) {
      const int l = layout_.tensor(c.tensor).layer;
      layer_got_[static_cast<std::size_t>(l)] += c.length;
      got_total_ += c.length;
      if (layer_got_[static_cast<std::size_t>(l)] == layout_.layer_bytes(l)) {
        ready_at_[static_cast<std::size_t>(l)] = timer_.now();
        // The layer's sums are in its buffers: its parameters may be updated (PyTorch).
        if (options_.layer_ready) {
          Status s = options_.layer_ready(l, iteration_);
          if (!s.is_ok()) return fail(std::move(s));
        }
      }
    }
  }
  ar_->on_collective_done(b, timer_.now(), *ar_sink_);
  exchange_.flush();
  if (finished()) return;
  if (blocked_ && !backward_ && gate_open(layer_)) try_forward(layer_, true);
  try_backward();
}

void TrainingLoop::feedback(const TrainingFeedback& f) {
  if (!error_.is_ok() || finished() || ar_ == nullptr || !communicates()) return;
  ar_->on_feedback(f, timer_.now(), *ar_sink_);
  exchange_.flush();
}

void TrainingLoop::recheck_gates() {
  if (!error_.is_ok() || finished()) return;
  if (blocked_ && !backward_ && gate_open(layer_)) try_forward(layer_, true);
  try_backward();
}

void TrainingLoop::on_drained(TimeNs at) {
  if (pending_since_ >= 0 && handed_bytes_ >= ready_bytes_) end_pending(at);
}

// Ends the push period at `end`, never before it began.
void TrainingLoop::end_pending(TimeNs end) {
  if (pending_since_ < 0) return;
  end = std::max(end, pending_since_);
  options_.pushing.add(pending_since_, end, "pushing");
  pending_total_ += end - pending_since_;
  pending_since_ = -1;
}

// ---- the policy's decisions ----

void TrainingLoop::push_decision(const PushUnit& unit, TimeNs delay) {
  if (!error_.is_ok()) return;
  if (Status s = ps_exchange_->check(unit); !s.is_ok())
    return fail(s.with_context(std::string(ps_->name())));
  if (delay <= 0) {
    hand_over(unit);  // flushed once the policy callback returns (units compete by priority)
    return;
  }
  const TimeNs due = timer_.now() + delay;
  if (delayed_fifo_.empty() || due >= delayed_fifo_last_) {
    delayed_fifo_.push(unit);
    delayed_fifo_last_ = due;
    timer_.schedule_at(due, [this] {
      const PushUnit front = delayed_fifo_.pop();
      if (!error_.is_ok()) return;
      hand_over(front);
      exchange_.flush();
    });
    return;
  }
  std::uint32_t slot;
  if (delayed_free_.empty()) {
    slot = static_cast<std::uint32_t>(delayed_.size());
    delayed_.push_back(unit);
  } else {
    slot = delayed_free_.back();
    delayed_free_.pop_back();
    delayed_[slot] = unit;
  }
  timer_.schedule_at(due, [this, slot] {
    const PushUnit unit = delayed_[slot];
    delayed_free_.push_back(slot);
    if (!error_.is_ok()) return;
    hand_over(unit);
    exchange_.flush();
  });
}

void TrainingLoop::hand_over(const PushUnit& unit) {
  handed_bytes_ += unit.chunk.length;
  if (options_.verify_bytes) pushed_.push_back(unit.chunk);
  ps_exchange_->push(unit);
}

void TrainingLoop::all_reduce_decision(const CollectiveBucket& bucket, TimeNs delay) {
  if (!error_.is_ok()) return;
  if (Status s = check_bucket(bucket); !s.is_ok()) return fail(std::move(s));
  if (delay <= 0) {
    ar_exchange_->all_reduce(bucket);
    return;
  }
  timer_.schedule_at(timer_.now() + delay, [this, bucket] {
    if (!error_.is_ok()) return;
    ar_exchange_->all_reduce(bucket);
    exchange_.flush();
  });
}

std::string ended_apart(const std::string& going_on, std::int64_t iteration,
                        const std::string& ended, std::int64_t last) {
  return going_on + " iteration " + std::to_string(iteration) + " but " + ended +
         " ended after iteration " + std::to_string(last) +
         ": every worker must train the same number of iterations";
}

Status TrainingLoop::check_bucket(const CollectiveBucket& b) const {
  if (b.chunks.empty()) return internal_error("policy issued an empty collective");
  QS_RETURN_IF_ERROR(ar_exchange_->check(b));
  if (finished() && b.last_iteration >= options_.iterations && b.first_iteration >= 0) {
    // Only a replica's policy (worker 0's decisions, replayed) hears of iterations past this
    // worker's end: worker 0 went on after this worker's loop ended.
    return invalid_argument(ended_apart("worker 0 all-reduces", b.last_iteration, "this worker",
                                        options_.iterations - 1));
  }
  if (b.first_iteration < 0 || b.first_iteration > b.last_iteration ||
      b.last_iteration >= options_.iterations || b.last_iteration > iteration_) {
    return internal_error(
        "policy issued a collective for iterations " + std::to_string(b.first_iteration) + ".." +
        std::to_string(b.last_iteration) + " in iteration " + std::to_string(iteration_));
  }
  for (const Chunk& c : b.chunks) {
    if (c.tensor < 0 || c.tensor >= layout_.num_tensors() || c.offset < 0 || c.length <= 0 ||
        c.end() > layout_.tensor(c.tensor).bytes) {
      return internal_error("policy issued a chunk outside its tensor (tensor " +
                            std::to_string(c.tensor) + ")");
    }
  }
  return Status::ok();
}

Status TrainingLoop::check_complete() const {
  if (!ar_ || !communicates()) return Status::ok();
  for (std::int64_t it = 0; it < iterations_done(); ++it) {  // fewer after finish_early()
    const auto i = static_cast<std::size_t>(it);
    const Bytes got = i < reduced_per_iteration_.size() ? reduced_per_iteration_[i] : 0;
    if (got != layout_.total_bytes()) {
      return internal_error("iteration " + std::to_string(it) + " reduced " + std::to_string(got) +
                            " of " + std::to_string(layout_.total_bytes()) + " gradient bytes");
    }
    if (options_.verify_bytes) {
      QS_RETURN_IF_ERROR(
          check_exact_cover(i < covered_.size() ? covered_[i] : std::vector<Chunk>{}, layout_)
              .with_context("all-reduce, iteration " + std::to_string(it)));
    }
  }
  return Status::ok();
}

// ---- Exchange defaults and the emulated GPU ----

Status PsExchange::check(const PushUnit&) const { return Status::ok(); }
Status CollectiveExchange::check(const CollectiveBucket&) const { return Status::ok(); }

EmulatedCompute::EmulatedCompute(const Profile& profile, double factor, Timer& timer,
                                 SpanRecorder recorder,
                                 std::function<void(const ComputeStep&)> on_backward)
    : profile_(profile),
      factor_(factor),
      timer_(timer),
      recorder_(std::move(recorder)),
      on_backward_(std::move(on_backward)) {}

TimeNs EmulatedCompute::duration(const ComputeStep& step) const {
  const LayerSpec& spec = profile_.layers[static_cast<std::size_t>(step.layer)];
  const TimeNs t = step.pass == Pass::kBackward ? spec.backward : spec.update + spec.forward;
  return scale_time(t, factor_);
}

TimeNs EmulatedCompute::iteration_compute() const {
  TimeNs t = 0;
  for (int l = 0; l < static_cast<int>(profile_.layers.size()); ++l) {
    t += duration(ComputeStep{Pass::kBackward, l, 0}) + duration(ComputeStep{Pass::kForward, l, 0});
  }
  return t;
}

void EmulatedCompute::run(const ComputeStep& step, TimeNs earliest, Done done) {
  if (free_ < 0) free_ = earliest > 0 ? earliest : timer_.now();  // the device's first step
  const TimeNs start = std::max(free_, earliest);
  if (step.pass == Pass::kBackward && on_backward_) on_backward_(step);
  free_ = start + duration(step);
  if (recorder_.enabled()) {
    recorder_.add(start, free_,
                  (step.pass == Pass::kBackward ? "bp " : "fp ") +
                      profile_.layers[static_cast<std::size_t>(step.layer)].name);
  }
  // One step at a time: the callback is kept here, so that the timer's closure stays small.
  done_ = std::move(done);
  timer_.schedule_at(free_, [this, end = free_] {
    Done d = std::move(done_);
    d(end);
  });
}

}  // namespace qs
