// loom's built-in op types and their annotations. The kernels live in runtime.
#include "core/strings.h"
#include "graph/op_registry.h"
#include "graph/ops_context.h"
#include "graph/ops_evoformer.h"
#include "graph/ops_loss.h"
#include "graph/ops_moe.h"
#include "graph/ops_vision.h"

namespace loom::graph {
namespace {

// Leading ("batch-like") dimension labels for ops that accept any rank.
std::string leading(int64_t n) {
  static const char* kNames[] = {"b", "s", "x", "y", "z", "u", "w"};
  std::vector<std::string> out;
  for (int64_t i = 0; i < n && i < 7; ++i) out.push_back(kNames[i]);
  return join(out, " ");
}

int64_t ndim(const Attrs& attrs) { return attrs.get_or<int64_t>("ndim", 3); }

OpSchema ranked(std::string type, std::function<std::string(const std::string&)> make) {
  OpSchema s;
  s.type = std::move(type);
  s.annotation = [make](const Attrs& attrs) { return make(leading(ndim(attrs) - 1)); };
  return s;
}

// Under sequence parallelism these split the sequence (OpRules::sequence_parallel).
OpSchema sequence_parallel(OpSchema s) {
  s.rules.sequence_parallel = true;
  return s;
}

void must_add(OpRegistry& r, OpSchema s) {
  Status st = r.add(std::move(s));
  LOOM_CHECK(st.ok()) << st.error().message;
}

// The attentions: GPT's multi-head, Llama's grouped-query, and grouped-query with more
// tensor-parallel ranks than kv heads.
void add_attention_ops(OpRegistry& r) {
  auto must = [&](OpSchema s) { must_add(r, std::move(s)); };
  // Causal multi-head self-attention on [batch, seq, heads*head_dim] q, k, v; attribute d is the
  // head size, so splitting heads keeps whole heads together. Scores and weighted sums cost
  // 4 b s t h d; tensor and all-to-all context parallelism split the heads.
  OpSchema attention =
      OpSchema::simple("attention", "b s^ (h d^), b t^ (h d^), b t^ (h d^) -> b s^ (h d^)");
  attention.attention_core = true;
  attention.rules.saved_bytes = attention_saved_bytes();
  attention.rules.flops = flops_of_labels(4, {"b", "s", "t", "h", "d"});
  attention.rules.tensor_parallel = tp_split("h");
  attention.rules.context_heads = "h";
  must(std::move(attention));
  // Grouped-query causal attention: q holds g kv groups of r query heads each (attribute r), k
  // and v one head per group; splitting g splits query and kv heads together.
  OpSchema gqa = OpSchema::simple("gqa_attention",
                                  "b s^ (g r^ d^), b t^ (g d^), b t^ (g d^) -> b s^ (g r^ d^)");
  gqa.attention_core = true;
  gqa.rules.saved_bytes = attention_saved_bytes();
  gqa.rules.flops = flops_of_labels(4, {"b", "s", "t", "g", "r", "d"});
  gqa.rules.tensor_parallel = tp_split("g");
  gqa.rules.context_heads = "g";
  must(std::move(gqa));
  // The same with more tensor-parallel ranks than kv heads: a piece of the query heads reads the
  // kv heads its heads belong to (query head i of h reads kv head i / (h / k)) from k and v whole.
  OpSchema shared_kv = OpSchema::simple("shared_kv_attention",
                                        "b s^ (h d^), b t^ (k^ d^), b t^ (k^ d^) -> b s^ (h d^)");
  shared_kv.attention_core = true;
  shared_kv.rules.saved_bytes = attention_saved_bytes();
  shared_kv.rules.flops = flops_of_labels(4, {"b", "s", "t", "h", "d"});
  shared_kv.rules.tensor_parallel = tp_split("h");  // query heads; kv heads whole
  must(std::move(shared_kv));
}

void add_loss_pieces(OpRegistry& r) {
  auto must = [&](OpSchema s) { must_add(r, std::move(s)); };
  // Cross-entropy in pieces that split over the vocabulary (Megatron's vocab-parallel loss)
  // with sum-only partials: the vocabulary is cut into g groups of v (attribute v);
  //   group_logsumexp: log-sum-exp of each group's logits    [b s (g v)] -> [b s g]
  //   logsumexp:       log-sum-exp over the groups           [b s g] -> [b s]
  //   pick:            the target's logit; a piece of the vocabulary gives 0 for targets it
  //                    does not hold, so pieces are partial sums
  //   nll:             sum over tokens of (lse - target logit) / normalizer
  // Tensor parallelism splits the groups where they are (group_logsumexp, pick). A rank that
  // holds the whole vocabulary runs the four as one cross-entropy (lower/fusion.h).
  struct LossPiece {
    const char* type;
    const char* annotation;
    bool vocab_parallel;
  };
  for (const LossPiece& piece : {LossPiece{kGroupLogSumExp, "b s (g v^) -> b s g", true},
                                 LossPiece{kLogSumExp, "b s g^ -> b s", false},
                                 LossPiece{kPick, "b s (g+ v^), b s -> b s", true}}) {
    OpSchema schema = OpSchema::simple(piece.type, piece.annotation);
    schema.fp32_outputs = true;
    if (piece.vocab_parallel) schema.rules.tensor_parallel = tp_split("g");
    must(std::move(schema));
  }
  must(OpSchema::simple(kNll, "b+ s+, b+ s+ -> "));
}

}  // namespace

OpRegistry OpRegistry::with_builtin_ops() {
  OpRegistry r;
  auto must = [&](OpSchema s) { must_add(r, std::move(s)); };
  // Token embedding: splitting the vocabulary makes each piece's output a partial sum.
  // Tensor parallelism splits the vocabulary (Megatron's vocab-parallel embedding); a lookup
  // costs an operation per output element.
  OpSchema embedding = OpSchema::simple("embedding", "b s, v+ h -> b s h");
  embedding.rules.flops = flops_of_labels(1, {"b", "s", "h"});
  embedding.rules.tensor_parallel = tp_split("v");
  must(std::move(embedding));
  // Adds a [seq, hidden] table (learned positions) to every sample.
  must(sequence_parallel(OpSchema::simple("add_position", "b s h, s h -> b s h")));
  // Elementwise ops over any rank (attribute ndim, default 3).
  must(sequence_parallel(
      ranked("add", [](const std::string& l) { return l + " h, " + l + " h -> " + l + " h"; })));
  must(ranked("gelu", [](const std::string& l) { return l + " h -> " + l + " h"; }));
  must(sequence_parallel(ranked(
      "layer_norm", [](const std::string& l) { return l + " h^, h^, h^ -> " + l + " h^"; })));
  // y = x W^T with W of shape [out, in], as torch.nn.Linear stores it; the bias is its own op
  // so that a split of `k` (row-parallel) stays a plain partial sum. Tensor parallelism splits
  // the output features of a column-parallel layer, the input features of a row-parallel one.
  OpSchema linear =
      ranked("linear", [](const std::string& l) { return l + " k+, n k+ -> " + l + " n"; });
  linear.weight_product = true;
  linear.rules.flops = matmul_flops();
  linear.rules.tensor_parallel = tp_by_hint("n", "k");
  must(std::move(linear));
  // After a column-parallel layer, on its features; after a row-parallel one, under sequence
  // parallelism, on the sequence.
  OpSchema bias_add =
      ranked("bias_add", [](const std::string& l) { return l + " n, n -> " + l + " n"; });
  bias_add.rules.tensor_parallel = tp_by_hint("n", "");
  must(sequence_parallel(std::move(bias_add)));
  add_attention_ops(r);
  // Llama's blocks. RMSNorm (attribute eps) normalises the last dimension by its root mean square.
  must(sequence_parallel(
      ranked("rms_norm", [](const std::string& l) { return l + " h^, h^ -> " + l + " h^"; })));
  // silu(gate) * up, elementwise.
  must(ranked("swiglu", [](const std::string& l) { return l + " h, " + l + " h -> " + l + " h"; }));
  // Rotary position embedding of [batch, seq, heads*head_dim] queries or keys (attributes d,
  // theta and Llama 3.1's frequency scaling): each head's halves rotate by the angle of the
  // token's position, which a sequence piece takes from where its range starts.
  must(OpSchema::simple("rope", "b s (h d^) -> b s (h d^)"));
  // Sum of token losses divided by attribute `normalizer` (the token count of the full
  // micro-batch): splitting the batch or sequence gives partial sums of the mean loss.
  // Cross-entropy over the last dimension (classes) of logits of any rank (attribute ndim,
  // default 3: [b, s, v]); every other dimension is summed over, so splitting it makes partial
  // sums.
  must(ranked("cross_entropy", [](const std::string& l) {
    std::string summed;
    for (const std::string& label : split(l, ' '))
      summed += (summed.empty() ? "" : " ") + label + "+";
    return summed + " v^, " + summed + " -> ";
  }));

  add_loss_pieces(r);
  add_context_ops(r);
  add_evoformer_ops(r);
  add_moe_ops(r);
  add_vision_ops(r);
  return r;
}

TensorId vocab_group_loss(GraphBuilder& b, TensorId logits, TensorId targets, int64_t group_width,
                          int64_t normalizer, int64_t valid) {
  Attrs groups{{"v", group_width}};
  Attrs nll{{"normalizer", normalizer}};
  const Attrs picked = groups;
  if (valid > 0) {
    groups.set("valid", valid);
    nll.set("valid", valid);
  }
  const TensorId group_lse = b.op1(kGroupLogSumExp, "loss.group_lse", {logits}, groups);
  const TensorId lse = b.op1(kLogSumExp, "loss.lse", {group_lse});
  const TensorId target_logit = b.op1(kPick, "loss.target", {logits, targets}, picked);
  return b.op1(kNll, "loss", {lse, target_logit}, nll);
}

}  // namespace loom::graph
