#include "runtime/linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "runtime/fp8.h"
#include "runtime/small_gemm.h"

namespace loom::runtime {
namespace {

// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars,
// str? algorithm) -> Tensor Y: X·Wᵀ + B on 2-d X, any strides of W.
using PointwiseLinear = at::Tensor(const at::Tensor&, const at::Tensor&,
                                   const std::optional<at::Tensor>&, c10::string_view,
                                   c10::List<std::optional<c10::Scalar>>,
                                   std::optional<c10::string_view>);

// The operator's handle, looked up once per process; empty where LibTorch has no oneDNN.
const std::optional<c10::TypedOperatorHandle<PointwiseLinear>>& onednn_linear() {
  static const std::optional<c10::TypedOperatorHandle<PointwiseLinear>> handle =
      []() -> std::optional<c10::TypedOperatorHandle<PointwiseLinear>> {
    if (!at::hasMKLDNN()) return std::nullopt;
    auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
    return op->typed<PointwiseLinear>();
  }();
  return handle;
}

// Below this many multiply-adds oneDNN's fixed cost per call (its tensor descriptors and the
// primitive cache's look-up, some 10 µs) outweighs its faster kernel: measured on these CPUs,
// one thread, MKL is 5-28 % faster under 2^23 (a 512 x 64 x 64 product: 48 against 60 µs) and
// oneDNN 5-8 % faster from 2^24 (1024 x 128 x 128, 256 x 256 x 256) up.
constexpr int64_t kOnednnMinMultiplyAdds = int64_t{1} << 24;

// Whether a·bᵀ, b of [n, k], runs on oneDNN.
bool on_onednn(const at::Tensor& a, const at::Tensor& b) {
  if (!a.device().is_cpu() || !b.device().is_cpu() || a.scalar_type() != at::kFloat ||
      b.scalar_type() != at::kFloat || !onednn_linear().has_value())
    return false;
  return a.numel() * b.size(0) >= kOnednnMinMultiplyAdds;  // rows x k x n
}

// a·bᵀ (+ bias) over a's last dimension on oneDNN, b of any strides.
at::Tensor onednn_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
  const at::Tensor a2 = a.reshape({-1, a.size(-1)});
  const std::optional<at::Tensor> b_opt =
      bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  at::Tensor out = onednn_linear()->call(a2, b, b_opt, "none",
                                         c10::List<std::optional<c10::Scalar>>(), std::nullopt);
  std::vector<int64_t> shape = a.sizes().vec();
  shape.back() = b.size(0);
  return out.view(shape);
}

// The small-GEMM kernel (runtime/small_gemm.h) runs products whose operands are at most this
// wide (k and n) at 106-116 GFLOP/s on one core of these CPUs with the data in cache, against
// 97-110 for oneDNN's matmul and 93-103 for MKL's; wider ones lose its cache blocking (a
// 4096-deep product: 69 GFLOP/s). Within a training step only the square weight gradient kept
// an advantage (bench/RESULTS.md, "linear products on the CPU"), so only it runs there.
constexpr int64_t kSmallGemmMaxWidth = 1024;

bool row_major(const at::Tensor& x) { return x.dim() == 2 && x.stride(1) == 1; }

// A new contiguous xᵀ of a float32 CPU matrix with unit-stride rows, in register tiles (2.4-3.7
// times faster than LibTorch's blocked transposing copy at 1024 x 256 to 1024 x 4096).
at::Tensor transposed(const at::Tensor& x) {
  if (!row_major(x) || x.scalar_type() != at::kFloat || !x.device().is_cpu())
    return x.t().contiguous();
  RECORD_FUNCTION("loom::transpose", std::vector<c10::IValue>());
  at::Tensor out = at::empty({x.size(1), x.size(0)}, x.options());
  transpose_rows(x.data_ptr<float>(), x.stride(0), out.data_ptr<float>(), x.size(0), x.size(0),
                 x.size(1), 1.0f);
  return out;
}

// a [m, k] · b [k, n] on the small-GEMM kernel, the rows of a split across LibTorch's threads.
// With a bias [n], every row of c starts from it.
at::Tensor rows_product(const at::Tensor& a, const at::Tensor& b,
                        const at::Tensor& bias = at::Tensor()) {
  RECORD_FUNCTION("loom::small_gemm", std::vector<c10::IValue>());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  at::Tensor c = bias.defined() ? bias.expand({m, n}).contiguous() : at::empty({m, n}, a.options());
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
  float* pc = c.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(64, m / std::max(1, at::get_num_threads()));
  at::parallel_for(0, m, grain, [&](int64_t begin, int64_t end) {
    gemm_rows(end - begin, n, k, pa + begin * a.stride(0), a.stride(0), pb, b.stride(0),
              pc + begin * n, n, bias.defined());
  });
  return c;
}

// Whether a [m, k] · b [k, n] (any strides) suits the small-GEMM kernel: float32 on the CPU, at
// most kSmallGemmMaxWidth deep and wide.
bool small_gemm_fits(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == at::kFloat &&
         b.scalar_type() == at::kFloat && a.dim() == 2 && b.dim() == 2 && a.size(0) > 0 &&
         a.size(1) <= kSmallGemmMaxWidth && b.size(1) <= kSmallGemmMaxWidth;
}

// A product under oneDNN's threshold that the small-GEMM kernel runs, its operands' rows read
// as they lie: 10-28 % faster than MKL at case 1's 512 x 64 x 64 to 512 x 256 x 64, forward,
// input and weight gradient, transposed copies included (bench/RESULTS.md, "linear products on
// the CPU").
bool small_product(const at::Tensor& a, const at::Tensor& b) {
  return small_gemm_fits(a, b) && !on_onednn(a, b.t());
}

// at::linear's derivatives, with the products linear_product, linear_input_grad and
// linear_weight_grad choose. The bias travels as an optional: autograd takes every tensor
// argument for a variable and fails on an undefined one.
struct LinearFn : public torch::autograd::Function<LinearFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                at::Tensor weight, std::optional<at::Tensor> bias,
                                                int64_t math) {
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["math"] = math;
    ctx->save_for_backward({x, weight});
    return {linear_product(x, weight, bias.value_or(at::Tensor()), static_cast<LinearMath>(math))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto math = static_cast<LinearMath>(ctx->saved_data["math"].toInt());
    const at::Tensor& g = grads[0];
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = linear_input_grad(g, saved[1], math);
    if (ctx->needs_input_grad(1)) gw = linear_weight_grad(g, saved[0], math);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))
      gb = g.reshape({-1, g.size(-1)}).sum(0);
    return {gx, gw, gb, at::Tensor()};
  }
};

// Whether a product of a linear with this x and weight runs in float8: fp8 asked for, bf16
// operands (the run's activations), sizes _scaled_mm takes (runtime/fp8.h).
bool in_fp8(LinearMath math, const at::Tensor& x, const at::Tensor& weight) {
  return math != LinearMath::kDefault && x.scalar_type() == at::kBFloat16 &&
         weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 &&
         fp8_fits(x.numel() / x.size(-1), weight.size(1), weight.size(0));
}

Fp8Scaling scaling_of(LinearMath math) {
  return math == LinearMath::kFp8Rowwise ? Fp8Scaling::kRowwise : Fp8Scaling::kTensorwise;
}

// Forward products accumulate fast (Hopper's float8 path keeps fewer partial-sum bits), the
// gradients' at full float32 precision: torchao's and Transformer Engine's choice.
at::Tensor fp8_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       Fp8Scaling scaling) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y =
      scaled_product(quantize_fp8(x2, at::kFloat8_e4m3fn, scaling, 1),
                     quantize_fp8(weight, at::kFloat8_e4m3fn, scaling, 1), x.scalar_type(), true);
  if (bias.defined()) y.add_(bias);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return y.view(shape);
}

at::Tensor fp8_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                          Fp8Scaling scaling) {
  const at::Tensor g = grad_output.reshape({-1, grad_output.size(-1)});
  at::Tensor gx = scaled_product(quantize_fp8(g, at::kFloat8_e5m2, scaling, 1),
                                 quantize_fp8_transposed(weight, at::kFloat8_e4m3fn, scaling),
                                 grad_output.scalar_type(), false);
  std::vector<int64_t> shape = grad_output.sizes().vec();
  shape.back() = weight.size(1);
  return gx.view(shape);
}

at::Tensor fp8_weight_grad(const at::Tensor& grad_output, const at::Tensor& x, Fp8Scaling scaling) {
  const at::Tensor g = grad_output.reshape({-1, grad_output.size(-1)});
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  // gᵀ·x: both reduced over the tokens, so both are quantized per column.
  return scaled_product(quantize_fp8_transposed(g, at::kFloat8_e5m2, scaling),
                        quantize_fp8_transposed(x2, at::kFloat8_e4m3fn, scaling),
                        grad_output.scalar_type(), false);
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  LinearMath math) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  if (!in_fp8(math, x, weight) && !on_onednn(x, weight) &&
      !(small_product(x2, weight.t()) && row_major(x2) && row_major(weight)))
    return at::linear(x, weight, bias);
  return LinearFn::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                         static_cast<int64_t>(math))[0];
}

at::Tensor linear_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          LinearMath math) {
  if (in_fp8(math, x, weight)) return fp8_product(x, weight, bias, scaling_of(math));
  if (on_onednn(x, weight)) return onednn_product(x, weight, bias);
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  // x·Wᵀ from a transposed copy of the weight (the product reads B's rows).
  if (small_product(x2, weight.t()) && row_major(x2) && row_major(weight)) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return rows_product(x2, transposed(weight), bias).view(shape);
  }
  return at::linear(x, weight, bias);
}

at::Tensor linear_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                             LinearMath math) {
  if (in_fp8(math, grad_output, weight.t()))
    return fp8_input_grad(grad_output, weight, scaling_of(math));
  // g·W = g·(Wᵀ)ᵀ: oneDNN reads the transposed view as it is.
  const at::Tensor weight_t = weight.t();
  if (on_onednn(grad_output, weight_t)) return onednn_product(grad_output, weight_t, at::Tensor());
  const at::Tensor g = grad_output.reshape({-1, grad_output.size(-1)});
  if (small_product(g, weight) && row_major(g) && row_major(weight)) {
    std::vector<int64_t> shape = grad_output.sizes().vec();
    shape.back() = weight.size(1);
    return rows_product(g, weight).view(shape);
  }
  return at::matmul(grad_output, weight);
}

// Up to this many elements, the weight gradient's transposed copy costs less than oneDNN gains
// over MKL when it computes xᵀ·g (the copy of a 1024 x 256 block stays in the core's cache; one
// of gpt2-124m's 3072 x 768 took 2.9 ms, more than the product gained).
constexpr int64_t kTransposedGradMaxElements = int64_t{1} << 20;

at::Tensor linear_weight_grad(const at::Tensor& grad_output, const at::Tensor& x, LinearMath math) {
  if (math != LinearMath::kDefault && x.scalar_type() == at::kBFloat16 &&
      grad_output.scalar_type() == at::kBFloat16 &&
      fp8_fits(x.numel() / x.size(-1), x.size(-1), grad_output.size(-1)))
    return fp8_weight_grad(grad_output, x, scaling_of(math));
  const at::Tensor g = grad_output.reshape({-1, grad_output.size(-1)});
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  const int64_t out = g.size(1), in = x2.size(1);
  // gᵀ·x as oneDNN's product of gᵀ with the weight operand xᵀ: faster than MKL with more inputs
  // than outputs (an MLP's second linear), slower otherwise (bench/RESULTS.md, "linear products
  // on the CPU").
  if (in > out && on_onednn(g.t(), x2.t())) return onednn_product(g.t(), x2.t(), at::Tensor());
  // With more outputs than inputs oneDNN is faster computing xᵀ·g, the transpose of the
  // gradient, which is then copied back into the weight's layout.
  if (out > in && out * in <= kTransposedGradMaxElements && on_onednn(x2.t(), g.t()))
    return transposed(onednn_product(x2.t(), g.t(), at::Tensor()));
  // A square weight's gradient, and a product under oneDNN's threshold: gᵀ copied in register
  // tiles, then gᵀ·x as the rows read.
  if ((out == in || !on_onednn(g.t(), x2.t())) && small_gemm_fits(g.t(), x2) && row_major(g) &&
      row_major(x2))
    return rows_product(transposed(g), x2);
  return g.t().mm(x2);
}

bool linear_uses_onednn() { return onednn_linear().has_value(); }

}  // namespace loom::runtime
