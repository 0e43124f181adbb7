// An independent Evoformer written with plain LibTorch functions, following the pseudo-code of
// AlphaFold2's supplement (algorithms 6-14) with its own formulations (einsum per algorithm,
// matrix products for the outer product mean and the triangle multiplications). Parameters are
// leaf tensors looked up by loom's names, so a test can load loom's initial weights and compare
// gradients name by name.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

namespace loom::reference {

struct EvoformerShape {
  int64_t blocks, c_m, c_z, msa_heads, msa_head_dim, pair_heads, pair_head_dim, bins;
  double eps = 1e-5;
};

class Evoformer {
 public:
  Evoformer(EvoformerShape shape, std::map<std::string, torch::Tensor> params)
      : s_(shape), p_(std::move(params)) {}

  std::map<std::string, torch::Tensor>& params() { return p_; }

  // Mean cross-entropy of the distogram over every residue pair.
  torch::Tensor loss(const torch::Tensor& msa_feat, const torch::Tensor& pair_feat,
                     const torch::Tensor& targets) {
    torch::Tensor m = lin("embed.msa", msa_feat);
    torch::Tensor z = lin("embed.pair", pair_feat);
    for (int64_t l = 0; l < s_.blocks; ++l) {
      const std::string p = "evo" + std::to_string(l) + ".";
      m = m + msa_row_attention(p + "msa_row", m, z);
      m = m + msa_column_attention(p + "msa_col", m);
      m = m + transition(p + "msa_transition", m);
      z = z + outer_product_mean(p + "opm", m);
      z = z + triangle_multiply(p + "tri_mul_out", z, true);
      z = z + triangle_multiply(p + "tri_mul_in", z, false);
      z = z + triangle_attention_start(p + "tri_att_start", z);
      z = z + triangle_attention_end(p + "tri_att_end", z);
      z = z + transition(p + "pair_transition", z);
    }
    torch::Tensor logits = lin("distogram", z);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, s_.bins}),
                                                targets.reshape({-1}));
  }

 private:
  const torch::Tensor& at(const std::string& name) {
    auto it = p_.find(name);
    TORCH_CHECK(it != p_.end(), "reference has no parameter ", name);
    return it->second;
  }
  torch::Tensor lin(const std::string& name, const torch::Tensor& x, bool bias = true) {
    namespace F = torch::nn::functional;
    return bias ? F::linear(x, at(name + ".w"), at(name + ".b")) : F::linear(x, at(name + ".w"));
  }
  torch::Tensor ln(const std::string& name, const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    return F::layer_norm(x, F::LayerNormFuncOptions({x.size(-1)})
                                .weight(at(name + ".w"))
                                .bias(at(name + ".b"))
                                .eps(s_.eps));
  }
  // [b, x, y, h*d] -> [b, x, y, h, d]
  static torch::Tensor heads(const torch::Tensor& t, int64_t h) {
    return t.reshape({t.size(0), t.size(1), t.size(2), h, t.size(3) / h});
  }
  torch::Tensor gate_out(const std::string& p, const torch::Tensor& o, const torch::Tensor& h) {
    torch::Tensor g = torch::sigmoid(lin(p + ".gate", h));
    return lin(p + ".out", g * o.reshape({o.size(0), o.size(1), o.size(2), -1}));
  }

  // Algorithm 7: attention along each MSA row with a bias from the pair.
  torch::Tensor msa_row_attention(const std::string& p, const torch::Tensor& m,
                                  const torch::Tensor& z) {
    torch::Tensor h = ln(p + ".ln", m);
    const int64_t H = s_.msa_heads;
    torch::Tensor q = heads(lin(p + ".q", h, false), H), k = heads(lin(p + ".k", h, false), H),
                  v = heads(lin(p + ".v", h, false), H);
    torch::Tensor bias = lin(p + ".pair_bias", ln(p + ".pair_ln", z), false);  // [b, i, j, h]
    torch::Tensor a =
        torch::einsum("bsihd,bsjhd->bshij", {q, k}) / std::sqrt(double(s_.msa_head_dim)) +
        bias.permute({0, 3, 1, 2}).unsqueeze(1);
    torch::Tensor o = torch::einsum("bshij,bsjhd->bsihd", {torch::softmax(a, -1), v});
    return gate_out(p, o, h);
  }

  // Algorithm 8: attention along each MSA column.
  torch::Tensor msa_column_attention(const std::string& p, const torch::Tensor& m) {
    torch::Tensor h = ln(p + ".ln", m);
    const int64_t H = s_.msa_heads;
    torch::Tensor q = heads(lin(p + ".q", h, false), H), k = heads(lin(p + ".k", h, false), H),
                  v = heads(lin(p + ".v", h, false), H);
    torch::Tensor a =
        torch::einsum("bsihd,btihd->bihst", {q, k}) / std::sqrt(double(s_.msa_head_dim));
    torch::Tensor o = torch::einsum("bihst,btihd->bsihd", {torch::softmax(a, -1), v});
    return gate_out(p, o, h);
  }

  // Algorithms 9 and 15.
  torch::Tensor transition(const std::string& p, const torch::Tensor& x) {
    return lin(p + ".fc2", torch::relu(lin(p + ".fc1", ln(p + ".ln", x))));
  }

  // Algorithm 10, as one matrix product over the sequences.
  torch::Tensor outer_product_mean(const std::string& p, const torch::Tensor& m) {
    torch::Tensor h = ln(p + ".ln", m);
    torch::Tensor a = lin(p + ".a", h), b = lin(p + ".b", h);  // [B, S, R, c]
    const int64_t B = a.size(0), S = a.size(1), R = a.size(2), c = a.size(3), e = b.size(3);
    torch::Tensor o =
        torch::bmm(a.reshape({B, S, R * c}).transpose(1, 2), b.reshape({B, S, R * e})) / double(S);
    o = o.reshape({B, R, c, R, e}).permute({0, 1, 3, 2, 4}).reshape({B, R, R, c * e});
    return lin(p + ".out", o);
  }

  // Algorithms 11 and 12, as batched matrix products per channel.
  torch::Tensor triangle_multiply(const std::string& p, const torch::Tensor& z, bool outgoing) {
    torch::Tensor h = ln(p + ".ln", z);
    torch::Tensor a = torch::sigmoid(lin(p + ".a.gate", h)) * lin(p + ".a", h);
    torch::Tensor b = torch::sigmoid(lin(p + ".b.gate", h)) * lin(p + ".b", h);
    torch::Tensor x;
    if (outgoing)  // x_ij = sum_k a_ik b_jk
      x = torch::matmul(a.permute({0, 3, 1, 2}), b.permute({0, 3, 2, 1}));
    else  // x_ij = sum_k a_ki b_kj
      x = torch::matmul(a.permute({0, 3, 2, 1}), b.permute({0, 3, 1, 2}));
    x = x.permute({0, 2, 3, 1});
    torch::Tensor g = torch::sigmoid(lin(p + ".out.gate", h));
    return g * lin(p + ".out", ln(p + ".ln_out", x));
  }

  // Algorithm 13: around the starting node, a_ijk = q_ij . k_ik + b_jk.
  torch::Tensor triangle_attention_start(const std::string& p, const torch::Tensor& z) {
    torch::Tensor h = ln(p + ".ln", z);
    const int64_t H = s_.pair_heads;
    torch::Tensor q = heads(lin(p + ".q", h, false), H), k = heads(lin(p + ".k", h, false), H),
                  v = heads(lin(p + ".v", h, false), H);
    torch::Tensor bias = lin(p + ".pair_bias", h, false);  // [b, j, k, h]
    torch::Tensor a =
        torch::einsum("bijhd,bikhd->bhijk", {q, k}) / std::sqrt(double(s_.pair_head_dim)) +
        bias.permute({0, 3, 1, 2}).unsqueeze(2);
    torch::Tensor o = torch::einsum("bhijk,bikhd->bijhd", {torch::softmax(a, -1), v});
    return gate_out(p, o, h);
  }

  // Algorithm 14: around the ending node, a_ijk = q_ij . k_kj + b_ki.
  torch::Tensor triangle_attention_end(const std::string& p, const torch::Tensor& z) {
    torch::Tensor h = ln(p + ".ln", z);
    const int64_t H = s_.pair_heads;
    torch::Tensor q = heads(lin(p + ".q", h, false), H), k = heads(lin(p + ".k", h, false), H),
                  v = heads(lin(p + ".v", h, false), H);
    torch::Tensor bias = lin(p + ".pair_bias", h, false);  // [b, k, i, h]
    torch::Tensor a =
        torch::einsum("bijhd,bkjhd->bhijk", {q, k}) / std::sqrt(double(s_.pair_head_dim)) +
        bias.permute({0, 3, 2, 1}).unsqueeze(3);
    torch::Tensor o = torch::einsum("bhijk,bkjhd->bijhd", {torch::softmax(a, -1), v});
    return gate_out(p, o, h);
  }

  EvoformerShape s_;
  std::map<std::string, torch::Tensor> p_;
};

}  // namespace loom::reference
