#include "models/evoformer.h"

#include <map>

#include "core/strings.h"
#include "graph/builder.h"

namespace loom::models {
namespace {

using graph::Attrs;
using graph::ParamInit;

// The axis of a representation that dynamic axial parallelism splits for an op.
constexpr int64_t kRows = 1;     // MSA s / pair i: row-wise ops, the starting-node family
constexpr int64_t kColumns = 2;  // MSA r / pair j: column-wise ops, the ending-node family

EvoformerSpec alphafold2(int64_t residues, int64_t seqs) {
  EvoformerSpec s;
  s.blocks = 48;
  s.seqs = seqs;
  s.residues = residues;
  s.c_m = 256;
  s.c_z = 128;
  s.msa_heads = 8;
  s.msa_head_dim = 32;
  s.pair_heads = 4;
  s.pair_head_dim = 32;
  s.opm_hidden = 32;
  s.tri_hidden = 128;
  s.transition = 4;
  s.msa_features = 49;   // AlphaFold2's msa_feat
  s.pair_features = 65;  // one-hot relative positions (clipped at 32)
  s.bins = 64;
  s.init_std = 0.02;
  return s;
}

const std::map<std::string, EvoformerSpec>& presets() {
  static const std::map<std::string, EvoformerSpec> kPresets = {
      {"tiny", EvoformerSpec{}},
      {"alphafold2", alphafold2(256, 128)},
      {"alphafold2-384", alphafold2(384, 512)},
  };
  return kPresets;
}

// Writes one Evoformer graph; every op it adds carries the `dap` hint of the current phase.
class EvoformerWriter {
 public:
  EvoformerWriter(const EvoformerSpec& spec, graph::GraphBuilder& b) : s_(spec), b_(b) {}

  void set_axis(int64_t axis) { axis_ = axis; }

  TensorId op(const std::string& type, const std::string& name, const std::vector<TensorId>& in,
              Attrs attrs = {}) {
    attrs.set("dap", axis_);
    return b_.op1(type, name, in, std::move(attrs));
  }
  // 4-D forms of the rank-generic built-in ops.
  TensorId op4(const std::string& type, const std::string& name, const std::vector<TensorId>& in,
               Attrs attrs = {}) {
    attrs.set("ndim", int64_t{4});
    return op(type, name, in, std::move(attrs));
  }
  TensorId layer_norm(const std::string& name, TensorId x, int64_t width) {
    TensorId g = b_.parameter(name + ".w", {width}, ParamInit::ones());
    TensorId beta = b_.parameter(name + ".b", {width}, ParamInit::zeros());
    return op4("layer_norm", name, {x, g, beta}, Attrs{{"eps", s_.ln_eps}});
  }
  // `tp`: how a Megatron-style tensor-parallel plan splits it ("column", "row" or none).
  TensorId linear(const std::string& name, TensorId x, int64_t out_f, int64_t in_f,
                  bool bias = true, const char* tp = "") {
    TensorId w = b_.parameter(name + ".w", {out_f, in_f}, ParamInit::normal(s_.init_std));
    const Attrs hint{{"tp", std::string(tp)}};
    TensorId y = op4("linear", name, {x, w}, hint);
    if (!bias) return y;
    TensorId bb = b_.parameter(name + ".b", {out_f}, ParamInit::zeros());
    return op4("bias_add", name + ".bias", {y, bb}, hint);
  }
  TensorId gated(const std::string& name, TensorId x, TensorId gate_input, int64_t out_f,
                 int64_t in_f) {
    TensorId g = linear(name + ".gate", gate_input, out_f, in_f, true, "column");
    return op("sigmoid_gate", name + ".gated", {x, g});
  }

  // Gated multi-head attention over the normalised `h` (width c) along rows or columns, with
  // an optional per-head bias (AlphaFold2 algorithms 7, 8, 13, 14).
  TensorId attention(const std::string& p, TensorId h, int64_t c, int64_t heads, int64_t d,
                     bool along_rows, const TensorId* bias) {
    const int64_t hd = heads * d;
    std::vector<TensorId> in = {linear(p + ".q", h, hd, c, false, "column"),
                                linear(p + ".k", h, hd, c, false, "column"),
                                linear(p + ".v", h, hd, c, false, "column")};
    if (bias) in.push_back(*bias);
    Attrs attrs{{"d", d}, {"bias", bias != nullptr}};
    TensorId a = op(along_rows ? "row_attention" : "column_attention", p + ".core", in, attrs);
    a = gated(p, a, h, hd, c);
    return linear(p + ".out", a, c, hd, true, "row");
  }

  // The per-head bias projected from the normalised pair.
  TensorId pair_bias(const std::string& p, TensorId z_normed, int64_t heads) {
    return linear(p + ".pair_bias", z_normed, heads, s_.c_z, false);
  }

  TensorId transition(const std::string& p, TensorId x, int64_t c) {
    TensorId h = layer_norm(p + ".ln", x, c);
    h = linear(p + ".fc1", h, s_.transition * c, c, true, "column");
    h = op4("relu", p + ".relu", {h});
    return linear(p + ".fc2", h, c, s_.transition * c, true, "row");
  }

  TensorId outer_product_mean(const std::string& p, TensorId m) {
    TensorId h = layer_norm(p + ".ln", m, s_.c_m);
    TensorId a = linear(p + ".a", h, s_.opm_hidden, s_.c_m);
    TensorId bb = linear(p + ".b", h, s_.opm_hidden, s_.c_m);
    TensorId o = op("outer_product_mean", p + ".core", {a, bb});
    return linear(p + ".out", o, s_.c_z, s_.opm_hidden * s_.opm_hidden);
  }

  // AlphaFold2 algorithms 11 (outgoing) and 12 (incoming).
  TensorId triangle_multiply(const std::string& p, TensorId z, bool outgoing) {
    const int64_t c = s_.tri_hidden;
    TensorId h = layer_norm(p + ".ln", z, s_.c_z);
    TensorId a = gated(p + ".a", linear(p + ".a", h, c, s_.c_z, true, "column"), h, c, s_.c_z);
    TensorId bb = gated(p + ".b", linear(p + ".b", h, c, s_.c_z, true, "column"), h, c, s_.c_z);
    TensorId t = op(outgoing ? "triangle_outgoing" : "triangle_incoming", p + ".core", {a, bb});
    t = layer_norm(p + ".ln_out", t, c);
    t = linear(p + ".out", t, s_.c_z, c, true, "row");
    return gated(p + ".out", t, h, s_.c_z, s_.c_z);
  }

  TensorId residual(const std::string& name, TensorId x, TensorId update) {
    return op4("add", name, {x, update});
  }

 private:
  const EvoformerSpec& s_;
  graph::GraphBuilder& b_;
  int64_t axis_ = kRows;
};

}  // namespace

std::vector<std::string> evoformer_presets() {
  std::vector<std::string> out;
  for (const auto& [k, v] : presets()) out.push_back(k);
  return out;
}

Result<EvoformerSpec> evoformer_spec(const Config& config) {
  auto it = presets().find(config.model.preset);
  if (it == presets().end()) {
    std::string msg = "unknown Evoformer preset '" + config.model.preset + "'";
    std::string close = closest_match(config.model.preset, evoformer_presets());
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return config.error("model.preset", msg + "; presets: " + join(evoformer_presets(), ", "));
  }
  EvoformerSpec s = it->second;
  ModelArgs args(config);
  const std::vector<std::pair<std::string, int64_t*>> ints = {{"blocks", &s.blocks},
                                                              {"seqs", &s.seqs},
                                                              {"residues", &s.residues},
                                                              {"c_m", &s.c_m},
                                                              {"c_z", &s.c_z},
                                                              {"msa_heads", &s.msa_heads},
                                                              {"msa_head_dim", &s.msa_head_dim},
                                                              {"pair_heads", &s.pair_heads},
                                                              {"pair_head_dim", &s.pair_head_dim},
                                                              {"opm_hidden", &s.opm_hidden},
                                                              {"tri_hidden", &s.tri_hidden},
                                                              {"transition", &s.transition},
                                                              {"msa_features", &s.msa_features},
                                                              {"pair_features", &s.pair_features},
                                                              {"bins", &s.bins}};
  std::vector<std::string> known = {"init_std", "ln_eps"};
  for (const auto& [name, ptr] : ints) known.push_back(name);
  LOOM_TRY(args.check_known(known));
  for (const auto& [name, ptr] : ints) {
    LOOM_ASSIGN_OR_RETURN(*ptr, args.get_int(name, *ptr));
    if (*ptr <= 0) {
      const std::string key = config.model.args.count(name) ? "model.args." + name : "model.preset";
      return config.error(key, name + " must be positive, got " + std::to_string(*ptr));
    }
  }
  LOOM_ASSIGN_OR_RETURN(s.init_std, args.get_double("init_std", s.init_std));
  LOOM_ASSIGN_OR_RETURN(s.ln_eps, args.get_double("ln_eps", s.ln_eps));
  if (s.init_std <= 0) return config.error("model.args.init_std", "init_std must be positive");
  if (s.ln_eps <= 0) return config.error("model.args.ln_eps", "ln_eps must be positive");
  return s;
}

Result<graph::Graph> build_evoformer(const EvoformerSpec& s, int64_t batch,
                                     const graph::OpRegistry& registry) {
  graph::GraphBuilder b(registry, "evoformer");
  EvoformerWriter w(s, b);
  TensorId msa_feat =
      b.input("msa_feat", {batch, s.seqs, s.residues, s.msa_features}, DType::kFloat32);
  TensorId pair_feat =
      b.input("pair_feat", {batch, s.residues, s.residues, s.pair_features}, DType::kFloat32);
  TensorId targets = b.input("targets", {batch, s.residues, s.residues}, DType::kInt64, s.bins);

  b.set_layer(graph::kPreLayers);
  w.set_axis(kRows);
  TensorId m = w.linear("embed.msa", msa_feat, s.c_m, s.msa_features);
  w.set_axis(kColumns);
  TensorId z = w.linear("embed.pair", pair_feat, s.c_z, s.pair_features);

  for (int64_t l = 0; l < s.blocks; ++l) {
    b.set_layer(l);
    const std::string p = "evo" + std::to_string(l) + ".";
    // The pair bias of the MSA row attention is projected where z lies (split on columns
    // after the pair transition); the attention gathers it whole.
    w.set_axis(kColumns);
    TensorId bias =
        w.pair_bias(p + "msa_row", w.layer_norm(p + "msa_row.pair_ln", z, s.c_z), s.msa_heads);
    w.set_axis(kRows);
    TensorId h = w.layer_norm(p + "msa_row.ln", m, s.c_m);
    m = w.residual(p + "msa_row.residual", m,
                   w.attention(p + "msa_row", h, s.c_m, s.msa_heads, s.msa_head_dim, true, &bias));
    w.set_axis(kColumns);
    h = w.layer_norm(p + "msa_col.ln", m, s.c_m);
    m = w.residual(
        p + "msa_col.residual", m,
        w.attention(p + "msa_col", h, s.c_m, s.msa_heads, s.msa_head_dim, false, nullptr));
    m = w.residual(p + "msa_transition.residual", m, w.transition(p + "msa_transition", m, s.c_m));
    w.set_axis(kRows);
    z = w.residual(p + "opm.residual", z, w.outer_product_mean(p + "opm", m));
    z = w.residual(p + "tri_mul_out.residual", z, w.triangle_multiply(p + "tri_mul_out", z, true));
    w.set_axis(kColumns);
    z = w.residual(p + "tri_mul_in.residual", z, w.triangle_multiply(p + "tri_mul_in", z, false));
    w.set_axis(kRows);
    h = w.layer_norm(p + "tri_att_start.ln", z, s.c_z);
    bias = w.pair_bias(p + "tri_att_start", h, s.pair_heads);
    z = w.residual(
        p + "tri_att_start.residual", z,
        w.attention(p + "tri_att_start", h, s.c_z, s.pair_heads, s.pair_head_dim, true, &bias));
    w.set_axis(kColumns);
    h = w.layer_norm(p + "tri_att_end.ln", z, s.c_z);
    bias = w.pair_bias(p + "tri_att_end", h, s.pair_heads);
    z = w.residual(
        p + "tri_att_end.residual", z,
        w.attention(p + "tri_att_end", h, s.c_z, s.pair_heads, s.pair_head_dim, false, &bias));
    z = w.residual(p + "pair_transition.residual", z,
                   w.transition(p + "pair_transition", z, s.c_z));
  }

  b.set_layer(graph::kPostLayers);
  w.set_axis(kColumns);
  TensorId logits = w.linear("distogram", z, s.bins, s.c_z);
  TensorId loss =
      w.op("cross_entropy", "loss", {logits, targets},
           Attrs{{"normalizer", batch * s.residues * s.residues}, {"ndim", int64_t{4}}});
  b.set_loss(loss);
  return b.finish();
}

Status check_evoformer_parallel(const Config& config, const planner::SpaceSpec& space,
                                const EvoformerSpec& spec) {
  if (space.mesh.tp() > 1 && space.policy == "dap") {
    const std::pair<const char*, int64_t> axes[] = {{"seqs", spec.seqs},
                                                    {"residues", spec.residues}};
    for (const auto& [name, value] : axes)
      if (value % space.mesh.tp() != 0)
        return config.error("parallel.tp",
                            "dynamic axial parallelism " + std::to_string(space.mesh.tp()) +
                                " needs " + name + " (" + std::to_string(value) +
                                ") to be divisible by " + std::to_string(space.mesh.tp()));
  }
  const int64_t stages = space.mesh.pp() * space.chunks;
  if (stages > spec.blocks)
    return config.error(
        "parallel.pp", "parallel.pp (" + std::to_string(space.mesh.pp()) + ") x parallel.chunks (" +
                           std::to_string(space.chunks) + ") = " + std::to_string(stages) +
                           " stages, but the model has " + std::to_string(spec.blocks) + " blocks");
  return Status::success();
}

}  // namespace loom::models
