#include "calibration.h"

#include <algorithm>

#include "communicator_util.h"
#include "quicksilver/core/units.h"
#include "quicksilver/transport/clock.h"

namespace qs::runtime {

AllReduceCost fit_line(const std::vector<double>& sizes, const std::vector<double>& times) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sx += sizes[i], sy += times[i], sxx += sizes[i] * sizes[i], sxy += sizes[i] * times[i];
  }
  const double den = n * sxx - sx * sx;
  double b = den > 0 ? (n * sxy - sx * sy) / den : 0.0;
  b = std::max(b, 1e-6);
  const double a = std::max(0.0, (sy - b * sx) / n);
  return AllReduceCost{static_cast<TimeNs>(a + 0.5), b};
}

Result<double> agree_at_start(Communicator& comm, const std::string& who, double compute_factor,
                              bool checksums, transport::WireDType wire) {
  // The maximum of x and of -x is the minimum's negation: equal when all agree.
  const double cs = checksums ? 1 : 0;
  const double w = static_cast<double>(wire);
  double v[5] = {compute_factor, cs, 1 - cs, w, -w};
  AllReduceCall call;
  call.checksums = false;
  try {
    comm.all_reduce(Communicator::kControl, v, 5, ReduceOp::kMaxFloat64, call);
  } catch (const std::exception& e) {
    return unavailable(who + ": " + e.what());
  }
  if (v[1] == 1 && v[2] == 1) {
    return invalid_argument(who +
                            ": the workers disagree on checksums (some run with --no-checksum): "
                            "every worker of the job or none");
  }
  if (v[3] != -v[4]) {
    return invalid_argument(who +
                            ": the workers disagree on compression (--compression): every "
                            "worker of the job the same");
  }
  return v[0];
}

Result<AllReduceCost> calibrate_link(Communicator& comm, int link, const CalibrationSettings& s,
                                     const std::string& who, std::string* sweep) {
  const auto now = [] { return transport::SteadyClock::instance().now(); };
  // From 4 KiB up to the model (at most 8 MiB and ~50 ms at the nominal rate): the sizes
  // the policies' buckets take.
  Bytes top = std::min<Bytes>(8 * kMiB, std::max<Bytes>(64 * kKiB, s.model_bytes));
  if (s.bytes_per_second > 0) {
    top = std::min<Bytes>(
        top, std::max<Bytes>(64 * kKiB, static_cast<Bytes>(s.bytes_per_second * 0.05)));
  }
  std::vector<double> sizes;
  for (Bytes b = 4 * kKiB; b < top; b *= 4) sizes.push_back(static_cast<double>(b));
  sizes.push_back(static_cast<double>(top));
  std::vector<float> data(static_cast<std::size_t>(top / 4), 1.0f);
  std::vector<std::byte> scratch;
  std::vector<double> medians;
  AllReduceCall call;
  call.checksums = s.checksums;
  try {
    all_reduce_floats(comm, link, data.data(), 1024, s.wire, scratch, call);  // warm-up
    for (double size : sizes) {
      std::vector<TimeNs> t;
      for (int r = 0; r < s.repeats; ++r) {
        const TimeNs t0 = now();
        all_reduce_floats(comm, link, data.data(), static_cast<std::size_t>(size / 4), s.wire,
                          scratch, call);
        t.push_back(now() - t0);
      }
      std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
      medians.push_back(static_cast<double>(t[t.size() / 2]));
    }
    // Every worker fits the same numbers: the mean of the workers' medians.
    comm.all_reduce(link, medians.data(), medians.size(), ReduceOp::kSumFloat64, call);
  } catch (const std::exception& e) {
    return unavailable(who + ": calibrating link " + std::to_string(link) + ": " + e.what());
  }
  for (double& m : medians) m /= comm.size();
  if (sweep != nullptr) {
    *sweep = "link " + std::to_string(link) + " all-reduce times (mean of the workers' medians):";
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      *sweep += " " + format_size(static_cast<Bytes>(sizes[i])) + " " +
                format_time(static_cast<TimeNs>(medians[i]));
    }
  }
  return fit_line(sizes, medians);
}

}  // namespace qs::runtime
