// An independent Swin Transformer in plain LibTorch, following the structure of the paper's
// PyTorch code (windows flattened into the batch, one qkv projection, relative position index
// and shifted-window mask built with slices, patch merging by strided slices and a
// convolution for the patch embedding). Weights are read by loom's parameter names.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace loom::reference {

struct SwinShape {
  int64_t image, channels, patch, embed, window, mlp_ratio, classes;
  std::vector<int64_t> depths, heads;
};

class Swin {
 public:
  // `weight(name)` returns the leaf tensor of the loom parameter `name`.
  Swin(SwinShape shape, std::function<torch::Tensor(const std::string&)> weight)
      : s_(std::move(shape)), w_(std::move(weight)) {}

  // Mean cross-entropy of images [B, channels, image, image] against labels [B].
  torch::Tensor loss(const torch::Tensor& images, const torch::Tensor& labels) const {
    namespace F = torch::nn::functional;
    const int64_t B = images.size(0), C = s_.embed, P = s_.patch;
    torch::Tensor conv_w = w_("embed.proj.w").view({C, P, P, s_.channels}).permute({0, 3, 1, 2});
    torch::Tensor x =
        F::conv2d(images, conv_w, F::Conv2dFuncOptions().stride(P).bias(w_("embed.proj.b")));
    int64_t H = x.size(2), W = x.size(3);
    x = x.flatten(2).transpose(1, 2);  // B, L, C
    x = norm(x, "embed.norm");
    for (size_t i = 0; i < s_.depths.size(); ++i) {
      const std::string st = "s" + std::to_string(i) + ".";
      if (i > 0) {
        torch::Tensor v = x.view({B, H, W, -1});
        using torch::indexing::Slice;
        torch::Tensor x0 = v.index({Slice(), Slice(0, None, 2), Slice(0, None, 2)});
        torch::Tensor x1 = v.index({Slice(), Slice(1, None, 2), Slice(0, None, 2)});
        torch::Tensor x2 = v.index({Slice(), Slice(0, None, 2), Slice(1, None, 2)});
        torch::Tensor x3 = v.index({Slice(), Slice(1, None, 2), Slice(1, None, 2)});
        H /= 2;
        W /= 2;
        x = torch::cat({x0, x1, x2, x3}, -1).view({B, H * W, -1});
        x = norm(x, st + "merge.norm");
        x = torch::linear(x, w_(st + "merge.reduce.w"));
      }
      int64_t window = s_.window, shift = s_.window / 2;
      if (std::min(H, W) <= window) {
        window = std::min(H, W);
        shift = 0;
      }
      for (int64_t j = 0; j < s_.depths[i]; ++j)
        x = block(x, st + "b" + std::to_string(j) + ".", H, W, window, j % 2 ? shift : 0,
                  s_.heads[i]);
    }
    x = norm(x, "norm").mean(1);
    torch::Tensor logits = torch::linear(x, w_("head.w"), w_("head.b"));
    return torch::nn::functional::cross_entropy(logits, labels);
  }

 private:
  static constexpr auto None = torch::indexing::None;

  torch::Tensor norm(const torch::Tensor& x, const std::string& name) const {
    return torch::layer_norm(x, {x.size(-1)}, w_(name + ".w"), w_(name + ".b"), 1e-5);
  }

  static torch::Tensor partition(const torch::Tensor& x, int64_t ws) {  // B,H,W,C -> nW*B, ws*ws, C
    const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    return x.view({B, H / ws, ws, W / ws, ws, C})
        .permute({0, 1, 3, 2, 4, 5})
        .contiguous()
        .view({-1, ws * ws, C});
  }
  static torch::Tensor reverse(const torch::Tensor& w, int64_t ws, int64_t H, int64_t W) {
    const int64_t B = w.size(0) / (H * W / ws / ws);
    return w.view({B, H / ws, W / ws, ws, ws, -1})
        .permute({0, 1, 3, 2, 4, 5})
        .contiguous()
        .view({B, H, W, -1});
  }

  torch::Tensor block(torch::Tensor x, const std::string& p, int64_t H, int64_t W, int64_t ws,
                      int64_t shift, int64_t heads) const {
    using torch::indexing::Slice;
    const int64_t B = x.size(0), C = x.size(2), N = ws * ws, d = C / heads;
    torch::Tensor shortcut = x;
    torch::Tensor h = norm(x, p + "norm1").view({B, H, W, C});
    if (shift > 0) h = torch::roll(h, {-shift, -shift}, {1, 2});
    torch::Tensor win = partition(h, ws);  // B_, N, C
    const int64_t B_ = win.size(0);
    torch::Tensor qkv_w = torch::cat({w_(p + "attn.q.w"), w_(p + "attn.k.w"), w_(p + "attn.v.w")});
    torch::Tensor qkv_b = torch::cat({w_(p + "attn.q.b"), w_(p + "attn.k.b"), w_(p + "attn.v.b")});
    torch::Tensor qkv =
        torch::linear(win, qkv_w, qkv_b).reshape({B_, N, 3, heads, d}).permute({2, 0, 3, 1, 4});
    torch::Tensor q = qkv[0] * std::pow(static_cast<double>(d), -0.5), k = qkv[1], v = qkv[2];
    torch::Tensor attn = torch::matmul(q, k.transpose(-2, -1));  // B_, heads, N, N

    // Relative position bias: coordinates of the window's tokens, pairwise offsets shifted to
    // start at 0, row offset scaled by 2*ws-1.
    torch::Tensor coords =
        torch::stack(torch::meshgrid({torch::arange(ws), torch::arange(ws)}, "ij")).flatten(1);
    torch::Tensor rel =
        (coords.index({Slice(), Slice(), None}) - coords.index({Slice(), None, Slice()}))
            .permute({1, 2, 0})
            .contiguous();
    rel.select(2, 0).add_(ws - 1);
    rel.select(2, 1).add_(ws - 1);
    rel.select(2, 0).mul_(2 * ws - 1);
    torch::Tensor index = rel.sum(-1);
    torch::Tensor bias =
        w_(p + "attn.bias_table").index({index.view(-1)}).view({N, N, -1}).permute({2, 0, 1});
    attn = attn + bias.unsqueeze(0);

    if (shift > 0) {
      torch::Tensor img = torch::zeros({1, H, W, 1});
      int64_t cnt = 0;
      const std::vector<std::pair<int64_t, int64_t>> spans = {{0, -ws}, {-ws, -shift}, {-shift, 0}};
      for (auto [h0, h1] : spans)
        for (auto [w0, w1] : spans) {
          auto end = [](int64_t e, int64_t n) { return e == 0 ? n : n + e; };
          auto start = [](int64_t b, int64_t n) { return b < 0 ? n + b : b; };
          img.index_put_(
              {Slice(), Slice(start(h0, H), end(h1, H)), Slice(start(w0, W), end(w1, W)), Slice()},
              static_cast<double>(cnt++));
        }
      torch::Tensor mw = partition(img, ws).view({-1, N});
      torch::Tensor mask = mw.unsqueeze(1) - mw.unsqueeze(2);
      mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0);
      const int64_t nW = mask.size(0);
      attn = attn.view({B_ / nW, nW, heads, N, N}) + mask.unsqueeze(1).unsqueeze(0);
      attn = attn.view({-1, heads, N, N});
    }
    attn = torch::softmax(attn, -1);
    torch::Tensor a = torch::matmul(attn, v).transpose(1, 2).reshape({B_, N, C});
    a = torch::linear(a, w_(p + "attn.proj.w"), w_(p + "attn.proj.b"));
    torch::Tensor back = reverse(a.view({-1, ws, ws, C}), ws, H, W);
    if (shift > 0) back = torch::roll(back, {shift, shift}, {1, 2});
    x = shortcut + back.view({B, H * W, C});
    torch::Tensor f =
        torch::gelu(torch::linear(norm(x, p + "norm2"), w_(p + "mlp.fc1.w"), w_(p + "mlp.fc1.b")));
    return x + torch::linear(f, w_(p + "mlp.fc2.w"), w_(p + "mlp.fc2.b"));
  }

  SwinShape s_;
  std::function<torch::Tensor(const std::string&)> w_;
};

}  // namespace loom::reference
