#include "runtime/kernels_vision.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <cmath>
#include <map>
#include <tuple>
#include <utility>

namespace loom::runtime {
namespace {

using Ctx = KernelContext;
using Tensors = std::vector<at::Tensor>;

Tensors patchify(const Ctx& ctx, const Tensors& in) {
  const int64_t ph = ctx.op.attrs().get<int64_t>("ph"), pw = ctx.op.attrs().get<int64_t>("pw");
  const at::Tensor& x = in[0];
  const int64_t b = x.size(0), c = x.size(1), y = x.size(2) / ph, w = x.size(3) / pw;
  return {x.view({b, c, y, ph, w, pw}).permute({0, 2, 4, 3, 5, 1}).reshape({b, y, w, ph * pw * c})};
}

Tensors window_partition(const Ctx& ctx, const Tensors& in) {
  const int64_t wy = ctx.op.attrs().get<int64_t>("wy"), wx = ctx.op.attrs().get<int64_t>("wx");
  const int64_t shift = ctx.op.attrs().get_or<int64_t>("shift", 0);
  at::Tensor x = shift > 0 ? at::roll(in[0], {-shift, -shift}, {1, 2}) : in[0];
  const int64_t b = x.size(0), gy = x.size(1) / wy, gx = x.size(2) / wx, c = x.size(3);
  return {
      x.view({b, gy, wy, gx, wx, c}).permute({0, 1, 3, 2, 4, 5}).reshape({b, gy * gx, wy * wx, c})};
}

Tensors window_reverse(const Ctx& ctx, const Tensors& in) {
  const int64_t wy = ctx.op.attrs().get<int64_t>("wy"), wx = ctx.op.attrs().get<int64_t>("wx");
  const int64_t shift = ctx.op.attrs().get_or<int64_t>("shift", 0);
  const at::Tensor& x = in[0];
  const int64_t gx = ctx.op.attrs().get<int64_t>("gx");  // windows per row: never split
  const int64_t b = x.size(0), gy = x.size(1) / gx, c = x.size(3);
  at::Tensor image =
      x.view({b, gy, gx, wy, wx, c}).permute({0, 1, 3, 2, 4, 5}).reshape({b, gy * wy, gx * wx, c});
  return {shift > 0 ? at::roll(image, {shift, shift}, {1, 2}) : image};
}

// Swin's relative position index of a w x w window: for tokens i, j the row of the bias table
// holding their offset, (dy + w - 1) * (2w - 1) + (dx + w - 1).
at::Tensor relative_position_index(int64_t w) {
  at::Tensor coords =
      at::stack(at::meshgrid({at::arange(w), at::arange(w)}, "ij")).flatten(1);  // 2, T
  at::Tensor rel = coords.unsqueeze(2) - coords.unsqueeze(1);                    // 2, T, T
  return ((rel[0] + (w - 1)) * (2 * w - 1) + (rel[1] + (w - 1))).flatten();
}

// The shifted-window mask of every window [windows, T, T]: -100 where two tokens came from
// different regions of the rolled image (as in Swin's code), else 0.
at::Tensor shift_mask(int64_t w, int64_t shift, int64_t grid_y, int64_t grid_x) {
  const int64_t height = grid_y * w, width = grid_x * w;
  at::Tensor region = at::zeros({height, width}, at::kLong);
  const int64_t ys[] = {0, height - w, height - shift, height};
  const int64_t xs[] = {0, width - w, width - shift, width};
  int64_t id = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      region.slice(0, ys[i], ys[i + 1]).slice(1, xs[j], xs[j + 1]).fill_(id++);
  at::Tensor windows =
      region.view({grid_y, w, grid_x, w}).permute({0, 2, 1, 3}).reshape({grid_y * grid_x, w * w});
  at::Tensor differ = windows.unsqueeze(1).ne(windows.unsqueeze(2));
  return at::zeros(differ.sizes(), at::kFloat).masked_fill_(differ, -100.0);
}

Tensors window_attention(const Ctx& ctx, const Tensors& in) {
  const auto& attrs = ctx.op.attrs();
  const int64_t d = attrs.get<int64_t>("d"), w = attrs.get<int64_t>("window");
  const int64_t shift = attrs.get_or<int64_t>("shift", 0);
  const at::Tensor& q = in[0];
  const int64_t b = q.size(0), s = q.size(1), t = q.size(2), h = q.size(3) / d;
  auto heads = [&](const at::Tensor& x) {
    return x.view({b, s, t, h, d}).permute({0, 1, 3, 2, 4});
  };
  at::Tensor scores = at::matmul(heads(q) * (1.0 / std::sqrt(static_cast<double>(d))),
                                 heads(in[1]).transpose(-2, -1));  // b s h t t
  // Constant per shape, device, dtype and thread: the position index and the masks.
  const int64_t where = static_cast<int64_t>(q.device().type()) * 4096 + q.device().index() + 1;
  thread_local std::map<std::pair<int64_t, int64_t>, at::Tensor> indices;
  at::Tensor& index = indices[{w, where}];
  if (!index.defined()) index = relative_position_index(w).to(q.device());
  at::Tensor bias = in[3].index_select(0, index).view({t, t, h}).permute({2, 0, 1});
  scores = scores + bias;
  if (shift > 0) {
    thread_local std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int>, at::Tensor>
        masks;
    const int64_t gy = attrs.get<int64_t>("grid_y"), gx = attrs.get<int64_t>("grid_x");
    at::Tensor& mask = masks[{w, shift, gy, gx, where, static_cast<int>(scores.scalar_type())}];
    if (!mask.defined()) mask = shift_mask(w, shift, gy, gx).to(scores.options());
    const int64_t first = ctx.op.inputs[0].ranges[1].start;
    scores = scores + mask.slice(0, first, first + s).view({1, s, 1, t, t});
  }
  // Softmax in float32 whatever the activations' dtype.
  at::Tensor out = at::matmul(at::softmax(scores, -1, at::kFloat).to(in[2].scalar_type()),
                              heads(in[2]));  // b s h t d
  return {out.permute({0, 1, 3, 2, 4}).reshape({b, s, t, h * d})};
}

Tensors patch_merge(const Ctx&, const Tensors& in) {
  const at::Tensor& x = in[0];
  const int64_t b = x.size(0), y = x.size(1) / 2, w = x.size(2) / 2, c = x.size(3);
  // (b, y, row offset, x, column offset, c) -> features ordered by (column, row) offset.
  return {x.view({b, y, 2, w, 2, c}).permute({0, 1, 3, 4, 2, 5}).reshape({b, y, w, 4 * c})};
}

Tensors mean_pool(const Ctx& ctx, const Tensors& in) {
  const double tokens = static_cast<double>(ctx.full_size(0, 1) * ctx.full_size(0, 2));
  return {in[0].sum({1, 2}) / tokens};
}

}  // namespace

void add_vision_kernels(KernelRegistry& r) {
  const std::pair<const char*, Kernel> kernels[] = {
      {"patchify", patchify},
      {"window_partition", window_partition},
      {"window_reverse", window_reverse},
      {"window_attention", window_attention},
      {"patch_merge", patch_merge},
      {"mean_pool", mean_pool},
  };
  for (const auto& [type, kernel] : kernels) {
    Status s = r.add(type, kernel);
    LOOM_CHECK(s.ok()) << s.error().message;
  }
}

}  // namespace loom::runtime
