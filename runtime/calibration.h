// What `loom calibrate` measures on one rank of a calibration run: the matrix products of a
// model's linears (on rank 0 alone, then on every rank at once), a large copy on the device, the
// device's memory, and the time of each collective and of send/recv over the world Comm. Every rank
// of the run measures its compute and copy at the same time as the others (as a training step
// shares the machine); the fitting of these samples into a cost model is launch/calibration.h's
// (LibTorch-free).
//
// This header is plain C++: the `loom` tool reads and writes these values as files.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"

namespace loom::runtime {

// `count` linears y[m, n] = x[m, k] * w[n, k]^T; each costs three products (forward, input
// gradient, weight gradient) of 2 * m * k * n FLOPs.
struct LinearShape {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
  int64_t count = 1;
  bool operator==(const LinearShape& o) const {
    return m == o.m && k == o.k && n == o.n && count == o.count;
  }
};

// The communication primitives calibrated, by the names lower uses for them.
inline const std::vector<std::string>& calibrated_primitives() {
  static const std::vector<std::string> kPrimitives = {"send_recv", "all_reduce", "all_gather",
                                                       "reduce_scatter", "all_to_all"};
  return kPrimitives;
}

struct CalibrationRequest {
  std::string device = "cpu";      // run.device
  std::string precision = "fp32";  // run.precision: the products' dtype
  std::string backend = "gloo";    // comm.backend
  double timeout_s = 60;           // bound of every Comm call
  std::vector<LinearShape> linears;
  std::vector<int64_t> message_bytes;  // what each rank holds before a primitive (its piece)
  int64_t copy_bytes = 256 << 20;      // the local copy's size
  double seconds_per_point = 0.3;      // time spent on one size of one measurement (after warm-up)
  int64_t max_repeats = 50;
};

// One timed primitive: `piece_bytes` held by each of `ranks` members; the median of the repeats.
struct CommSample {
  std::string primitive;  // a name of calibrated_primitives()
  int64_t ranks = 2;
  int64_t piece_bytes = 0;
  double seconds = 0;
};

struct RankMeasurements {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t intra_op_threads = 1;
  std::string device;  // "cpu fp32", "cuda:0 bf16"
  // Per request linear: seconds of one forward, input-gradient and weight-gradient product,
  // every rank computing at once.
  std::vector<std::array<double, 3>> linear_seconds;
  // The same on rank 0 while the others wait (a device computing alone); empty on other ranks.
  std::vector<std::array<double, 3>> alone_linear_seconds;
  // The same with partial_busy_levels(world_size)[i] ranks at once (rank < that number) while
  // the others wait; empty where this rank waited.
  std::vector<std::vector<std::array<double, 3>>> level_linear_seconds;
  double copy_seconds_per_byte = 0;  // a device-to-device copy of copy_bytes
  double memory_bytes = 0;           // what the device offers this rank
  std::vector<CommSample> comm;      // as this rank timed them
};

// How many ranks compute at once in the calibration's partial phases: 2, 4, 8, ... below the
// world size (rank 0 alone and every rank at once are measured besides).
inline std::vector<int64_t> partial_busy_levels(int64_t world_size) {
  std::vector<int64_t> levels;
  for (int64_t k = 2; k < world_size; k *= 2) levels.push_back(k);
  return levels;
}

// The device a calibration without a config measures: "cuda" when this process sees a GPU, else
// "cpu".
std::string default_calibration_device();

// Measures this process's rank of a calibration run started by loomrun (or mpirun): sizes the
// intra-op threads as a worker does, selects the device, joins the world over request.backend
// and runs every measurement. Errors name the request field or the failing call.
Result<RankMeasurements> measure_rank(const CalibrationRequest& request);

}  // namespace loom::runtime
