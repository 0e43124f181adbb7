// `loom verify`: a config's plan and the single-device run of the same config, side by side for a
// few steps, under the numerical policy of runtime/tolerance.h. Compares every step's loss,
// every parameter piece's gradient and value after every step, and runs the per-op oracle
// (oracle.h) on the plan's sub-operators, so a drifting plan is traced to the first op that
// computes the wrong piece. The plan's ranks run as threads over the local backend, or as the
// processes a launcher started (loomrun, torchrun, mpirun), one rank each. LibTorch-free, for the
// command line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "runtime/oracle_report.h"

namespace loom::launch {

struct Extensions;

// `config` on one device: every parallel setting at its default (dp, tp, pp, chunks 1; no sp,
// zero, recompute, stages or schedule file; the hybrid policy) with the same model, batch, seed
// and data.
Config single_device_config(const Config& config);

// Parameters whose gradient is rounding noise by construction, by a part of their name: a key
// projection's bias shifts every attention score of a query alike, which softmax ignores (GPT,
// Swin: attn.k.b; the Evoformer's pair bias after its norm: msa_row.pair_ln.b). Their
// differences are reported, not judged.
std::vector<std::string> rounding_noise_parameters();

struct VerifyOptions {
  int64_t steps = 3;
  // User ops, kernels, policies and model (the embedding API's); null: loom's built-ins.
  std::shared_ptr<const Extensions> extensions;
  std::vector<std::string> noise = rounding_noise_parameters();
  double comm_timeout_s = 120;  // bounds every collective of the local ranks
  // This process is one rank of a world a launcher started: its Comm comes from comm.* and the
  // launcher's environment (comm/make_comm.h), every process runs the single-device run
  // and its own rank, and all of them gather the whole report.
  bool launched = false;
};

// One step's loss: the plan's (the rank furthest from one device) against one device's.
struct LossDifference {
  int64_t step = 0;  // 1-based
  double plan = 0;
  double single = 0;
  double rel_diff = 0;  // |plan - single| / |single|
  double bound = 0;     // loss_tolerance (bf16 with routing: bf16_routed_loss_tolerance)
  bool ok() const { return rel_diff <= bound; }
};

// The largest difference of one tensor at one step over every piece of every rank.
struct TensorDifference {
  std::string tensor;  // FullTensor name
  std::string kind;    // "gradient" (the step's, as applied) | "parameter" (the value after it)
  int64_t step = 0;    // 1-based
  int64_t rank = 0;    // the rank holding the worst piece
  std::string piece;   // its ranges
  // max |plan - one device| over the piece, relative to the largest |one device| value of the
  // tensor (gradients) or of the piece (parameters).
  double rel_diff = 0;
  // The policy's bound on rel_diff (runtime/tolerance.h): gradient_tolerance for
  // gradients, parameter_tolerance's bound over the same scale for parameters.
  double bound = 0;
  bool judged = true;  // false for rounding-noise parameters
  bool ok() const { return !judged || rel_diff <= bound; }
};

struct VerifyReport {
  std::string plan;  // "dp 2 x tp 1 x pp 1 (hybrid, zero 0, ...)" and its world size
  int64_t world_size = 0;
  std::vector<LossDifference> losses;
  // By step, then gradients before parameters, then the model's tensor order.
  std::vector<TensorDifference> tensors;
  runtime::OracleReport oracle;  // the plan's sub-ops on the one-device run's values
  double oracle_tolerance = 0;   // relative to each piece's largest magnitude
  int64_t tensors_compared = 0;  // pieces compared, over ranks, steps and kinds
  std::string run_error;         // a rank of the plan that failed to run (then nothing else is)
  // Launched ranks: rank 0 alone prints the report and runs the oracle; the others' reports
  // have losses and tensors only.
  bool prints = true;

  bool losses_ok() const;
  bool tensors_ok() const;
  bool ok() const { return run_error.empty() && oracle.ok() && losses_ok() && tensors_ok(); }
  // The first failure: a rank that failed, the oracle's first op, else the first step whose
  // loss differs, else the first tensor that drifts; empty when ok().
  std::string first_failure() const;
};

// Runs `config`'s plan on local ranks (intra-op threads 1) or as this launched process's rank,
// and single_device_config(config), for options.steps steps, and compares them. Errors are user
// mistakes (config, steps, a plan that cannot be made) and a single-device run that fails;
// differences and failing ranks are in the report.
Result<VerifyReport> verify_plan(const Config& config, const VerifyOptions& options = {});

}  // namespace loom::launch
