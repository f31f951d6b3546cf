#include "quicksilver/torch/hooked_compute.h"

#include <algorithm>

#include "quicksilver/core/check.h"

namespace qs::pytorch {

HookedCompute::HookedCompute(Timer& timer, int layers,
                             std::function<void(int, std::int64_t)> on_gate)
    : timer_(timer), on_gate_(std::move(on_gate)) {
  const auto n = static_cast<std::size_t>(layers);
  backwards_.assign(n, 0);
  backward_at_.assign(n, 0);
  gates_.assign(n, 0);
  forwards_.assign(n, 0);
  forward_at_.assign(n, 0);
}

void HookedCompute::run(const ComputeStep& step, TimeNs earliest, Done done) {
  QS_CHECK_MSG(!waiting_, "the loop runs one compute step at a time");
  const auto l = static_cast<std::size_t>(step.layer);
  step_ = step;
  done_ = std::move(done);
  waiting_ = true;
  if (step.pass == Pass::kBackward) {
    if (backwards_[l] > step.iteration) complete(backward_at_[l]);
    return;
  }
  ++gates_[l];
  if (on_gate_) on_gate_(step.layer, step.iteration);
  if (finished_) {
    complete(timer_.now());
  } else if (forwards_[l] > step.iteration) {
    complete(forward_at_[l]);
  }
}

void HookedCompute::backward_done(int layer, TimeNs at) {
  const auto l = static_cast<std::size_t>(layer);
  ++backwards_[l];
  backward_at_[l] = at;
  if (waiting_ && step_.pass == Pass::kBackward && step_.layer == layer &&
      backwards_[l] > step_.iteration) {
    complete(at);
  }
}

void HookedCompute::forward_done(int layer, TimeNs at) {
  const auto l = static_cast<std::size_t>(layer);
  if (forwards_[l] >= gates_[l]) return;  // no open gate: an evaluation pass, not a step
  ++forwards_[l];
  forward_at_[l] = at;
  if (waiting_ && step_.pass == Pass::kForward && step_.layer == layer) complete(at);
}

void HookedCompute::finish() {
  finished_ = true;
  if (waiting_ && step_.pass == Pass::kForward) complete(timer_.now());
}

// Ends the waited-for step. Through the timer, never inside the caller's frame: the loop
// may be inside run() (a step whose hooks reported before it was asked).
void HookedCompute::complete(TimeNs at) {
  waiting_ = false;
  Done d = std::move(done_);
  done_ = nullptr;
  // Steps end in the order the loop ran them: a layer whose hooks reported early (out of
  // order) ends with the step before it.
  const TimeNs end = std::max(at, last_end_);
  last_end_ = end;
  timer_.schedule_at(timer_.now(), [d = std::move(d), end] { d(end); });
}

}  // namespace qs::pytorch
