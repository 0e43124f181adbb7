// Annotations of the Evoformer's op types. Every representation is 4-D: the MSA m[b, s, r, c]
// and the pair z[b, i, j, c]. The axial ops keep both leading axes splittable where the maths
// allows it, so a plan can split the MSA along s for row-wise ops and along r for column-wise
// ops, and the pair along its first axis for the starting-node family and its second for the
// ending-node family (dynamic axial parallelism).
#include "graph/ops_evoformer.h"

#include "core/check.h"

namespace loom::graph {
namespace {

// Attention inside each row (dimension 1 indexes rows, attention runs along dimension 2) on
// q, k, v of [b, x, len, heads*d], with an optional per-head bias [b, query, key, heads] that
// every row shares (the MSA's pair bias, the triangle attention around the starting node).
std::string row_attention(const Attrs& attrs) {
  std::string a = "b x i^ (h d^), b x j^ (h d^), b x j^ (h d^)";
  if (attrs.get_or<bool>("bias", false)) a += ", b i^ j^ h";
  return a + " -> b x i^ (h d^)";
}

// Attention inside each column (attention runs along dimension 1). The optional bias is
// indexed [b, key, query, heads], as AlphaFold2's triangle attention around the ending node
// reads z_ki.
std::string column_attention(const Attrs& attrs) {
  std::string a = "b i^ x (h d^), b j^ x (h d^), b j^ x (h d^)";
  if (attrs.get_or<bool>("bias", false)) a += ", b j^ i^ h";
  return a + " -> b i^ x (h d^)";
}

OpSchema with_attrs(std::string type, std::function<std::string(const Attrs&)> make) {
  OpSchema s;
  s.type = std::move(type);
  s.annotation = std::move(make);
  return s;
}

}  // namespace

void add_evoformer_ops(OpRegistry& r) {
  auto must = [&](OpSchema s) {
    Status st = r.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  };
  // Elementwise on 4-D tensors: ReLU, and AlphaFold2's gating x * sigmoid(g).
  must(OpSchema::simple("relu", "b s x h -> b s x h"));
  must(OpSchema::simple("sigmoid_gate", "b s x h, b s x h -> b s x h"));
  for (OpSchema s : {with_attrs("row_attention", row_attention),
                     with_attrs("column_attention", column_attention)}) {
    s.attention_core = true;
    s.rules.flops = flops_of_labels(4, {"b", "x", "i", "j", "h", "d"});  // scores, sums
    must(std::move(s));
  }
  // mean over s of a[s, i, c] (x) b[s, j, e], flattened to [b, i, j, c*e]: splitting s leaves
  // partial sums of the mean.
  OpSchema outer = OpSchema::simple("outer_product_mean", "b s+ i c^, b s+ j e^ -> b i j (c^ e^)");
  outer.rules.flops = flops_of_labels(2, {"b", "s", "i", "j", "c", "e"});
  must(std::move(outer));
  // Triangle multiplication: outgoing edges sum_k a[i, k] b[j, k], incoming sum_k a[k, i] b[k, j]
  // (per channel).
  for (auto [type, annotation] :
       {std::pair{"triangle_outgoing", "b i k^ c, b j k^ c -> b i j c"},
        std::pair{"triangle_incoming", "b k^ i c, b k^ j c -> b i j c"}}) {
    OpSchema s = OpSchema::simple(type, annotation);
    s.rules.flops = flops_of_labels(2, {"b", "i", "j", "k", "c"});
    must(std::move(s));
  }
}

}  // namespace loom::graph
