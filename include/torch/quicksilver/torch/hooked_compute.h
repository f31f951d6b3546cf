// HookedCompute: the training loop's Compute seam (engine/compute.h) for a real model whose
// compute runs on another thread (PyTorch's Python thread and its autograd engine). The
// loop keeps running on its worker's event-loop thread; the model's hooks report to it
// through Worker::post() (session.h does the posting), and it opens the model's per-layer
// forward gates through a callback.
//
//   backward of layer l ends when the hooks reported that every parameter of l has its
//     gradient (AccumulateGrad ran for each: backward_done). Layers may complete out of
//     order (a residual block's shortcut); the loop asks in order L..1 and each step ends
//     when its layer is complete, at the time the hooks reported it.
//   forward of layer l (the update of its parameters and its forward) starts when the
//     loop runs it: run() opens the layer's gate (on_gate), which wakes the model's forward
//     pre-hook; it ends when the model's thread passed the layer (forward_done: it reached
//     the next layer's pre-hook, or the end of the model's forward). Extra forward passes
//     without a backward between them (evaluation) report forward_done again; a report
//     without an open gate to consume is not a training step and is ignored.
//
// Independent of the Exchange: the same compute drives a parameter-server worker and an
// all-reduce one. Loop thread only (everything here), except construction.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "quicksilver/engine/compute.h"
#include "quicksilver/engine/timer.h"

namespace qs::pytorch {

class HookedCompute final : public Compute {
 public:
  // `on_gate(layer, iteration)`: the loop let layer's forward of the pass after
  // `iteration`'s backward start (called on the loop thread).
  HookedCompute(Timer& timer, int layers,
                std::function<void(int layer, std::int64_t iteration)> on_gate);

  void run(const ComputeStep& step, TimeNs earliest, Done done) override;

  // Every parameter of `layer` got its gradient of the layer's next backward, at `at`.
  void backward_done(int layer, TimeNs at);
  // The model's thread passed `layer`'s forward at `at`.
  void forward_done(int layer, TimeNs at);
  // No more compute comes (training ended): forward steps end at once, pending and later
  // ones; a backward step never ends (TrainingLoop::finish_early ends the run before it).
  void finish();

  // Backward passes reported complete, per layer (for tests).
  std::int64_t backwards(int layer) const { return backwards_[static_cast<std::size_t>(layer)]; }

 private:
  void complete(TimeNs at);

  Timer& timer_;
  std::function<void(int, std::int64_t)> on_gate_;
  std::vector<std::int64_t> backwards_;  // backward passes complete, per layer
  std::vector<TimeNs> backward_at_;      // when the latest one completed
  std::vector<std::int64_t> gates_;      // forward steps run (gates opened), per layer
  std::vector<std::int64_t> forwards_;   // forward steps the model passed, per layer
  std::vector<TimeNs> forward_at_;
  bool finished_ = false;
  TimeNs last_end_ = 0;  // when the previous step ended
  // The step the loop waits for (one at a time), and its callback.
  bool waiting_ = false;
  ComputeStep step_;
  Done done_;
};

}  // namespace qs::pytorch
