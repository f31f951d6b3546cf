// Profiles shared by the simulator tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "quicksilver/core/rng.h"
#include "quicksilver/model/profile.h"
#include "quicksilver/sim/simulator.h"

namespace qs::testing {

// A layer with one fp32 tensor of `bytes` bytes and times in nanoseconds.
inline LayerSpec layer(const std::string& name, TimeNs fwd, TimeNs bwd, Bytes bytes,
                       TimeNs upd = 0) {
  LayerSpec l;
  l.name = name;
  l.forward = fwd;
  l.backward = bwd;
  l.update = upd;
  l.tensors.push_back(TensorSpec{name + ".w", bytes / 4, 4});
  return l;
}

// Mercury paper Fig. 2: three layers, one tensor each, |TS2| > |TS3| > |TS1|. With an
// 8 Gbps link (1 byte per ns) the sizes below take 2, 8 and 4 us; every backward takes
// 3 us and every forward 2 us.
inline Profile mercury_fig2() {
  Profile p;
  p.name = "mercury-fig2";
  p.batch_size = 1;
  p.layers = {layer("l1", 2000, 3000, 2000), layer("l2", 2000, 3000, 8000),
              layer("l3", 2000, 3000, 4000)};
  return p;
}

// A random profile: 1..max_layers layers, 1..3 tensors each, up to max_elements elements
// per tensor, compute times up to max_time.
inline Profile random_profile(Rng& rng, int max_layers = 12, std::int64_t max_elements = 200'000,
                              TimeNs max_time = 2 * kNsPerMs) {
  Profile p;
  p.name = "random";
  p.batch_size = 8;
  const int layers = static_cast<int>(rng.uniform_int(1, max_layers));
  for (int l = 0; l < layers; ++l) {
    LayerSpec s;
    s.name = "l" + std::to_string(l);
    s.forward = rng.uniform_int(0, max_time);
    s.backward = rng.uniform_int(0, max_time);
    s.update = rng.uniform() < 0.3 ? rng.uniform_int(0, max_time / 10) : 0;
    const int tensors = static_cast<int>(rng.uniform_int(1, 3));
    for (int t = 0; t < tensors; ++t) {
      s.tensors.push_back(
          TensorSpec{s.name + "." + std::to_string(t), rng.uniform_int(1, max_elements), 4});
    }
    p.layers.push_back(std::move(s));
  }
  return p;
}

// One worker, one server, 8 Gbps = 1 byte/ns: Mercury V-A's setting, where times in ns
// equal bytes.
inline ClusterConfig one_to_one(TimeNs latency = 0) {
  ClusterConfig c;
  c.workers = 1;
  c.servers = 1;
  c.bandwidth = Rate::gbps(8);
  c.latency = latency;
  return c;
}

// N workers all-reducing over links of `bw` with per-message latency `latency` (MG-WFBP's
// beta and alpha).
inline ClusterConfig allreduce_cluster(int n, Rate bw = Rate::gbps(1),
                                       TimeNs latency = 50 * kNsPerUs) {
  ClusterConfig c;
  c.architecture = Architecture::kAllReduce;
  c.workers = n;
  c.bandwidth = bw;
  c.latency = latency;
  return c;
}

// Simulates with byte verification and returns the iteration time, expecting every
// iteration to be identical (true of the hand-worked scenarios); -1 on an error.
inline TimeNs steady_iteration(const Profile& p, const std::string& policy, const PolicyOptions& o,
                               const ClusterConfig& c, int iterations = 3) {
  SimOptions s;
  s.iterations = iterations;
  s.verify_bytes = true;
  auto r = simulate(p, policy, o, c, s);
  EXPECT_TRUE(r.is_ok()) << policy << ": " << r.status().to_string();
  if (!r.is_ok()) return -1;
  for (TimeNs t : r->iteration_times) EXPECT_EQ(t, r->iteration_time) << policy;
  return r->iteration_time;
}

}  // namespace qs::testing
