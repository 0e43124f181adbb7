// From what `loom calibrate`'s ranks measured (runtime/calibration.h) to a cost model: the
// matrix-product rate weighted by FLOPs, alpha-beta fits per primitive through lower's own
// cost formulas (primitive_rules), the YAML file `cost.file` / `loom plan --cost-model` read,
// and the table printed. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/cost_model.h"
#include "core/result.h"
#include "graph/graph.h"
#include "runtime/calibration.h"

namespace loom::calibrate {

// One measured time as a linear combination of alpha and beta: seconds = a * alpha + b * beta.
struct FitPoint {
  double alpha_coef = 0;
  double beta_coef = 0;
  double seconds = 0;
};

struct AlphaBetaFit {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double rms_relative_residual = 0;  // of the fitted times against the measured ones
  int64_t points = 0;
};

// Least squares of seconds = a * alpha + b * beta over the points, each weighted by 1 / seconds
// (every size counts alike, so latency is fitted from small messages and bandwidth from large
// ones). Needs two points that are not multiples of each other.
Result<AlphaBetaFit> fit_alpha_beta(const std::vector<FitPoint>& points);

// The coefficients of a sample in lower's cost of its primitive (send_recv: alpha + bytes *
// beta), so that a fitted alpha and beta give back the measured time through the same formula.
FitPoint fit_point(const runtime::CommSample& sample);

// The linears of a planned graph, one entry per distinct shape with its count.
std::vector<runtime::LinearShape> linear_shapes(const graph::Graph& planned);

// The products measured without a config: a GPT block's linears at 2048 tokens and hidden 768
// (512 and 512 with `quick`).
std::vector<runtime::LinearShape> default_linear_mix(bool quick);

// Piece sizes from 1 KiB to 64 MiB (1 KiB to 4 MiB with `quick`).
std::vector<int64_t> default_message_bytes(bool quick);

// What one run measured, combined over its ranks.
struct Calibration {
  CostModel model;
  std::string base_preset;  // where the values not measured come from
  AlphaBetaFit intra;       // the fit over every primitive: intra_alpha_s, intra_beta_s_per_byte
  std::vector<std::pair<std::string, AlphaBetaFit>> per_primitive;
  std::vector<double> rank_flops_per_s;  // FLOP-weighted rate of each rank, all at once
  double alone_flops_per_s = 0;          // rank 0's alone (0: not measured)
  double linear_flops = 0;               // FLOPs of one pass over the measured products
  std::vector<std::string> header;       // what was measured, when and on what
};

// Combines every rank's measurements of `request`; `base` gives the link values between nodes,
// which one machine cannot measure. `header` lines go first in the file.
Result<Calibration> combine(const runtime::CalibrationRequest& request,
                            const std::vector<runtime::RankMeasurements>& ranks,
                            const std::string& base_preset, std::vector<std::string> header);

// The cost-model file: a flat mapping of the cost-model keys, each with its measurement in a
// comment; CostModel::parse reads it back.
std::string to_yaml(const Calibration& c);
// The table printed to stdout.
std::string to_table(const Calibration& c);

// The files between `loom calibrate` and its ranks.
std::string request_to_json(const runtime::CalibrationRequest& request);
Result<runtime::CalibrationRequest> request_from_json(const std::string& text);
std::string measurements_to_json(const runtime::RankMeasurements& m);
Result<runtime::RankMeasurements> measurements_from_json(const std::string& text);

}  // namespace loom::calibrate
