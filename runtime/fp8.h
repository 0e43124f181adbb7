// Float8 matrix products for run.precision fp8, with current scaling: each operand is scaled by
// its own amax as it is now (one scale per tensor, or one per row of the product's operands),
// cast to float8 (e4m3 for activations and weights, e5m2 for gradients, whose range matters more
// than their precision), multiplied by at::_scaled_mm with float32 accumulation, and the result
// scaled back in bf16. What a product gives is exactly the float32 product of the quantized
// operands, rounded once to its dtype (tests/runtime/fp8_test.cc).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace loom::runtime {

enum class Fp8Scaling : int8_t { kTensorwise, kRowwise };

// A tensor quantized to float8: value ≈ data · scale, scale float32 of shape [1] (tensorwise),
// [rows, 1] or [1, cols] (rowwise along the other dimension).
struct Fp8Tensor {
  at::Tensor data;
  at::Tensor scale;
};

// Quantizes a 2-d tensor to `dtype` (at::kFloat8_e4m3fn or at::kFloat8_e5m2): tensorwise one
// scale, rowwise one scale per slice along `reduce_dim` (1: per row, 0: per column), each
// mapping the slice's amax onto the format's largest finite value (448 for e4m3, 57344 for
// e5m2). An all-zero slice is quantized to zeros with a finite scale.
Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType dtype, Fp8Scaling scaling,
                       int64_t reduce_dim);

// An [r, c] tensor quantized per column (reduced over its rows, or whole), as the rows of its
// transpose: data [c, r] contiguous, scale [c, 1] (rowwise) or [1, 1]. The cast writes the
// transposed layout directly, one pass over x (the left operand of gᵀ·x, the right of g·W).
Fp8Tensor quantize_fp8_transposed(const at::Tensor& x, at::ScalarType dtype, Fp8Scaling scaling);

// a [m, k] · b [n, k]ᵀ from operands quantized along k (a by rows, b by rows), in `out` dtype.
// `a` may be e4m3 or e5m2, `b` e4m3 (what cuBLAS and the row-wise kernels take). On a GPU one
// at::_scaled_mm; on the CPU (emulation for tests, LOOM_DEBUG_FP8_ON_CPU) LibTorch's float8
// product with unit scales (its CPU kernel takes tensor-wise scales only) and the scales applied
// to its float32 result.
at::Tensor scaled_product(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out,
                          bool fast_accumulation);

// Whether fp8 can multiply these sizes: _scaled_mm wants k and n multiples of 16 (the other
// products of a linear then fit too when m is one). Others run in the activations' dtype.
bool fp8_fits(int64_t m, int64_t k, int64_t n);

// Why `device` cannot run fp8 products, or nullopt: a GPU needs float8 tensor cores (compute
// capability 8.9: Ada, Hopper and later); the CPU has none, unless LOOM_DEBUG_FP8_ON_CPU=1 asks
// for LibTorch's emulation (tests).
std::optional<std::string> fp8_refusal(const c10::Device& device);

}  // namespace loom::runtime
