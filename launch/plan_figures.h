// What a plan costs per rank, computed without processes or LibTorch: parameters held, an
// estimate of peak memory, bytes sent per step by primitive, and an estimated step time from
// the FLOPs of each rank's sub-operators and the alpha-beta cost of its communication. `loom plan`
// prints these; bench/model_plans compares plans with them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "exec/lower/path.h"
#include "exec/lower/program.h"
#include "graph/graph.h"

namespace loom::cli {

// Sustained FLOP/s of one device for the step-time estimate: an A100-class GPU at about 40% of
// its bf16 peak.
constexpr double kDeviceFlops = 125e12;

struct RankFigures {
  double parameters = 0;        // elements held
  double param_bytes = 0;       // fp32
  double optimizer_bytes = 0;   // AdamW: 2 copies, SGD with momentum: 1
  double activation_bytes = 0;  // one micro-batch's outputs x the schedule's peak in-flight count
  double peak_bytes = 0;        // params + grads + optimizer + activations
  std::map<std::string, double> sent;  // bytes per step by primitive
  double compute_s = 0;                // per micro-batch: forward + backward (3 x forward FLOPs)
  double comm_s = 0;       // per micro-batch: every adapter step this rank takes part in
  double grad_sync_s = 0;  // per step
};

struct PlanFigures {
  std::vector<RankFigures> ranks;
  double bubble_ratio = 0;  // the pipeline schedule's idle fraction (0 without pipelining)
  // Per step: the slowest rank's micro-batches, stretched by the bubble, plus gradient sync.
  double step_time_s = 0;
  double max_peak_bytes() const;
};

// `peak_units[k]`: the schedule's peak count of in-flight micro-batches on pipeline rank k.
PlanFigures plan_figures(const Config& config, const graph::Graph& planned,
                         const lower::Lowered& lowered, const std::vector<double>& peak_units,
                         double bubble_ratio, const lower::CostModel& cost = {});

std::string human_bytes(double bytes);  // "1.5 GiB"

// Adds to `out`, per primitive, the bytes `rank` sends in the steps of `path` it takes part in,
// `times` over (once per micro-batch, say).
void add_path_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                    double times, std::map<std::string, double>& out);

}  // namespace loom::cli
