// Mixture-of-experts MLPs for the decoders (GPT, Llama): model.args.moe, and the layer as graph
// ops (graph/ops_moe.h): a router, top-k gates, dispatch to the experts' buffer, the experts'
// MLPs as linears with an expert dimension, combine by gate, and the load-balancing loss.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/builder.h"
#include "planner/space_spec.h"

namespace loom::models {

struct MoeSpec {
  int64_t experts = 0;  // routed experts; 0: a dense model
  int64_t top_k = 2;
  // Layer l has experts when l >= first_dense and (l - first_dense) % every == every - 1.
  int64_t every = 1;
  int64_t first_dense = 0;
  int64_t ffn_hidden = 0;      // each expert's MLP width; 0: the model's ffn_hidden
  int64_t shared_experts = 0;  // experts every token goes through (a dense MLP this many wide)
  double aux_loss_coef = 0.01;
  // 0: dropless (every expert has a slot for every token of a sample). Else each expert takes
  // ceil(capacity_factor x seq x top_k / experts) tokens per sample; later tokens are dropped.
  double capacity_factor = 0;
  std::string score = "softmax";  // or "sigmoid"

  bool enabled() const { return experts > 0; }
  bool is_moe_layer(int64_t layer) const;
  // Slots per expert per sample of `seq` tokens.
  int64_t capacity(int64_t seq) const;
  // Routed and shared expert parameters of one layer of width `hidden` with `projections`
  // weight matrices per MLP (3 for SwiGLU, 2 for GELU), the router included.
  int64_t layer_parameters(int64_t hidden, int64_t projections) const;
};

// model.args.moe.* ("moe: {experts: 8, top_k: 2}") over `preset`; `dense_ffn` fills ffn_hidden
// when it is not given. Errors name the key.
Result<MoeSpec> moe_spec(const Config& config, MoeSpec preset, int64_t dense_ffn);
// The model.args names moe_spec reads ("moe.experts", ...).
std::vector<std::string> moe_arg_names();
// A mixture needs a layer with experts among the model's `layers` (moe.first_dense and
// moe.every place them); the error names moe.first_dense.
Status check_moe_layers(const Config& config, const MoeSpec& moe, int64_t layers);
// parallel.ep against the experts: ep divides them; ep above 1 needs experts. Errors name keys.
Status check_expert_parallel(const Config& config, const planner::SpaceSpec& space,
                             const MoeSpec& moe);

// What the MoE MLP of one layer adds to the graph.
struct MoeOutput {
  TensorId out;  // [b, s, hidden]: routed experts' outputs combined (shared experts excluded)
  TensorId aux;  // the layer's load-balancing loss; invalid where aux_loss_coef is 0
};

// The routed experts of a layer over normalised input `h` [batch, seq, hidden]: activation
// "swiglu" (gate, up, down) or "gelu" / "gelu_tanh" (fc1, fc2); parameters "<prefix>router.w",
// "<prefix>experts.<proj>.w". Linears write with init std `std`, the output projection `out_std`.
MoeOutput add_moe_mlp(graph::GraphBuilder& b, const MoeSpec& moe, const std::string& prefix,
                      TensorId h, int64_t batch, int64_t seq, int64_t hidden,
                      const std::string& activation, double std, double out_std);

// `loss` plus the layers' auxiliary losses summed along the way (`aux`, invalid: none).
TensorId add_aux_loss(graph::GraphBuilder& b, TensorId loss, TensorId aux);
// Accumulates one layer's auxiliary loss into the running sum (`running` invalid: the first).
TensorId accumulate_aux(graph::GraphBuilder& b, TensorId running, TensorId aux,
                        const std::string& name);

}  // namespace loom::models
