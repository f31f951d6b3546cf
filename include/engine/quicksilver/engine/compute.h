// Compute: the second seam of the training loop. It runs one step of a worker's compute
// chain (the backward of a layer, or a layer's update and forward) and says when it ended.
// Emulated from the profile (EmulatedCompute, below: the simulator and `quicksilver run`),
// or real (PyTorch, torch/: the step is the real backward or forward of a module).
#pragma once

#include <cstdint>
#include <functional>

#include "quicksilver/core/units.h"
#include "quicksilver/engine/timer.h"
#include "quicksilver/engine/trace.h"
#include "quicksilver/model/profile.h"

namespace qs {

enum class Pass : std::uint8_t { kBackward, kForward };

struct ComputeStep {
  Pass pass = Pass::kBackward;
  int layer = 0;               // index into Profile::layers
  std::int64_t iteration = 0;  // the iteration whose backward (or next forward) this is
};

class Compute {
 public:
  // Called once the step ended; `end` is when it ended on the device (for an emulated GPU,
  // when it was due to end, never late by the loop's wake-up latency).
  using Done = std::function<void(TimeNs end)>;
  virtual ~Compute() = default;

  // Runs `step`, starting no earlier than `earliest` (when the loop allowed it; 0 = as
  // soon as the device is free) and never before the previous step ended: the device runs
  // one step at a time, in the order asked. `done` runs on the loop's thread.
  virtual void run(const ComputeStep& step, TimeNs earliest, Done done) = 0;
};

// The GPU emulated from the profile (Mercury V-A assumption 1): each step takes its
// profiled time (backward_ms; update_ms + forward_ms) times `factor`, back to back from
// when the previous one was due to end. The GPU is a separate device, so the waiting uses
// no CPU. Optionally records every step as a span ("bp NAME" / "fp NAME") when it starts,
// and calls `on_backward` when a backward starts (the moment its gradients begin to be
// produced: the known-content tensor source fills them then).
class EmulatedCompute final : public Compute {
 public:
  EmulatedCompute(const Profile& profile, double factor, Timer& timer, SpanRecorder recorder = {},
                  std::function<void(const ComputeStep&)> on_backward = nullptr);
  void run(const ComputeStep& step, TimeNs earliest, Done done) override;
  // The profiled duration of `step` at this device's speed.
  TimeNs duration(const ComputeStep& step) const;
  // The least an iteration takes on it: every layer's backward, update and forward.
  TimeNs iteration_compute() const;

 private:
  const Profile& profile_;
  double factor_;
  Timer& timer_;
  SpanRecorder recorder_;
  std::function<void(const ComputeStep&)> on_backward_;
  TimeNs free_ = -1;  // when the current step is due to end (-1: none ran yet)
  Done done_;         // the running step's callback
};

}  // namespace qs
