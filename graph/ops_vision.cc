#include "graph/ops_vision.h"

namespace loom::graph {

void add_vision_ops(OpRegistry& r) {
  auto must = [&](OpSchema s) {
    Status st = r.add(std::move(s));
    LOOM_CHECK(st.ok()) << st.error().message;
  };
  // Images [b, c, y*ph, x*pw] (channels first) to patches [b, y, x, ph*pw*c] (attributes ph,
  // pw): a linear layer on the patches is the strided convolution of the patch embedding.
  // Splitting y cuts the image into bands of patch rows.
  must(OpSchema::simple("patchify", "b c^ (y ph^) (x pw^) -> b y x (ph^ pw^ c^)"));

  // [b, y, x, c] to windows [b, gy*gx, wy*wx, c] of wy x wx tokens (attributes wy, wx, gx), in
  // row-major window order. With attribute shift > 0 the image is first rolled by -shift along
  // y and x (Swin's cyclic shift); window_reverse undoes both. Unshifted, a band of window rows
  // is a band of image rows, so both ops split along gy; shifted, a window gathers tokens from
  // both ends of the image, so only the batch and the channels split.
  auto windows = [](bool forward) {
    return [forward](const Attrs& a) {
      const std::string g = a.get_or<int64_t>("shift", 0) > 0 ? "gy^" : "gy";
      const std::string image = "b (" + g + " wy^) (gx^ wx^) c";
      const std::string win = "b (" + g + " gx^) (wy^ wx^) c";
      return forward ? image + " -> " + win : win + " -> " + image;
    };
  };
  OpSchema partition;
  partition.type = "window_partition";
  partition.annotation = windows(true);
  must(partition);
  OpSchema reverse;
  reverse.type = "window_reverse";
  reverse.annotation = windows(false);
  must(reverse);

  // Multi-head self-attention inside each window: q, k, v [b, windows, tokens, heads*d] and the
  // relative position bias table [(2w-1)^2, heads]. Attributes: d (head size), window (w),
  // shift, grid_y and grid_x (windows per image column and row, for the shifted-window mask).
  // Windows and heads are independent, so both split; a piece reads its windows' masks.
  OpSchema attention = OpSchema::simple(
      "window_attention", "b s t^ (h d^), b s t^ (h d^), b s t^ (h d^), r^ h -> b s t^ (h d^)");
  attention.attention_core = true;
  attention.rules.flops = flops_of_labels(4, {"b", "s", "t", "t", "h", "d"});
  attention.rules.tensor_parallel = tp_split("h");
  must(std::move(attention));

  // Swin's patch merging: each 2x2 block of tokens [b, 2y, 2x, c] becomes one token of 4c
  // features, ordered (0,0), (1,0), (0,1), (1,1) by (row, column) offset as in the paper's code.
  must(OpSchema::simple("patch_merge", "b (y 2) (x 2) c^ -> b y x (4 c^)"));

  // Mean over the spatial dimensions [b, y, x, c] -> [b, c]; pieces of y or x are partial sums
  // (each divides by the full token count).
  must(OpSchema::simple("mean_pool", "b y+ x+ c -> b c"));
}

}  // namespace loom::graph
