"""Staging: the one component that moves a gradient between where the model keeps it and
where the transport reads it (issue "Seams for the next engines", item 1).

The transport reads gradients from, and writes sums into, host float32 memory (the
registry's TensorBuffer, include/runtime/quicksilver/runtime/tensors.h). A float32
tensor on the host is used in place: its own .grad storage is registered, no copy (the
fast path). Any other tensor (on a GPU, or bf16/fp16) is staged: a host float32 buffer of
its size is registered instead, pinned when the tensor is on CUDA so that both copies are
asynchronous DMA. One contract, per staged tensor t:

  to_wire(t, grad)   Staging copies the gradient into host[t] and then tells the session
                     (ready(t): Session.gradient_ready). On CUDA the copy runs on
                     Staging's device-to-host stream after an event recorded on the stream
                     that produced the gradient (never a device-wide synchronise), and
                     ready(t) comes from Staging's waiter thread once the copy's event has
                     completed; the model's thread goes on meanwhile. On the host the copy
                     (and its dtype conversion) is done at once, then ready(t). The
                     transport reads host[t] only after ready(t).
  from_wire(t, grad, divisor)
                     The session said the sum is in host[t] (sum_ready): Staging divides
                     it there by `divisor` (in float32: an average of float16 gradients
                     whose sum would overflow still fits), then copies it into grad. On
                     CUDA the copy runs on Staging's host-to-device stream and the caller's
                     current stream waits for it (an event), so the optimizer step that
                     follows on that stream is ordered after it without blocking the host.
                     host[t] is written next by the next to_wire, whose copy is ordered
                     after this one (it waits for an event recorded on the current stream,
                     which waits for this copy), or by the host itself (DeFT's next merged
                     sum, Session.load_update) only after host_free(t).
  host_free(ts)      Waits until the copies back of tensors ts have read their host
                     buffers (CUDA; at once on the host).
  reported(ts, wait) Whether every gradient of tensors `ts` handed to to_wire was reported
                     (ready) yet; with `wait`, waits for it. The session counts a layer's
                     backward passes by those reports, so a call that depends on the count
                     (a forward's gate, whether a layer's sums are in) must come after this.
  check()            A failure on the waiter thread (the session stopped) is raised here,
                     at the model thread's next call.

Memory: 4 bytes of host memory per element of every staged tensor (pinned on CUDA), plus
nothing on the device (the sums land in .grad).
"""
import os
import queue
import threading
import time

import torch


def needs_staging(p):
    """Whether parameter p's gradient must be staged. QS_FORCE_STAGING=1 stages every
    tensor, and =async also reports CPU copies from the waiter thread, a moment later, as
    on CUDA: the tests drive CPU tensors through the staged path."""
    return p.device.type != "cpu" or p.dtype != torch.float32 or os.environ.get("QS_FORCE_STAGING") in ("1", "async")


class Staging:
    def __init__(self, params, ready):
        """params: the registry's parameters in tensor-id order; ready(t): tells the
        session tensor t's gradient is in its registered buffer."""
        self.ready = ready
        self.staged = [needs_staging(p) for p in params]
        self.cuda = any(p.device.type == "cuda" for p in params)
        self.host = []
        for p, staged in zip(params, self.staged):
            if staged:
                pin = p.device.type == "cuda"
                self.host.append(torch.empty(p.numel(), dtype=torch.float32, pin_memory=pin))
            else:
                self.host.append(None)
        self.error = None
        self.cv = threading.Condition()
        self.handed = [0] * len(params)  # to_wire calls, per tensor (CUDA)
        self.told = [0] * len(params)    # of those, reported (or failed)
        self.back = [None] * len(params) # CUDA: the event of each tensor's last copy back
        self.pending = None
        self.thread = None
        self.deferred = os.environ.get("QS_FORCE_STAGING") == "async"
        if self.cuda:
            device = next(p.device for p in params if p.device.type == "cuda")
            self.d2h = torch.cuda.Stream(device=device)
            self.h2d = torch.cuda.Stream(device=device)
        if self.cuda or self.deferred:
            self.pending = queue.Queue()
            self.thread = threading.Thread(target=self._wait, name="quicksilver-staging", daemon=True)
            self.thread.start()

    def any(self):
        return any(self.staged)

    def registered(self, t, grad):
        """The buffer the session registers for tensor t: host[t], or grad itself."""
        return self.host[t] if self.staged[t] else grad

    def to_wire(self, t, grad):
        if not self.staged[t]:
            self.ready(t)
            return
        host = self.host[t]
        if grad.device.type != "cuda":
            host.copy_(grad.detach().reshape(-1))
            if self.deferred:
                with self.cv:
                    self.handed[t] += 1
                self.pending.put((t, None))
            else:
                self.ready(t)
            return
        produced = torch.cuda.Event()
        produced.record(torch.cuda.current_stream(grad.device))
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(produced)
            host.copy_(grad.detach().reshape(-1), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.d2h)
        with self.cv:
            self.handed[t] += 1
        self.pending.put((t, copied))

    def from_wire(self, t, grad, divisor=1):
        if not self.staged[t]:
            if divisor != 1:
                grad.div_(divisor)
            return
        host = self.host[t]
        if divisor != 1:
            host.div_(divisor)
        if grad.device.type != "cuda":
            with torch.no_grad():
                grad.copy_(host.view_as(grad))
            return
        current = torch.cuda.current_stream(grad.device)
        with torch.cuda.stream(self.h2d):
            # grad was last written on the current stream (the backward, or a zero_()).
            self.h2d.wait_stream(current)
            with torch.no_grad():
                grad.copy_(host.view_as(grad), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.h2d)
        current.wait_event(copied)
        self.back[t] = copied

    def host_free(self, tensors):
        for t in tensors:
            e = self.back[t]
            if e is not None:
                e.synchronize()
                self.back[t] = None

    def _wait(self):
        while True:
            item = self.pending.get()
            if item is None:
                return
            t, copied = item
            try:
                if copied is None:
                    time.sleep(0.002)  # QS_FORCE_STAGING=async: a copy that takes a while
                else:
                    copied.synchronize()  # releases the GIL while it waits
                if self.error is None:
                    self.ready(t)
            except Exception as e:  # the session stopped: raised on the model's thread
                if self.error is None:
                    self.error = e
            with self.cv:
                self.told[t] += 1
                self.cv.notify_all()

    def reported(self, tensors, wait):
        if self.pending is None:
            return True  # every report was made by to_wire itself
        with self.cv:
            done = lambda: self.error is not None or all(self.told[t] == self.handed[t] for t in tensors)
            if wait:
                self.cv.wait_for(done)
            ok = done()
        self.check()
        return ok

    def check(self):
        if self.error is not None:
            raise self.error

    def close(self):
        if self.thread is not None:
            self.pending.put(None)
            self.thread.join()
            self.thread = None
