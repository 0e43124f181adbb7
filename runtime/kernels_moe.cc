#include "runtime/kernels_moe.h"

#include <ATen/ATen.h>

#include <string>

#include "core/check.h"

namespace loom::runtime {
namespace {

using Ctx = KernelContext;
using Tensors = std::vector<at::Tensor>;

// Normalised router scores in float32: softmax over the experts, or sigmoid scores divided by
// their sum (DeepSeek-V3's affinities).
at::Tensor scores_of(const Ctx& ctx, const at::Tensor& logits) {
  const std::string score = ctx.op.attrs().get_or<std::string>("score", "softmax");
  const at::Tensor x = logits.to(at::kFloat);
  return score == "sigmoid" ? at::sigmoid(x) : at::softmax(x, -1);
}

int64_t top_k(const Ctx& ctx, const at::Tensor& scores) {
  return std::min(ctx.op.attrs().get<int64_t>("top_k"), scores.size(-1));
}

// 1 where a token chose an expert (its top_k scores), else 0, float32 [b, s, e].
at::Tensor choices(const at::Tensor& scores, int64_t k) {
  return at::zeros_like(scores).scatter(-1, std::get<1>(scores.topk(k, -1)), 1.0);
}

Tensors moe_route(const Ctx& ctx, const Tensors& in) {
  const at::Tensor scores = scores_of(ctx, in[0]);
  const int64_t k = top_k(ctx, scores);
  auto [top, index] = scores.topk(k, -1);
  const bool sigmoid = ctx.op.attrs().get_or<std::string>("score", "softmax") == "sigmoid";
  if (ctx.op.attrs().get_or<int64_t>("normalize", sigmoid || k > 1 ? 1 : 0) != 0)
    top = top / top.sum(-1, true);
  at::Tensor weights = at::zeros_like(scores).scatter(-1, index, top);
  const int64_t capacity = ctx.op.attrs().get_or<int64_t>("c", 0);
  if (capacity > 0) {
    // A token keeps an expert while fewer than `capacity` earlier tokens of its sample did.
    const at::Tensor chosen = at::zeros_like(scores).scatter(-1, index, 1.0);
    const at::Tensor keep = chosen.cumsum(1) <= static_cast<double>(capacity);
    weights = weights * keep.to(at::kFloat);
  }
  return {weights};
}

// The routed (sample, token, expert) triples of combine weights [b, s, e], in sample, token,
// expert order, with each one's slot: the number of earlier tokens of its sample routed to the
// same expert.
struct Routes {
  at::Tensor sample, token, expert, slot;
};

Routes routes_of(const at::Tensor& weights) {
  const at::Tensor routed = weights != 0;
  const at::Tensor slot = routed.to(at::kLong).cumsum(1) - 1;
  const at::Tensor where = routed.nonzero();  // [n, 3]
  Routes r{where.select(1, 0), where.select(1, 1), where.select(1, 2), at::Tensor()};
  r.slot = slot.index({r.sample, r.token, r.expert});
  return r;
}

Tensors moe_dispatch(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& x = in[0];  // [b, s, m]
  const int64_t capacity = ctx.op.attrs().get<int64_t>("c");
  // moe_route keeps at most `capacity` tokens per expert and sample, so every slot is in range
  // (LibTorch's index check stands behind it); no host read here.
  const Routes r = routes_of(in[1]);
  at::Tensor out = at::zeros({x.size(0), in[1].size(2), capacity, x.size(2)}, x.options());
  return {out.index_put({r.sample, r.expert, r.slot}, x.index({r.sample, r.token}))};
}

// [b, e, c, k] x [e, n, k] per expert, on the filled slots only (grouped: each expert's rows of
// every sample in one matrix product). A slot is filled up to the last non-zero one of its
// (sample, expert): the rest are 0 in and 0 out (no bias), in the forward and in the backward,
// so a dropless buffer costs the routed tokens' work, not the slots'.
Tensors expert_linear(const Ctx&, const Tensors& in) {
  const at::Tensor& x = in[0];
  const at::Tensor& w = in[1];
  const int64_t b = x.size(0), e = x.size(1), c = x.size(2), k = x.size(3), n = w.size(1);
  const auto longs = x.options().dtype(at::kLong);
  const at::Tensor counts = ((x != 0).any(-1).to(at::kLong) * at::arange(1, c + 1, longs)).amax(-1);
  const at::Tensor filled = at::arange(c, longs).view({1, 1, c}) < counts.unsqueeze(-1);
  const at::Tensor keep = filled.transpose(0, 1).reshape({-1});  // expert-major [e * b * c]
  const at::Tensor where = keep.nonzero().squeeze(1);
  const at::Tensor per_expert = filled.sum(std::vector<int64_t>{0, 2}).cpu();  // one host read
  const at::Tensor rows = x.transpose(0, 1).reshape({e * b * c, k}).index_select(0, where);
  // Split once (one gradient each in the backward, not a full-size one per expert).
  std::vector<int64_t> sizes;
  for (int64_t j = 0; j < e; ++j) sizes.push_back(per_expert[j].item<int64_t>());
  const std::vector<at::Tensor> weights = w.unbind(0);
  const std::vector<at::Tensor> blocks = rows.split_with_sizes(sizes);
  std::vector<at::Tensor> out_rows;
  for (int64_t j = 0; j < e; ++j)
    if (sizes[static_cast<size_t>(j)] > 0)
      out_rows.push_back(
          at::matmul(blocks[static_cast<size_t>(j)], weights[static_cast<size_t>(j)].t()));
  at::Tensor out = at::zeros({e * b * c, n}, x.options());
  if (!out_rows.empty()) out = out.index_copy(0, where, at::cat(out_rows));
  return {out.view({e, b, c, n}).transpose(0, 1).contiguous()};
}

Tensors moe_combine(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& y = in[0];        // [b, e, c, m]
  const at::Tensor& weights = in[1];  // [b, s, e]
  const Routes r = routes_of(weights);
  const at::Tensor gate = weights.index({r.sample, r.token, r.expert}).to(y.scalar_type());
  const at::Tensor rows = y.index({r.sample, r.expert, r.slot}) * gate.unsqueeze(1);
  at::Tensor out = at::zeros({weights.size(0), weights.size(1), y.size(3)}, y.options());
  return {out.index_put({r.sample, r.token}, rows, /*accumulate=*/true)};
}

Tensors moe_load_stats(const Ctx& ctx, const Tensors& in) {
  const at::Tensor scores = scores_of(ctx, in[0]);
  const at::Tensor normalised = scores / scores.sum(-1, true);
  const std::vector<int64_t> tokens = {0, 1};
  return {choices(scores, top_k(ctx, scores)).sum(tokens), normalised.sum(tokens)};
}

Tensors moe_aux_loss(const Ctx& ctx, const Tensors& in) {
  const auto& a = ctx.op.attrs();
  const double tokens = static_cast<double>(a.get<int64_t>("tokens"));
  const double scale = a.get<double>("coef") * static_cast<double>(a.get<int64_t>("experts")) /
                       (static_cast<double>(a.get<int64_t>("top_k")) * tokens * tokens);
  return {(in[0].to(at::kFloat) * in[1].to(at::kFloat)).sum() * scale};
}

Tensors add_loss(const Ctx&, const Tensors& in) {
  return {in[0].to(at::kFloat) + in[1].to(at::kFloat)};
}

}  // namespace

void add_moe_kernels(KernelRegistry& r) {
  const std::pair<const char*, Kernel> kernels[] = {
      {"moe_route", moe_route},
      {"moe_dispatch", moe_dispatch},
      {"expert_linear", expert_linear},
      {"moe_combine", moe_combine},
      {"moe_load_stats", moe_load_stats},
      {"moe_aux_loss", moe_aux_loss},
      {"add_loss", add_loss},
  };
  for (const auto& [type, kernel] : kernels) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
}

}  // namespace loom::runtime
