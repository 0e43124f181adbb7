// A linear layer's matrix products, on the kernels that are fastest for the rank's device and
// dtype. On the CPU in float32 the forward x·Wᵀ + b and the input gradient g·W run through
// LibTorch's oneDNN matrix multiply (`mkldnn::_linear_pointwise`, the kernel torch.compile's
// CPU backend calls), 7-13 % faster than at::linear's MKL sgemm on these CPUs. The weight
// gradient gᵀ·x runs there too where the weight is not square, in the operand order oneDNN is
// fastest in, and a square one (up to 1024 wide) on LibTorch's small-GEMM kernel from a
// transposed copy of g (bench/RESULTS.md, "linear products on the CPU"). Products under 2^24
// multiply-adds, where oneDNN's cost per call outweighs its kernel, run on the small-GEMM kernel
// too where their operands are at most 1024 wide, from transposed copies of W (forward) and g
// (weight gradient); everywhere else (GPUs, bf16, wider small products) at::linear's kernels.
// Under run.precision fp8 each of the three products of a bf16 linear whose sizes suit
// at::_scaled_mm runs in float8 instead (runtime/fp8.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::runtime {

// How a linear's products run: in the operands' dtype, or quantized to float8 with one scale
// per tensor or one per row (run.precision fp8, fp8.scaling).
enum class LinearMath : int8_t { kDefault, kFp8Tensorwise, kFp8Rowwise };

// x·Wᵀ + b over x's last dimension (bias may be undefined), differentiable in x, weight and
// bias like at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  LinearMath math = LinearMath::kDefault);

// The two products alone, outside autograd, for linears whose backward loom writes itself
// (deferred and gathered weights): x·Wᵀ + b, and the input gradient g·W.
at::Tensor linear_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          LinearMath math = LinearMath::kDefault);
at::Tensor linear_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                             LinearMath math = LinearMath::kDefault);

// gᵀ·x summed over every leading dimension: the weight's gradient [out, in].
at::Tensor linear_weight_grad(const at::Tensor& grad_output, const at::Tensor& x,
                              LinearMath math = LinearMath::kDefault);

// Whether the CPU float32 products run on oneDNN in this process (LibTorch built with it).
bool linear_uses_onednn();

}  // namespace loom::runtime
