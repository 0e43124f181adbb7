#include "models/swin.h"

#include <algorithm>
#include <map>

#include "core/strings.h"
#include "graph/builder.h"

namespace loom::models {
namespace {

using graph::Attrs;
using graph::ParamInit;

SwinSpec preset(int64_t image, int64_t patch, int64_t embed, std::vector<int64_t> depths,
                std::vector<int64_t> heads, int64_t window, int64_t classes) {
  SwinSpec s;
  s.image = image;
  s.patch = patch;
  s.embed = embed;
  s.depths = std::move(depths);
  s.heads = std::move(heads);
  s.window = window;
  s.classes = classes;
  return s;
}

// Swin-T/S/B/L as published (ImageNet, 224 px, window 7); the large models of the SuperScaler
// line of work use head size 32.
const std::map<std::string, SwinSpec>& presets() {
  static const std::map<std::string, SwinSpec> kPresets = {
      {"tiny", preset(32, 2, 16, {2, 2}, {2, 4}, 4, 10)},
      {"swin-t", preset(224, 4, 96, {2, 2, 6, 2}, {3, 6, 12, 24}, 7, 1000)},
      {"swin-s", preset(224, 4, 96, {2, 2, 18, 2}, {3, 6, 12, 24}, 7, 1000)},
      {"swin-b", preset(224, 4, 128, {2, 2, 18, 2}, {4, 8, 16, 32}, 7, 1000)},
      {"swin-l", preset(224, 4, 192, {2, 2, 18, 2}, {6, 12, 24, 48}, 7, 1000)},
      {"swin-1.8b", preset(640, 4, 512, {2, 2, 26, 2}, {16, 32, 64, 128}, 40, 1000)},
      {"swin-6.6b", preset(640, 4, 768, {2, 2, 42, 2}, {24, 48, 96, 192}, 40, 1000)},
      {"swin-6.6b-1536", preset(1536, 4, 768, {2, 2, 42, 2}, {24, 48, 96, 192}, 48, 1000)},
  };
  return kPresets;
}

Result<std::vector<int64_t>> int_list(const Config& config, const std::string& name,
                                      const std::vector<int64_t>& fallback) {
  if (!config.model.args.count(name)) return fallback;
  std::vector<int64_t> out;
  for (const std::string& field : split(config.model.args.at(name), ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(field.c_str(), &end, 10);
    if (field.empty() || *end != '\0')
      return config.error("model.args." + name,
                          name + " must be a comma-separated list of integers, got '" +
                              config.model.args.at(name) + "'");
    out.push_back(v);
  }
  return out;
}

}  // namespace

int64_t SwinSpec::blocks() const {
  int64_t n = 0;
  for (int64_t d : depths) n += d;
  return n;
}

int64_t SwinSpec::parameter_count() const {
  int64_t n = patch * patch * channels * embed + embed + 2 * embed;  // patch embedding and norm
  for (int64_t i = 0; i < stages(); ++i) {
    const int64_t c = dim(i), w = window_at(i);
    if (i > 0) n += 2 * 2 * c + 2 * c * c;  // merging: norm over 4 x (c/2), reduction to c
    const int64_t block = 2 * c + 3 * (c * c + c) +
                          (2 * w - 1) * (2 * w - 1) * heads[static_cast<size_t>(i)] + c * c + c +
                          2 * c + 2 * mlp_ratio * c * c + mlp_ratio * c + c;
    n += depths[static_cast<size_t>(i)] * block;
  }
  const int64_t last = dim(stages() - 1);
  return n + 2 * last + last * classes + classes;
}

std::vector<std::string> swin_presets() {
  std::vector<std::string> out;
  for (const auto& [k, v] : presets()) out.push_back(k);
  return out;
}

Result<SwinSpec> swin_spec(const Config& config) {
  auto it = presets().find(config.model.preset);
  if (it == presets().end()) {
    std::string msg = "unknown Swin preset '" + config.model.preset + "'";
    std::string close = closest_match(config.model.preset, swin_presets());
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return config.error("model.preset", msg + "; presets: " + join(swin_presets(), ", "));
  }
  SwinSpec s = it->second;
  ModelArgs args(config);
  LOOM_TRY(args.check_known({"image", "channels", "patch", "embed", "depths", "heads", "window",
                             "mlp_ratio", "classes", "init_std", "ln_eps"}));
  LOOM_ASSIGN_OR_RETURN(s.image, args.get_int("image", s.image));
  LOOM_ASSIGN_OR_RETURN(s.channels, args.get_int("channels", s.channels));
  LOOM_ASSIGN_OR_RETURN(s.patch, args.get_int("patch", s.patch));
  LOOM_ASSIGN_OR_RETURN(s.embed, args.get_int("embed", s.embed));
  LOOM_ASSIGN_OR_RETURN(s.depths, int_list(config, "depths", s.depths));
  LOOM_ASSIGN_OR_RETURN(s.heads, int_list(config, "heads", s.heads));
  LOOM_ASSIGN_OR_RETURN(s.window, args.get_int("window", s.window));
  LOOM_ASSIGN_OR_RETURN(s.mlp_ratio, args.get_int("mlp_ratio", s.mlp_ratio));
  LOOM_ASSIGN_OR_RETURN(s.classes, args.get_int("classes", s.classes));
  LOOM_ASSIGN_OR_RETURN(s.init_std, args.get_double("init_std", s.init_std));
  LOOM_ASSIGN_OR_RETURN(s.ln_eps, args.get_double("ln_eps", s.ln_eps));

  auto key = [&](const std::string& name) {
    return config.model.args.count(name) ? "model.args." + name : std::string("model.preset");
  };
  auto n = [](int64_t v) { return std::to_string(v); };
  for (auto [name, value] : std::vector<std::pair<std::string, int64_t>>{{"image", s.image},
                                                                         {"channels", s.channels},
                                                                         {"patch", s.patch},
                                                                         {"embed", s.embed},
                                                                         {"window", s.window},
                                                                         {"mlp_ratio", s.mlp_ratio},
                                                                         {"classes", s.classes}})
    if (value <= 0) return config.error(key(name), name + " must be positive, got " + n(value));
  if (s.init_std <= 0) return config.error(key("init_std"), "init_std must be positive");
  if (s.ln_eps <= 0) return config.error(key("ln_eps"), "ln_eps must be positive");
  if (s.depths.empty()) return config.error(key("depths"), "depths must name at least one stage");
  if (s.heads.size() != s.depths.size())
    return config.error(key("heads"), "heads has " + n(static_cast<int64_t>(s.heads.size())) +
                                          " entries but depths has " +
                                          n(static_cast<int64_t>(s.depths.size())) +
                                          " (one per stage)");
  if (s.image % s.patch != 0)
    return config.error(
        key("patch"), "image (" + n(s.image) + ") is not divisible by patch (" + n(s.patch) + ")");
  for (int64_t i = 0; i < s.stages(); ++i) {
    const std::string at = " at stage " + n(i);
    if (s.depths[static_cast<size_t>(i)] <= 0)
      return config.error(key("depths"), "depths must be positive, got " +
                                             n(s.depths[static_cast<size_t>(i)]) + at);
    const int64_t heads = s.heads[static_cast<size_t>(i)];
    if (heads <= 0 || s.dim(i) % heads != 0)
      return config.error(
          key("heads"),
          "heads (" + n(heads) + ") must divide the stage's features (" + n(s.dim(i)) + ")" + at);
    if (i > 0 && s.resolution(i - 1) % 2 != 0)
      return config.error(key("image"), "patch merging needs an even resolution, got " +
                                            n(s.resolution(i - 1)) + " tokens per side" + at);
    if (s.resolution(i) % s.window_at(i) != 0)
      return config.error(key("window"), "window (" + n(s.window_at(i)) +
                                             ") does not divide the resolution (" +
                                             n(s.resolution(i)) + " tokens per side)" + at);
  }
  return s;
}

Status check_swin_parallel(const Config& config, const planner::SpaceSpec& space) {
  LOOM_ASSIGN_OR_RETURN(SwinSpec s, swin_spec(config));
  const int64_t tp = space.mesh.tp();
  auto n = [](int64_t v) { return std::to_string(v); };
  if (space.policy != "window")
    for (int64_t i = 0; i < s.stages(); ++i)
      for (auto [what, value] : std::vector<std::pair<const char*, int64_t>>{
               {"heads", s.heads[static_cast<size_t>(i)]}, {"MLP width", s.mlp_ratio * s.dim(i)}})
        if (value % tp != 0)
          return config.error("parallel.tp", "tensor parallelism " + n(tp) + " needs the " + what +
                                                 " of stage " + n(i) + " (" + n(value) +
                                                 ") of model.preset (" + config.model.preset +
                                                 ") to be divisible by " + n(tp));
  const int64_t stages = space.mesh.pp() * space.chunks;
  if (stages > s.blocks())
    return config.error("parallel.pp", "parallel.pp (" + n(space.mesh.pp()) +
                                           ") x parallel.chunks (" + n(space.chunks) +
                                           ") = " + n(stages) + " stages, but the model has " +
                                           n(s.blocks()) + " blocks");
  return Status::success();
}

namespace {

Attrs with(Attrs a, std::initializer_list<std::pair<const std::string, graph::AttrValue>> more) {
  for (const auto& [k, v] : more) a.set(k, v);
  return a;
}

// Builds a Swin Transformer's graph in order: the patch embedding, each stage's patch merging
// and blocks, the head and the loss.
class SwinGraph {
 public:
  SwinGraph(const SwinSpec& s, const graph::OpRegistry& registry)
      : s_(s), b_(registry, "swin"), std_(s.init_std) {}

  Result<graph::Graph> build(int64_t batch) {
    TensorId images = b_.input("images", {batch, s_.channels, s_.image, s_.image}, DType::kFloat32);
    TensorId labels = b_.input("labels", {batch}, DType::kInt64, s_.classes);
    TensorId x = embed(images);
    int64_t layer = 0;
    for (int64_t i = 0; i < s_.stages(); ++i) {
      if (i > 0) x = merge(i, layer - 1, x);
      for (int64_t j = 0; j < s_.depths[static_cast<size_t>(i)]; ++j) {
        b_.set_layer(layer++);
        x = block(i, j, x);
      }
    }
    b_.set_loss(head(x, labels, batch));
    return b_.finish();
  }

 private:
  Attrs hints(const char* tp, const char* wp) const {
    Attrs a{{"ndim", int64_t{4}}};
    if (*tp) a.set("tp", std::string(tp));
    if (*wp) a.set("wp", std::string(wp));
    return a;
  }

  // Linear layers on [b, y, x, features] (image layout) or [b, windows, tokens, features]: the
  // window-parallel split `s` is image rows in one and windows in the other.
  TensorId linear(const std::string& name, TensorId in, int64_t out_f, int64_t in_f, const char* tp,
                  bool bias = true) {
    TensorId w = b_.parameter(name + ".w", {out_f, in_f}, ParamInit::normal(std_));
    TensorId y = b_.op1("linear", name, {in, w}, hints(tp, "s"));
    if (!bias) return y;
    TensorId bb = b_.parameter(name + ".b", {out_f}, ParamInit::zeros());
    return b_.op1("bias_add", name + ".bias", {y, bb}, hints(tp, "s"));
  }

  TensorId layer_norm(const std::string& name, TensorId in, int64_t features) {
    TensorId g = b_.parameter(name + ".w", {features}, ParamInit::ones());
    TensorId beta = b_.parameter(name + ".b", {features}, ParamInit::zeros());
    return b_.op1("layer_norm", name, {in, g, beta}, with(hints("", "s"), {{"eps", s_.ln_eps}}));
  }

  TensorId embed(TensorId images) {
    b_.set_layer(graph::kPreLayers);
    TensorId x = b_.op1("patchify", "embed.patches", {images},
                        Attrs{{"ph", s_.patch}, {"pw", s_.patch}, {"wp", std::string("y")}});
    x = linear("embed.proj", x, s_.embed, s_.patch * s_.patch * s_.channels, "");
    return layer_norm("embed.norm", x, s_.embed);
  }

  // Merging belongs to the last block of the previous stage (`layer`), so a pipeline stage
  // boundary between Swin stages sends the merged activation (half the bytes of the unmerged
  // one).
  TensorId merge(int64_t i, int64_t layer, TensorId x) {
    const int64_t c = s_.dim(i);
    const std::string stage = "s" + std::to_string(i) + ".";
    b_.set_layer(layer);
    x = b_.op1("patch_merge", stage + "merge", {x}, Attrs{{"wp", std::string("y")}});
    x = layer_norm(stage + "merge.norm", x, 2 * c);
    return linear(stage + "merge.reduce", x, c, 2 * c, "", false);
  }

  // Block j of stage i: (shifted) window attention and the MLP, each with its residual.
  TensorId block(int64_t i, int64_t j, TensorId x) {
    const int64_t c = s_.dim(i), heads = s_.heads[static_cast<size_t>(i)];
    const int64_t w = s_.window_at(i), grid = s_.resolution(i) / w;
    const std::string p = "s" + std::to_string(i) + ".b" + std::to_string(j) + ".";
    const int64_t shift = j % 2 == 1 ? s_.shift_at(i) : 0;
    // Shifted windows gather tokens from both ends of the image: split channels there.
    const char* window_split = shift > 0 ? "c" : "gy";
    const Attrs win{
        {"wy", w}, {"wx", w}, {"gx", grid}, {"shift", shift}, {"wp", std::string(window_split)}};
    TensorId h = layer_norm(p + "norm1", x, c);
    h = b_.op1("window_partition", p + "attn.windows", {h}, win);
    TensorId q = linear(p + "attn.q", h, c, c, "column");
    TensorId k = linear(p + "attn.k", h, c, c, "column");
    TensorId v = linear(p + "attn.v", h, c, c, "column");
    TensorId table = b_.parameter(p + "attn.bias_table", {(2 * w - 1) * (2 * w - 1), heads},
                                  ParamInit::normal(std_));
    TensorId a = b_.op1("window_attention", p + "attn.core", {q, k, v, table},
                        Attrs{{"d", c / heads},
                              {"window", w},
                              {"shift", shift},
                              {"grid_y", grid},
                              {"grid_x", grid},
                              {"wp", std::string("s")}});
    TensorId o = linear(p + "attn.proj", a, c, c, "row");
    o = b_.op1("window_reverse", p + "attn.unwindows", {o}, win);
    x = b_.op1("add", p + "attn.residual", {x, o}, hints("", "s"));
    h = layer_norm(p + "norm2", x, c);
    TensorId f = linear(p + "mlp.fc1", h, s_.mlp_ratio * c, c, "column");
    f = b_.op1("gelu", p + "mlp.gelu", {f}, hints("column", "s"));
    f = linear(p + "mlp.fc2", f, c, s_.mlp_ratio * c, "row");
    return b_.op1("add", p + "mlp.residual", {x, f}, hints("", "s"));
  }

  // The final norm, pooling, the classifier and the loss.
  TensorId head(TensorId x, TensorId labels, int64_t batch) {
    b_.set_layer(graph::kPostLayers);
    const int64_t last = s_.dim(s_.stages() - 1);
    x = layer_norm("norm", x, last);
    x = b_.op1("mean_pool", "pool", {x}, Attrs{{"wp", std::string("y")}});
    TensorId head_w = b_.parameter("head.w", {s_.classes, last}, ParamInit::normal(std_));
    TensorId head_b = b_.parameter("head.b", {s_.classes}, ParamInit::zeros());
    TensorId logits = b_.op1("linear", "head", {x, head_w}, Attrs{{"ndim", int64_t{2}}});
    logits = b_.op1("bias_add", "head.bias", {logits, head_b}, Attrs{{"ndim", int64_t{2}}});
    return b_.op1("cross_entropy", "loss", {logits, labels},
                  Attrs{{"normalizer", batch}, {"ndim", int64_t{2}}});
  }

  const SwinSpec& s_;
  graph::GraphBuilder b_;
  const double std_;
};

}  // namespace

Result<graph::Graph> build_swin(const SwinSpec& s, int64_t batch,
                                const graph::OpRegistry& registry) {
  return SwinGraph(s, registry).build(batch);
}

}  // namespace loom::models
