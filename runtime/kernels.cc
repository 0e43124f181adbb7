#include "runtime/kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "core/check.h"
#include "graph/ops_context.h"
#include "graph/ops_loss.h"
#include "graph/precision.h"
#include "runtime/attention_tiles.h"
#include "runtime/causal_attention.h"
#include "runtime/kernels_evoformer.h"
#include "runtime/kernels_moe.h"
#include "runtime/kernels_vision.h"
#include "runtime/linear.h"

namespace loom::runtime {
namespace {

using Ctx = KernelContext;
using Tensors = std::vector<at::Tensor>;

// A piece of the vocabulary [v0, v0 + rows) looks up the tokens it holds and gives zero rows
// for the others (Megatron's vocab-parallel embedding): the pieces are partial sums.
// A table lookup whose backward keeps the indices and the table's row count, not the table:
// under parallel.zero 3 the table is a gathered copy that should go once the forward has read it.
struct EmbeddingFn : public torch::autograd::Function<EmbeddingFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::Tensor table, at::Tensor indices) {
    ctx->saved_data["rows"] = table.size(0);
    ctx->save_for_backward({indices});
    return {at::embedding(table, indices)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    return {at::embedding_backward(grads[0], indices, ctx->saved_data["rows"].toInt(),
                                   /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                                   /*sparse=*/false),
            at::Tensor()};
  }
};

Tensors embedding(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& tokens = in[0];
  const at::Tensor& table = in[1];
  const int64_t v0 = ctx.op.inputs[1].ranges[0].start;
  if (v0 == 0 && table.size(0) == ctx.full_size(1, 0)) return EmbeddingFn::apply(table, tokens);
  at::Tensor local = tokens - v0;
  at::Tensor outside = (local < 0).logical_or_(local >= table.size(0));
  at::Tensor rows = EmbeddingFn::apply(table, local.masked_fill(outside, 0))[0];
  return {rows.masked_fill(outside.unsqueeze(-1), 0.0)};
}

Tensors add_position(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

Tensors add_tensors(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

// Attribute approximate: "none" (exact, the default) or "tanh".
Tensors gelu(const Ctx& ctx, const Tensors& in) {
  return {at::gelu(in[0], ctx.op.attrs().get_or<std::string>("approximate", "none"))};
}

// On a GPU in the activations' dtype: LibTorch's CUDA kernel keeps its statistics and its
// weight and bias gradients in float32 and rounds only what it writes, which is what the
// float32 kernel and a cast of its output round. Measured on a bf16 GPT-1.3B step on an H100,
// the casts around a float32 norm (the input up and the output down, both ways) took 17 of
// 313 ms. On the CPU in float32 whatever the activations' dtype: LibTorch's bf16 CPU backward
// rounds partial sums of the weight's gradient (1 % of its largest element measured against
// float32, five times one rounding). The executor hands on the graph's dtype either way.
Tensors layer_norm(const Ctx& ctx, const Tensors& in) {
  const double eps = ctx.op.attrs().get_or<double>("eps", 1e-5);
  const at::ScalarType dtype = in[0].is_cuda() ? in[0].scalar_type() : at::kFloat;
  return {at::layer_norm(in[0].to(dtype), {in[0].size(-1)}, in[1].to(dtype), in[2].to(dtype), eps)};
}

Tensors linear_kernel(const Ctx&, const Tensors& in) {
  return {runtime::linear(in[0], in[1], at::Tensor())};
}

Tensors bias_add(const Ctx&, const Tensors& in) { return {in[0] + in[1]}; }

// Causal attention of heads-first [b, h, s, d] queries and [b, h, t, d] keys and values,
// returned as [b, s, h*d]. A piece of s queries (sequence parallel) sees keys up to its own
// positions: the last s of t.
at::Tensor causal_attention(const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh) {
  const int64_t b = qh.size(0), h = qh.size(1), s = qh.size(2), d = qh.size(3), t = kh.size(2);
  // Where graph::fused_attention says (GPUs; float32 on the CPU) a kernel that keeps no
  // probabilities: on the CPU loom's row blocks (runtime/causal_attention.h), faster there than
  // SDPA's; else explicit products.
  if (graph::fused_attention(qh.scalar_type() == at::kBFloat16, qh.device().is_cuda())) {
    if (qh.device().is_cpu() && qh.scalar_type() == at::kFloat)
      return block_causal_attention(qh, kh, vh).transpose(1, 2).reshape({b, s, h * d});
    // The fused kernels (flash, memory-efficient) where the LibTorch has them; a query piece
    // that is not the whole sequence passes its mask (SDPA's is_causal aligns top-left): true
    // where a query may see a key. One mask per shape, device and thread.
    thread_local std::map<std::tuple<int64_t, int64_t, std::string>, at::Tensor> visible;
    auto mask = [&]() -> const at::Tensor& {
      at::Tensor& m = visible[{s, t, qh.device().str()}];
      if (!m.defined()) m = at::ones({s, t}, qh.options().dtype(at::kBool)).tril(t - s);
      return m;
    };
    at::Tensor out = s == t ? at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, true)
                            : at::scaled_dot_product_attention(qh, kh, vh, mask(), 0.0, false);
    return out.transpose(1, 2).reshape({b, s, h * d});
  }
  // Scale, scores and causal mask in one batched product: baddbmm adds an additive mask (0 where
  // a query sees a key, -inf elsewhere) to scale * q k^T, and its backward has nothing to do for
  // the mask (a masked_fill's backward is another pass over the s x t scores). One mask per
  // shape, device, dtype and thread.
  thread_local std::map<std::tuple<int64_t, int64_t, std::string, int>, at::Tensor> biases;
  at::Tensor& bias = biases[{s, t, qh.device().str(), static_cast<int>(qh.scalar_type())}];
  if (!bias.defined())
    bias = at::zeros({s, t}, qh.options())
               .masked_fill_(at::ones({s, t}, qh.options().dtype(at::kBool)).triu(t - s + 1),
                             -std::numeric_limits<double>::infinity());
  const at::Tensor k3 = kh.reshape({b * h, t, d});
  at::Tensor scores = at::baddbmm(bias, qh.reshape({b * h, s, d}), k3.transpose(1, 2), 1.0,
                                  1.0 / std::sqrt(static_cast<double>(d)));
  // Softmax in float32 whatever the activations' dtype.
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vh.scalar_type());
  at::Tensor out = at::bmm(probs, vh.reshape({b * h, t, d})).view({b, h, s, d});
  return out.transpose(1, 2).reshape({b, s, h * d});
}

// [b, len, heads*d] -> [b, heads, len, d].
at::Tensor heads_first(const at::Tensor& x, int64_t d) {
  return x.view({x.size(0), x.size(1), x.size(2) / d, d}).transpose(1, 2);
}

// Causal multi-head attention over [b, s, h*d] pieces; the head count is local (piece / d).
Tensors attention(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  return {causal_attention(heads_first(in[0], d), heads_first(in[1], d), heads_first(in[2], d))};
}

// The kv heads the query heads of this piece read, heads first [b, heads, t, d]: query head i of
// the model reads kv head i / r (r = query heads per kv head); the pieces' head ranges say which
// of those this rank holds.
std::pair<at::Tensor, at::Tensor> kv_for_queries(const Ctx& ctx, int64_t d, int64_t r,
                                                 const at::Tensor& k, const at::Tensor& v) {
  const int64_t q0 = ctx.op.inputs[0].ranges[2].start / d;
  const int64_t kv0 = ctx.op.inputs[1].ranges[2].start / d;
  const int64_t heads = ctx.op.inputs[0].ranges[2].size() / d, kv_heads = k.size(2) / d;
  at::Tensor kh = heads_first(k, d), vh = heads_first(v, d);
  const int64_t first = q0 / r - kv0, last = (q0 + heads - 1) / r - kv0;  // local kv heads read
  LOOM_CHECK(first >= 0 && last < kv_heads)
      << ctx.op.name() << ": query heads [" << q0 << ", " << q0 + heads << ") read kv heads ["
      << first + kv0 << ", " << last + kv0 + 1 << ") but the piece holds [" << kv0 << ", "
      << kv0 + kv_heads << ")";
  if (heads == kv_heads && r == 1) return {kh, vh};
  // Local query head j reads local kv head (q0 + j) / r - kv0.
  const at::Tensor index =
      at::arange(q0, q0 + heads, k.options().dtype(at::kLong)).div_(r, "floor").sub_(kv0);
  return {kh.index_select(1, index), vh.index_select(1, index)};
}

// Grouped-query attention (gqa_attention, shared_kv_attention): each query head of the piece
// reads the kv head its group owns, r = query heads / kv heads of the whole model.
Tensors grouped_attention(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  const int64_t r = ctx.full_size(0, 2) / ctx.full_size(1, 2);
  auto [kh, vh] = kv_for_queries(ctx, d, r, in[1], in[2]);
  return {causal_attention(heads_first(in[0], d), kh, vh)};
}

// Two partial attentions of the same queries over disjoint keys, as one: outputs [..., d] and
// log-sum-exps [...] over the same leading dimensions (heads first in a ring step, [b, s, h] in
// lse_merge).
std::pair<at::Tensor, at::Tensor> merge_by_lse(const std::pair<at::Tensor, at::Tensor>& a,
                                               const std::pair<at::Tensor, at::Tensor>& b) {
  const at::Tensor lse = at::logaddexp(a.second, b.second);
  return {a.first * (a.second - lse).exp().unsqueeze(-1) +
              b.first * (b.second - lse).exp().unsqueeze(-1),
          lse};
}

// Step k of ring attention in float32 (graph/ops_context.h): each query chunk c of the piece
// attends to key chunk (c - k) mod N, found in the key piece, one block of runs of positions at
// a time (graph::ring_step_blocks: the blocks with something to see), the blocks of a query run
// merged by their log-sum-exp. A query run that sees nothing gives 0 and -inf.
Tensors ring_attention_step(const Ctx& ctx, const Tensors& in) {
  const graph::Attrs& a = ctx.op.attrs();
  const int64_t d = a.get<int64_t>("d"), r = a.get<int64_t>("r");
  const int64_t p0 = ctx.op.inputs[0].ranges[1].start, t0 = ctx.op.inputs[1].ranges[1].start;
  const int64_t t = ctx.op.inputs[1].ranges[1].size();
  const at::Tensor qh = heads_first(in[0].to(at::kFloat), d);
  auto [kh, vh] = kv_for_queries(ctx, d, r, in[1].to(at::kFloat), in[2].to(at::kFloat));
  const int64_t b = qh.size(0), h = qh.size(1), s = qh.size(2);
  // The attention of each query run seen so far, by its index in the piece.
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> runs;
  for (const graph::AttentionBlock& blk : graph::ring_step_blocks(ctx.op)) {
    LOOM_CHECK(blk.k.at >= t0 && blk.k.at + blk.k.len <= t0 + t && blk.k.position <= blk.q.position)
        << ctx.op.name() << ": queries from position " << blk.q.position << " read keys from "
        << blk.k.position << " at index " << blk.k.at << ", outside the key piece from index " << t0
        << " or not seen by its first query";
    auto part = tiled_attention_with_lse(qh.narrow(2, blk.q.at - p0, blk.q.len).contiguous(),
                                         kh.narrow(2, blk.k.at - t0, blk.k.len).contiguous(),
                                         vh.narrow(2, blk.k.at - t0, blk.k.len).contiguous(),
                                         blk.q.position, blk.k.position);
    auto [it, fresh] = runs.emplace(blk.q.at, part);
    if (!fresh) it->second = merge_by_lse(it->second, part);
  }
  at::Tensor out, lse;
  if (runs.size() == 1 && runs.begin()->second.first.size(2) == s) {
    std::tie(out, lse) = runs.begin()->second;
  } else {
    out = at::zeros({b, h, s, d}, qh.options());
    lse = at::full({b, h, s}, -std::numeric_limits<double>::infinity(), qh.options());
    std::vector<at::Tensor> outs, lses;
    int64_t at_index = p0;
    // The pieces in query order: seen runs, and for the unseen stretches between, 0 and -inf.
    for (const auto& [index, part] : runs) {
      if (index > at_index) {
        outs.push_back(out.narrow(2, at_index - p0, index - at_index));
        lses.push_back(lse.narrow(2, at_index - p0, index - at_index));
      }
      outs.push_back(part.first);
      lses.push_back(part.second);
      at_index = index + part.first.size(2);
    }
    if (at_index < p0 + s) {
      outs.push_back(out.narrow(2, at_index - p0, p0 + s - at_index));
      lses.push_back(lse.narrow(2, at_index - p0, p0 + s - at_index));
    }
    if (runs.empty()) {
      // Still a function of k and v: their gradients (zeros) must flow back through the transfer
      // that brought them, or the rank that sent them would wait for a gradient that never comes.
      out = out.add((kh.sum() + vh.sum()).mul(0));
    } else {
      out = at::cat(outs, 2);
      lse = at::cat(lses, 2);
    }
  }
  return {out.transpose(1, 2).reshape({b, s, h * d}), lse.transpose(1, 2).contiguous()};
}

// Two partial attentions of the same queries over disjoint keys, as one (float32).
Tensors lse_merge(const Ctx& ctx, const Tensors& in) {
  const int64_t d = ctx.op.attrs().get<int64_t>("d");
  const at::Tensor l1 = in[1].to(at::kFloat), l2 = in[3].to(at::kFloat);
  const int64_t b = l1.size(0), s = l1.size(1), h = l1.size(2);
  auto [out, lse] = merge_by_lse({in[0].to(at::kFloat).view({b, s, h, d}), l1},
                                 {in[2].to(at::kFloat).view({b, s, h, d}), l2});
  return {out.view({b, s, h * d}), lse};
}

Tensors lse_merge_last(const Ctx& ctx, const Tensors& in) { return {lse_merge(ctx, in)[0]}; }

// Root-mean-square norm in float32 whatever the activations' dtype, as Llama computes it:
// x / sqrt(mean(x^2) + eps), then the weight.
Tensors rms_norm(const Ctx& ctx, const Tensors& in) {
  const double eps = ctx.op.attrs().get_or<double>("eps", 1e-5);
  const at::Tensor x = in[0].to(at::kFloat);
  return {in[1].to(at::kFloat) * (x * at::rsqrt(x.pow(2).mean(-1, true).add_(eps)))};
}

Tensors swiglu(const Ctx&, const Tensors& in) { return {at::silu(in[0]) * in[1]}; }

// The positions of indices [begin, end) of a sequence of `seq` in zigzag order over `halves`
// (0: in order), as int64 on the device of `options`.
at::Tensor positions(int64_t begin, int64_t end, int64_t seq, int64_t halves,
                     const at::TensorOptions& options) {
  std::vector<at::Tensor> parts;
  for (const graph::SequenceRun& run : graph::sequence_runs(begin, end, seq, halves))
    parts.push_back(at::arange(run.position, run.position + run.len, options.dtype(at::kLong)));
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

// The rotary frequencies of a head of size d (float32, as Llama computes them), with Llama 3.1's
// scaling when attribute `factor` is positive: long wavelengths slow down by the factor, short
// ones stay, and those between blend smoothly.
at::Tensor rope_frequencies(const graph::Attrs& a, int64_t d, const at::TensorOptions& options) {
  const double theta = a.get<double>("theta");
  at::Tensor inv = at::arange(0, d, 2, options.dtype(at::kLong)).to(at::kFloat).div_(d);
  inv = at::pow(theta, inv).reciprocal_();
  const double factor = a.get_or<double>("factor", 0.0);
  if (factor <= 0) return inv;
  const double low = a.get<double>("low_freq_factor"), high = a.get<double>("high_freq_factor");
  const double old_len = static_cast<double>(a.get<int64_t>("original_max_positions"));
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  const at::Tensor wavelen = (2 * M_PI) / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / factor, inv);
  const at::Tensor smooth = (old_len / wavelen - low) / (high - low);
  const at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// Rotary embedding of a [b, s, heads*d] piece whose positions are those of its sequence range
// (in zigzag order under attribute zigzag, graph/ops_context.h): x cos + rotate_half(x) sin per
// head, rotate_half(x) = (-x2, x1) of its halves. The cos/sin tables are made once per shape,
// position, device and thread.
Tensors rope(const Ctx& ctx, const Tensors& in) {
  const graph::Attrs& a = ctx.op.attrs();
  const int64_t d = a.get<int64_t>("d");
  const at::Tensor& x = in[0];
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2) / d;
  const int64_t p0 = ctx.op.inputs[0].ranges[1].start, seq = ctx.full_size(0, 1);
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, std::string, int, std::string>;
  thread_local std::map<Key, std::pair<at::Tensor, at::Tensor>> tables;
  auto& [cos, sin] = tables[Key{p0, s, seq, d, x.device().str(), static_cast<int>(x.scalar_type()),
                                a.to_string()}];
  if (!cos.defined()) {
    const at::Tensor inv = rope_frequencies(a, d, x.options());
    const at::Tensor pos =
        positions(p0, p0 + s, seq, a.get_or<int64_t>("zigzag", 0), x.options()).to(at::kFloat);
    const at::Tensor freqs = at::outer(pos, inv);  // [s, d/2]
    const at::Tensor angles = at::cat({freqs, freqs}, -1).view({1, s, 1, d});
    cos = angles.cos().to(x.scalar_type());
    sin = angles.sin().to(x.scalar_type());
  }
  const at::Tensor xh = x.view({b, s, h, d});
  const at::Tensor rotated = at::cat({-xh.narrow(-1, d / 2, d / 2), xh.narrow(-1, 0, d / 2)}, -1);
  return {(xh * cos + rotated * sin).view({b, s, h * d})};
}

// A sample's token ids in zigzag order (graph/ops_context.h): [b, s], gathered along s.
Tensors seq_permute(const Ctx& ctx, const Tensors& in) {
  const int64_t seq = in[0].size(1);
  return {in[0].index_select(
      1, positions(0, seq, seq, ctx.op.attrs().get<int64_t>("zigzag"), in[0].options()))};
}

// A table of positions' rows in zigzag order: [s, h], gathered along s (its gradient scatters
// back).
Tensors seq_permute_rows(const Ctx& ctx, const Tensors& in) {
  const int64_t seq = in[0].size(0);
  return {in[0].index_select(
      0, positions(0, seq, seq, ctx.op.attrs().get<int64_t>("zigzag"), in[0].options()))};
}

// Cross-entropy of float32 CPU logits [n, v] against targets [n], summed: the forward keeps the
// softmax probabilities and the backward turns them into the logits' gradient in place,
// (p - one-hot) · g, one pass over the logits where log-softmax's and nll's backwards make three
// (a zero fill, a scatter, and the exponential of the saved log-probabilities). Case 2 of
// bench/vs_torch (1024 tokens, vocabulary 4096): about 6.5 -> 3.7 ms per step.
struct SoftmaxCrossEntropy : public torch::autograd::Function<SoftmaxCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets) {
    at::Tensor probs = at::_softmax(logits, -1, false);
    const at::Tensor picked = probs.gather(1, targets.unsqueeze(1)).squeeze(1);
    // -log p of the target; where p underflowed below float32's smallest normal number, the
    // exact log-sum-exp minus the target's logit instead.
    at::Tensor loss = picked.log().neg_();
    if (picked.min().item<float>() < std::numeric_limits<float>::min()) {
      const at::Tensor rows = (picked < std::numeric_limits<float>::min()).nonzero().squeeze(1);
      const at::Tensor x = logits.index_select(0, rows);
      loss.index_put_({rows},
                      at::logsumexp(x, -1) -
                          x.gather(1, targets.index_select(0, rows).unsqueeze(1)).squeeze(1));
    }
    ctx->saved_data["probs"] = probs;
    ctx->save_for_backward({targets});
    return loss.sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor probs = ctx->saved_data["probs"].toTensor();
    LOOM_CHECK(probs.defined()) << "cross_entropy: its backward ran twice on one forward";
    ctx->saved_data["probs"] = at::Tensor();  // the buffer becomes the gradient
    const at::Tensor targets = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0];
    probs.mul_(g);
    probs.index_put_({at::arange(probs.size(0), targets.options()), targets},
                     g.neg().expand({probs.size(0)}), /*accumulate=*/true);
    return {probs, at::Tensor()};
  }
};

// Sum of the token losses of this piece over the full micro-batch's token count. It holds the
// whole vocabulary (lower/fusion.h); columns past attribute valid are padding, left out.
Tensors cross_entropy(const Ctx& ctx, const Tensors& in) {
  const int64_t normalizer = ctx.op.attrs().get<int64_t>("normalizer");
  const int64_t valid = ctx.op.attrs().get_or<int64_t>("valid", 0);
  at::Tensor logits = in[0].to(at::kFloat);
  if (valid > 0 && valid < logits.size(-1)) logits = logits.narrow(-1, 0, valid);
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)}), targets = in[1].reshape({-1});
  // On the CPU loom's own (the host read of its underflow check costs nothing there).
  at::Tensor loss = flat.device().is_cpu()
                        ? SoftmaxCrossEntropy::apply(flat, targets)
                        : at::cross_entropy_loss(flat, targets, {}, at::Reduction::Sum);
  return {loss / static_cast<double>(normalizer)};
}

// Log-sum-exp over the last dimension, as at::logsumexp computes it, with a backward that makes
// one buffer: d lse / dx = exp(x - lse), exponentiated and scaled in place. (Autograd's own
// backward allocates the difference, its exponential and their product, each the size of the
// logits: three fresh allocations of the largest tensor of a language model's step.)
struct LogSumExp : public torch::autograd::Function<LogSumExp> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor lse = at::logsumexp(x, -1);
    ctx->save_for_backward({x, lse});
    return lse;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0] - saved[1].unsqueeze(-1);
    g.exp_().mul_(grads[0].unsqueeze(-1));
    return {g};
  }
};

// Columns past attribute valid (of the full vocabulary) are padding: they get the lowest finite
// float, whose exponential is exactly 0 next to any real logit, so the log-sum-exp and its
// gradient are the unpadded vocabulary's. Finite, not -inf: a group of padding alone then has a
// finite log-sum-exp and no 0/0 in its backward.
Tensors group_logsumexp(const Ctx& ctx, const Tensors& in) {
  const int64_t v = ctx.op.attrs().get<int64_t>("v");
  const int64_t valid = ctx.op.attrs().get_or<int64_t>("valid", 0);
  at::Tensor x = in[0].to(at::kFloat);
  const int64_t v0 = ctx.op.inputs[0].ranges[2].start;
  if (valid > 0 && v0 + x.size(2) > valid) {
    const at::Tensor column = at::arange(v0, v0 + x.size(2), x.options().dtype(at::kLong));
    x = x.masked_fill(column >= valid, std::numeric_limits<float>::lowest());
  }
  return {LogSumExp::apply(x.view({x.size(0), x.size(1), x.size(2) / v, v}))};
}

Tensors logsumexp(const Ctx&, const Tensors& in) {
  return {LogSumExp::apply(in[0].to(at::kFloat))};
}

// The logit of each token's target, where this piece of the vocabulary holds it; else 0.
Tensors pick(const Ctx& ctx, const Tensors& in) {
  const at::Tensor& logits = in[0];
  const int64_t v0 = ctx.op.inputs[0].ranges[2].start;
  const int64_t width = logits.size(2);
  at::Tensor local = in[1] - v0;
  if (v0 == 0 && width == ctx.full_size(0, 2))
    return {logits.gather(-1, local.unsqueeze(-1)).squeeze(-1)};
  at::Tensor inside = (local >= 0).logical_and_(local < width);
  at::Tensor picked = logits.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1);
  return {at::where(inside, picked, at::zeros_like(picked))};
}

Tensors nll(const Ctx& ctx, const Tensors& in) {
  const int64_t normalizer = ctx.op.attrs().get<int64_t>("normalizer");
  return {(in[0] - in[1]).sum() / static_cast<double>(normalizer)};
}

}  // namespace

KernelRegistry KernelRegistry::with_builtin_kernels() {
  KernelRegistry r;
  const std::pair<const char*, Kernel> builtin[] = {
      {"embedding", embedding},
      {"add_position", add_position},
      {"add", add_tensors},
      {"gelu", gelu},
      {"layer_norm", layer_norm},
      {"linear", linear_kernel},
      {"bias_add", bias_add},
      {"attention", attention},
      {"gqa_attention", grouped_attention},
      {"shared_kv_attention", grouped_attention},
      {"ring_attention_step", ring_attention_step},
      {"lse_merge", lse_merge},
      {"lse_merge_last", lse_merge_last},
      {"rms_norm", rms_norm},
      {"swiglu", swiglu},
      {"rope", rope},
      {"seq_permute", seq_permute},
      {"seq_permute_rows", seq_permute_rows},
      {"cross_entropy", cross_entropy},
      {graph::kGroupLogSumExp, group_logsumexp},
      {graph::kLogSumExp, logsumexp},
      {graph::kPick, pick},
      {graph::kNll, nll},
  };
  for (const auto& [type, kernel] : builtin) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
  add_evoformer_kernels(r);
  add_vision_kernels(r);
  add_moe_kernels(r);
  return r;
}

Status KernelRegistry::add(const std::string& type, Kernel kernel) {
  if (kernels_.count(type))
    return Error::at(type, "a kernel for op type '" + type + "' is already registered");
  kernels_.emplace(type, std::move(kernel));
  return Status::success();
}

const Kernel* KernelRegistry::find(const std::string& type) const {
  auto it = kernels_.find(type);
  return it == kernels_.end() ? nullptr : &it->second;
}

}  // namespace loom::runtime
