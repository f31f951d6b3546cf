#!/usr/bin/env python3
"""Samples a network device's byte counter and prints how fast it ran while busy.

Cross-check for `quicksilver run --netns`: the bridge-side end of host H's veth
(`qs<PID>p<H>`, in the root namespace) receives exactly what host H transmits, so its
rx_bytes is host H's uplink at the link layer. Windows moving more than half the
configured rate count as busy; the median busy rate / configured rate is the uplink's
utilisation while it had data to send, independent of the runtime's own accounting.

Usage (as root, while a run is going; workers are hosts M..M+N-1):
  python3 tools/nic_sampler.py --device qs12345p4 --rate 500Mbps --seconds 5
"""
import argparse
import time


def parse_rate(text):
    units = {"Gbps": 1e9, "Mbps": 1e6, "Kbps": 1e3, "bps": 1}
    for u, f in units.items():
        if text.endswith(u):
            return float(text[: -len(u)]) * f
    raise SystemExit(f"bad rate {text!r} (use bps, Kbps, Mbps or Gbps)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True)
    ap.add_argument("--counter", default="rx_bytes", help="rx_bytes (bridge side = host's uplink) or tx_bytes")
    ap.add_argument("--rate", required=True, help="the configured (shaped) rate, e.g. 500Mbps")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--window-ms", type=float, default=5.0)
    a = ap.parse_args()
    rate = parse_rate(a.rate)
    path = f"/sys/class/net/{a.device}/statistics/{a.counter}"
    samples = []
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        try:
            with open(path) as f:
                samples.append((time.monotonic(), int(f.read())))
        except OSError:
            break  # the device went away: the run ended
        time.sleep(0.0005)
    windows = []
    i = 0
    while i + 1 < len(samples):
        j = i + 1
        while j < len(samples) and samples[j][0] - samples[i][0] < a.window_ms / 1000:
            j += 1
        if j == len(samples):
            break
        (t0, v0), (t1, v1) = samples[i], samples[j]
        windows.append((v1 - v0) * 8 / (t1 - t0) / rate)
        i = j
    busy = sorted(w for w in windows if w > 0.5)
    print(f"{len(samples)} samples, {len(windows)} windows of {a.window_ms} ms, {len(busy)} busy (> 50 % of the rate)")
    if busy:
        q = lambda p: busy[min(len(busy) - 1, int(p * len(busy)))]
        print(f"busy rate / configured rate: median {q(0.5):.3f}, p10 {q(0.1):.3f}, p90 {q(0.9):.3f} "
              f"(link-layer bytes; TCP payload is about 1448/1514 of them)")


if __name__ == "__main__":
    main()
