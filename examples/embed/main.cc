// A program that trains with loom as a library: a model built in code around a custom op
// ("swish", registered with its annotation and a LibTorch kernel), a custom policy name, a
// per-step hook. Run it as one process, or as several ranks under loomrun:
//
//   embed_train embed.yaml parallel.tp=1 --losses one.txt
//   loomrun --nproc-per-node 2 --standalone embed_train embed.yaml --losses two.txt
//
// Flags: --losses FILE (rank 0 writes one loss per line), --plan-dir DIR (rank 0 dumps the plan).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "loom/kernel.h"
#include "loom/loom.h"

namespace {

using loom::graph::Attrs;
using loom::graph::ParamInit;

constexpr int64_t kVocab = 64, kSeq = 16, kHidden = 32, kFfn = 64, kVocabGroups = 8;

// embedding -> [layer norm -> fc1 (column-parallel) -> swish -> fc2 (row-parallel) -> residual]
// -> final norm -> LM head with a vocabulary-parallel loss.
loom::Result<loom::graph::Graph> build_model(const loom::Config&, const loom::GraphShape& shape,
                                             const loom::graph::OpRegistry& ops) {
  const int64_t batch = shape.samples;
  loom::graph::GraphBuilder b(ops, "embed_lm");
  auto tokens = b.input("tokens", {batch, kSeq}, loom::DType::kInt64);
  auto targets = b.input("targets", {batch, kSeq}, loom::DType::kInt64);
  auto wte = b.parameter("wte", {kVocab, kHidden}, ParamInit::normal(0.05));
  auto norm = [&](const std::string& name, loom::TensorId x) {
    auto g = b.parameter(name + ".w", {kHidden}, ParamInit::ones());
    auto beta = b.parameter(name + ".b", {kHidden}, ParamInit::zeros());
    return b.op1("layer_norm", name, {x, g, beta}, Attrs{{"eps", 1e-5}});
  };
  auto linear = [&](const std::string& name, loom::TensorId x, int64_t out, int64_t in,
                    const char* tp) {
    auto w = b.parameter(name + ".w", {out, in}, ParamInit::normal(0.05));
    auto bias = b.parameter(name + ".b", {out}, ParamInit::zeros());
    auto y = b.op1("linear", name, {x, w}, Attrs{{"tp", std::string(tp)}});
    return b.op1("bias_add", name + ".bias", {y, bias}, Attrs{{"tp", std::string(tp)}});
  };

  b.set_layer(loom::graph::kPreLayers);
  auto x = b.op1("embedding", "embed", {tokens, wte});
  b.set_layer(0);
  auto h = linear("fc1", norm("ln1", x), kFfn, kHidden, "column");
  h = b.op1("swish", "swish", {h}, Attrs{{"tp", std::string("column")}});
  x = b.op1("add", "residual", {x, linear("fc2", h, kHidden, kFfn, "row")});
  b.set_layer(loom::graph::kPostLayers);
  auto head = b.parameter("head.w", {kVocab, kHidden}, ParamInit::normal(0.05));
  auto logits =
      b.op1("linear", "head", {norm("lnf", x), head}, Attrs{{"tp", std::string("column")}});
  const Attrs groups{{"v", kVocab / kVocabGroups}};
  auto lse = b.op1("logsumexp", "loss.lse",
                   {b.op1("group_logsumexp", "loss.group_lse", {logits}, groups)});
  auto picked = b.op1("pick", "loss.target", {logits, targets}, groups);
  b.set_loss(b.op1("nll", "loss", {lse, picked}, Attrs{{"normalizer", batch * kSeq}}));
  return b.finish();
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, losses_path, plan_dir;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--losses" && i + 1 < argc)
      losses_path = argv[++i];
    else if (a == "--plan-dir" && i + 1 < argc)
      plan_dir = argv[++i];
    else if (config_path.empty())
      config_path = a;
    else
      overrides.push_back(a);
  }
  if (config_path.empty()) {
    std::fprintf(stderr,
                 "usage: embed_train CONFIG [key=value ...] [--losses FILE] [--plan-dir DIR]\n");
    return 2;
  }

  loom::Setup setup;
  // swish(x) = x * sigmoid(x), element-wise: every dimension may be split.
  loom::Status s = setup.add_op(loom::graph::OpSchema::simple("swish", "b s h -> b s h"));
  if (s.ok())
    s = loom::add_kernel(setup, "swish",
                         [](const loom::KernelContext&, const std::vector<at::Tensor>& in) {
                           return std::vector<at::Tensor>{in[0].mul(in[0].sigmoid())};
                         });
  // The policy: loom's hybrid engine (Megatron-style tp, pipeline stages, dp), under its own name.
  if (s.ok())
    s = setup.add_policy("embed_tp",
                         [](const loom::graph::Graph& g, const loom::planner::PlanRequest& r) {
                           return loom::planner::hybrid_policy(g, r);
                         });
  setup.set_model(build_model);
  if (!s.ok()) {
    std::fprintf(stderr, "embed_train: %s\n", s.error().message.c_str());
    return 1;
  }

  auto trainer = loom::Trainer::from_file(config_path, overrides, setup);
  if (!trainer.ok()) {
    std::fprintf(stderr, "embed_train: error: %s\n", trainer.error().message.c_str());
    return 2;
  }
  loom::Trainer& t = **trainer;
  std::vector<double> losses;
  t.on_step([&](const loom::StepStats& st) {
    losses.push_back(st.loss);
    if (t.rank() == 0)
      std::printf("step %lld loss %.6f\n", static_cast<long long>(st.step), st.loss);
  });
  if (!plan_dir.empty() && t.rank() == 0)
    if (loom::Status d = t.dump_plan(plan_dir); !d.ok()) {
      std::fprintf(stderr, "embed_train: %s\n", d.error().message.c_str());
      return 2;
    }
  if (loom::Status f = t.fit(); !f.ok()) {
    std::fprintf(stderr, "embed_train: rank %lld: %s\n", static_cast<long long>(t.rank()),
                 f.error().message.c_str());
    return 1;
  }
  if (!losses_path.empty() && t.rank() == 0) {
    std::ofstream out(losses_path);
    out.precision(17);
    for (double l : losses) out << l << "\n";
  }
  return 0;
}
