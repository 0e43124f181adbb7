// An independent GPT written with plain torch::nn modules (Embedding, LayerNorm,
// MultiheadAttention, Linear): the yardstick loom's executor is tested and benchmarked against.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace loom::reference {

struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t hidden, int64_t heads, int64_t ffn)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        attn(register_module("attn", torch::nn::MultiheadAttention(
                                         torch::nn::MultiheadAttentionOptions(hidden, heads)))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        fc1(register_module("fc1", torch::nn::Linear(hidden, ffn))),
        fc2(register_module("fc2", torch::nn::Linear(ffn, hidden))) {}

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& causal_mask) {
    torch::Tensor h = ln1(x).transpose(0, 1);  // MultiheadAttention wants [seq, batch, hidden]
    torch::Tensor a =
        std::get<0>(attn->forward(h, h, h, torch::Tensor(), /*need_weights=*/false, causal_mask));
    x = x + a.transpose(0, 1);
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }

  torch::nn::LayerNorm ln1;
  torch::nn::MultiheadAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  GptImpl(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq, int64_t ffn)
      : hidden_(hidden),
        wte(register_module("wte", torch::nn::Embedding(vocab, hidden))),
        lnf(register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))) {
    wpe = register_parameter("wpe", torch::zeros({seq, hidden}));
    for (int64_t l = 0; l < layers; ++l)
      blocks.push_back(register_module("h" + std::to_string(l), GptBlock(hidden, heads, ffn)));
    // The C++ MultiheadAttention adds attn_mask to the scores: an additive -inf mask.
    mask_ = torch::zeros({seq, seq})
                .masked_fill(torch::ones({seq, seq}, torch::kBool).triu(1),
                             -std::numeric_limits<float>::infinity());
  }

  // Mean token cross-entropy of a [batch, seq] micro-batch; the LM head is tied to wte.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& targets) {
    torch::Tensor x = wte(tokens) + wpe;
    for (auto& b : blocks) x = b->forward(x, mask_);
    torch::Tensor logits = torch::nn::functional::linear(lnf(x), wte->weight);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
  }

  // loom's parameter names, each with the reference tensor (or the slice of it) it matches.
  std::vector<std::pair<std::string, torch::Tensor>> loom_view(bool grads) {
    auto pick = [&](const torch::Tensor& t) { return grads ? t.grad() : t; };
    std::vector<std::pair<std::string, torch::Tensor>> out = {{"wte", pick(wte->weight)},
                                                              {"wpe", pick(wpe)},
                                                              {"lnf.w", pick(lnf->weight)},
                                                              {"lnf.b", pick(lnf->bias)}};
    for (size_t l = 0; l < blocks.size(); ++l) {
      auto& b = blocks[l];
      std::string p = "h" + std::to_string(l) + ".";
      torch::Tensor w = pick(b->attn->in_proj_weight), bias = pick(b->attn->in_proj_bias);
      const char* qkv[] = {"q", "k", "v"};
      for (int i = 0; i < 3; ++i) {
        out.push_back({p + "attn." + qkv[i] + ".w", w.narrow(0, i * hidden_, hidden_)});
        out.push_back({p + "attn." + qkv[i] + ".b", bias.narrow(0, i * hidden_, hidden_)});
      }
      out.push_back({p + "attn.proj.w", pick(b->attn->out_proj->weight)});
      out.push_back({p + "attn.proj.b", pick(b->attn->out_proj->bias)});
      out.push_back({p + "ln1.w", pick(b->ln1->weight)});
      out.push_back({p + "ln1.b", pick(b->ln1->bias)});
      out.push_back({p + "ln2.w", pick(b->ln2->weight)});
      out.push_back({p + "ln2.b", pick(b->ln2->bias)});
      out.push_back({p + "mlp.fc1.w", pick(b->fc1->weight)});
      out.push_back({p + "mlp.fc1.b", pick(b->fc1->bias)});
      out.push_back({p + "mlp.fc2.w", pick(b->fc2->weight)});
      out.push_back({p + "mlp.fc2.b", pick(b->fc2->bias)});
    }
    return out;
  }

  int64_t hidden_;
  torch::nn::Embedding wte;
  torch::Tensor wpe;
  std::vector<GptBlock> blocks;
  torch::nn::LayerNorm lnf;
  torch::Tensor mask_;
};
TORCH_MODULE(Gpt);

}  // namespace loom::reference
