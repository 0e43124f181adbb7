// The AlphaFold2 Evoformer stack written as an annotated graph: an MSA representation
// m[b, s, r, c_m] and a pair representation z[b, r, r, c_z] embedded from synthetic features,
// `blocks` Evoformer blocks (MSA row attention with pair bias, MSA column attention, MSA
// transition, outer product mean, triangle multiplication outgoing and incoming, triangle
// attention around the starting and the ending node, pair transition; gated where AlphaFold2
// gates), and a distogram head with cross-entropy on synthetic bin targets.
//
// Every op carries a `dap` hint (1 or 2): the axis of its representation that dynamic axial
// parallelism splits (planner/dap.h): MSA rows (s) for row-wise ops, MSA columns (r) for
// column-wise ops, the pair's first axis for the starting-node family and its second for the
// ending-node family. Linears also carry Megatron `tp` hints (column for projections into
// heads and hidden widths, row for projections back), so the hybrid policy's tensor
// parallelism applies as a baseline.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/space_spec.h"

namespace loom::models {

struct EvoformerSpec {
  int64_t blocks = 2;
  int64_t seqs = 4;      // s: MSA sequences
  int64_t residues = 8;  // r: the crop
  int64_t c_m = 16;      // MSA channels
  int64_t c_z = 8;       // pair channels
  int64_t msa_heads = 2;
  int64_t msa_head_dim = 4;
  int64_t pair_heads = 2;
  int64_t pair_head_dim = 4;
  int64_t opm_hidden = 4;     // outer product mean projection width
  int64_t tri_hidden = 8;     // triangle multiplication width
  int64_t transition = 4;     // transition widening factor
  int64_t msa_features = 7;   // input MSA feature width
  int64_t pair_features = 5;  // input pair feature width
  int64_t bins = 6;           // distogram bins
  double init_std = 0.1;
  double ln_eps = 1e-5;
};

// Preset names: tiny, alphafold2 (crop 256, 128 sequences), alphafold2-384 (crop 384, 512
// sequences, AlphaFold2's fine-tuning shape).
std::vector<std::string> evoformer_presets();
// The preset named by model.preset with model.args applied; errors name the key and its line.
Result<EvoformerSpec> evoformer_spec(const Config& config);
// The graph of one micro-batch of `batch` samples.
Result<graph::Graph> build_evoformer(const EvoformerSpec& spec, int64_t batch,
                                     const graph::OpRegistry& registry);
// Checks parallel degrees against the model: DAP (parallel.tp under policy dap) must divide the
// sequences and the residues, pipeline stages must not outnumber the blocks.
Status check_evoformer_parallel(const Config& config, const planner::SpaceSpec& space,
                                const EvoformerSpec& spec);

}  // namespace loom::models
