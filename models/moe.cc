#include "models/moe.h"

#include <cmath>

#include "graph/ops_moe.h"

namespace loom::models {

using graph::Attrs;
using graph::ParamInit;

bool MoeSpec::is_moe_layer(int64_t layer) const {
  return enabled() && layer >= first_dense && (layer - first_dense) % every == every - 1;
}

int64_t MoeSpec::capacity(int64_t seq) const {
  if (capacity_factor <= 0) return seq;
  const double slots =
      std::ceil(capacity_factor * static_cast<double>(seq * top_k) / static_cast<double>(experts));
  return std::min<int64_t>(seq, std::max<int64_t>(1, static_cast<int64_t>(slots)));
}

int64_t MoeSpec::layer_parameters(int64_t hidden, int64_t projections) const {
  return (experts + shared_experts) * projections * hidden * ffn_hidden + experts * hidden;
}

std::vector<std::string> moe_arg_names() {
  return {"moe.experts",       "moe.top_k",           "moe.every",
          "moe.first_dense",   "moe.ffn_hidden",      "moe.shared_experts",
          "moe.aux_loss_coef", "moe.capacity_factor", "moe.score"};
}

Result<MoeSpec> moe_spec(const Config& config, MoeSpec m, int64_t dense_ffn) {
  ModelArgs args(config);
  auto key = [&](const std::string& name) {
    return config.model.args.count("moe." + name) ? "model.args.moe." + name
                                                  : std::string("model.preset");
  };
  LOOM_ASSIGN_OR_RETURN(m.experts, args.get_int("moe.experts", m.experts));
  LOOM_ASSIGN_OR_RETURN(m.top_k, args.get_int("moe.top_k", m.top_k));
  LOOM_ASSIGN_OR_RETURN(m.every, args.get_int("moe.every", m.every));
  LOOM_ASSIGN_OR_RETURN(m.first_dense, args.get_int("moe.first_dense", m.first_dense));
  LOOM_ASSIGN_OR_RETURN(m.ffn_hidden, args.get_int("moe.ffn_hidden", m.ffn_hidden));
  LOOM_ASSIGN_OR_RETURN(m.shared_experts, args.get_int("moe.shared_experts", m.shared_experts));
  LOOM_ASSIGN_OR_RETURN(m.aux_loss_coef, args.get_double("moe.aux_loss_coef", m.aux_loss_coef));
  LOOM_ASSIGN_OR_RETURN(m.capacity_factor,
                        args.get_double("moe.capacity_factor", m.capacity_factor));
  LOOM_ASSIGN_OR_RETURN(m.score, args.get_string("moe.score", m.score));
  if (m.ffn_hidden == 0) m.ffn_hidden = dense_ffn;
  const bool any = std::any_of(config.model.args.begin(), config.model.args.end(),
                               [](const auto& kv) { return kv.first.rfind("moe.", 0) == 0; });
  if (!m.enabled()) {
    if (m.experts < 0) return config.error(key("experts"), "moe.experts must be >= 0");
    if (any && !config.model.args.count("moe.experts"))
      return config.error("model.args.moe",
                          "model.args.moe is given without moe.experts (the routed experts)");
    return m;
  }
  if (m.top_k < 1 || m.top_k > m.experts)
    return config.error(key("top_k"), "moe.top_k must be in [1, moe.experts (" +
                                          std::to_string(m.experts) + ")], got " +
                                          std::to_string(m.top_k));
  for (auto [name, value] : {std::pair{"every", m.every}, std::pair{"ffn_hidden", m.ffn_hidden}})
    if (value < 1)
      return config.error(key(name), std::string("moe.") + name + " must be positive, got " +
                                         std::to_string(value));
  for (auto [name, value] :
       {std::pair{"first_dense", m.first_dense}, std::pair{"shared_experts", m.shared_experts}})
    if (value < 0)
      return config.error(
          key(name), std::string("moe.") + name + " must be >= 0, got " + std::to_string(value));
  if (!(m.aux_loss_coef >= 0))
    return config.error(key("aux_loss_coef"), "moe.aux_loss_coef must be >= 0");
  if (!(m.capacity_factor >= 0))
    return config.error(key("capacity_factor"), "moe.capacity_factor must be >= 0 (0: dropless)");
  if (m.score != "softmax" && m.score != "sigmoid")
    return config.error(key("score"),
                        "moe.score must be softmax or sigmoid, got '" + m.score + "'");
  return m;
}

Status check_moe_layers(const Config& config, const MoeSpec& moe, int64_t layers) {
  if (!moe.enabled() || moe.first_dense + moe.every - 1 < layers) return Status::success();
  const std::string key = config.model.args.count("moe.first_dense") ? "model.args.moe.first_dense"
                                                                     : std::string("model.preset");
  return config.error(
      key, "moe.first_dense (" + std::to_string(moe.first_dense) +
               (moe.every > 1 ? ") with moe.every (" + std::to_string(moe.every) : std::string()) +
               ") leaves none of the " + std::to_string(layers) +
               " layers with experts: the mixture of " + std::to_string(moe.experts) +
               " experts would never be used; lower it below the layers");
}

Status check_expert_parallel(const Config& config, const planner::SpaceSpec& space,
                             const MoeSpec& moe) {
  const int64_t ep = space.ep;
  if (ep == 1) return Status::success();
  if (!moe.enabled())
    return config.error("parallel.ep", "expert parallelism " + std::to_string(ep) +
                                           " needs a mixture of experts (model.args.moe.experts)");
  if (space.policy != "hybrid")
    return config.error("parallel.ep",
                        "expert parallelism is part of the hybrid policy; "
                        "parallel.policy is '" +
                            space.policy + "'");
  if (moe.experts % ep != 0)
    return config.error("parallel.ep", "expert parallelism " + std::to_string(ep) +
                                           " must divide the experts (" +
                                           std::to_string(moe.experts) + ")");
  return Status::success();
}

MoeOutput add_moe_mlp(graph::GraphBuilder& b, const MoeSpec& m, const std::string& p, TensorId h,
                      int64_t batch, int64_t seq, int64_t hidden, const std::string& activation,
                      double std, double out_std) {
  const int64_t e = m.experts, f = m.ffn_hidden;
  // The router stays replicated under tensor parallelism: every rank routes the same way.
  TensorId router = b.parameter(p + "router.w", {e, hidden}, ParamInit::normal(std));
  TensorId logits = b.op1("linear", p + "router", {h, router}, Attrs{{"tp", std::string()}});
  const int64_t capacity = m.capacity(seq);
  Attrs route{{"top_k", m.top_k}, {"score", m.score}};
  if (m.capacity_factor > 0) route.set("c", capacity);
  TensorId weights = b.op1(graph::kMoeRoute, p + "route", {logits}, route);
  // The slots a balanced router fills per expert and sample: what the estimator counts.
  const int64_t rows = std::min(capacity, (seq * m.top_k + e - 1) / e);
  TensorId buffer = b.op1(graph::kMoeDispatch, p + "dispatch", {h, weights},
                          Attrs{{"c", capacity}, {"rows", rows}});
  auto expert_linear = [&](const std::string& name, TensorId in, int64_t out_f, int64_t in_f,
                           double w_std, const char* tp) {
    TensorId w =
        b.parameter(p + "experts." + name + ".w", {e, out_f, in_f}, ParamInit::normal(w_std));
    return b.op1(graph::kExpertLinear, p + "experts." + name, {in, w},
                 Attrs{{"tp", std::string(tp)}, {"rows", rows}});
  };
  Attrs act{{"tp", std::string("column")}, {"ndim", int64_t{4}}};
  TensorId y;
  if (activation == "swiglu") {
    TensorId gate = expert_linear("gate", buffer, f, hidden, std, "column");
    TensorId up = expert_linear("up", buffer, f, hidden, std, "column");
    TensorId a = b.op1("swiglu", p + "experts.act", {gate, up}, act);
    y = expert_linear("down", a, hidden, f, out_std, "row");
  } else {
    if (activation == "gelu_tanh") act.set("approximate", std::string("tanh"));
    TensorId a = expert_linear("fc1", buffer, f, hidden, std, "column");
    a = b.op1("gelu", p + "experts.act", {a}, act);
    y = expert_linear("fc2", a, hidden, f, out_std, "row");
  }
  MoeOutput out;
  out.out = b.op1(graph::kMoeCombine, p + "combine", {y, weights});
  if (m.aux_loss_coef > 0) {
    const Attrs stats{{"top_k", m.top_k}, {"score", m.score}};
    std::vector<TensorId> load = b.op(graph::kMoeLoadStats, p + "load", {logits}, stats);
    if (load.size() == 2)
      out.aux = b.op1(graph::kMoeAuxLoss, p + "aux_loss", {load[0], load[1]},
                      Attrs{{"coef", m.aux_loss_coef},
                            {"experts", e},
                            {"top_k", m.top_k},
                            {"tokens", batch * seq}});
  }
  return out;
}

TensorId accumulate_aux(graph::GraphBuilder& b, TensorId running, TensorId aux,
                        const std::string& name) {
  if (!aux.valid()) return running;
  if (!running.valid()) return aux;
  return b.op1(graph::kAddLoss, name, {running, aux});
}

TensorId add_aux_loss(graph::GraphBuilder& b, TensorId loss, TensorId aux) {
  if (!aux.valid()) return loss;
  return b.op1(graph::kAddLoss, "loss.total", {loss, aux});
}

}  // namespace loom::models
