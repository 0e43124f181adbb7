// run.precision=fp8 on the CPU, as far as LibTorch's CPU float8 kernel allows: quantization and
// its scales, the scaled product against the float32 product of the quantized operands, a
// linear's three products, the refusal on a device without float8 units, and GPT tiny trained
// through the whole fp8 path (LOOM_DEBUG_FP8_ON_CPU, emulated) close to bf16. The same products
// on a GPU, at::_scaled_mm's own, are tested in gpu_test.cc.
#include "runtime/fp8.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "launch/planned_trainer.h"
#include "launch/run_device.h"
#include "runtime/device.h"
#include "runtime/linear.h"
#include "tests/support/train_losses.h"

namespace loom {
namespace {

using runtime::Fp8Scaling;
using runtime::Fp8Tensor;

at::Tensor dequantized(const Fp8Tensor& t) { return t.data.to(at::kDouble) * t.scale; }

// e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself; below its smallest
// normal (2^-6, scaled) the step is the subnormal spacing 2^-9, so half of it, 2^-10 of the
// scale, bounds the absolute error there. e5m2: 2 bits (2^-3), subnormal spacing 2^-16.
void expect_quantized(const at::Tensor& x, const Fp8Tensor& q, double rel, double abs_of_scale) {
  const at::Tensor back = dequantized(q);
  const at::Tensor err = (back - x.to(at::kDouble)).abs();
  const at::Tensor bound = x.to(at::kDouble).abs() * rel + q.scale.to(at::kDouble) * abs_of_scale;
  EXPECT_TRUE(at::all(err <= bound).item<bool>()) << "largest error " << err.max().item<double>();
}

TEST(Fp8, EachAmaxMapsOntoTheFormatsLargestValue) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({48, 32}) * 3;
  const Fp8Tensor t = runtime::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Scaling::kTensorwise, 1);
  EXPECT_EQ(t.data.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(t.scale.numel(), 1);
  EXPECT_EQ(t.data.to(at::kFloat).abs().max().item<float>(), 448.0f);
  expect_quantized(x, t, std::ldexp(1.0, -4), std::ldexp(1.0, -10));
  // Per row: every row reaches 448, and a row of small values keeps its precision.
  at::Tensor y = x.clone();
  y[3] *= 1e-4;
  const Fp8Tensor r = runtime::quantize_fp8(y, at::kFloat8_e4m3fn, Fp8Scaling::kRowwise, 1);
  ASSERT_EQ(r.scale.sizes(), (at::IntArrayRef{48, 1}));
  EXPECT_TRUE(at::all(r.data.to(at::kFloat).abs().amax(1) == 448.0f).item<bool>());
  expect_quantized(y, r, std::ldexp(1.0, -4), std::ldexp(1.0, -10));
  // The tensor-wise scale flushes that row to the subnormals: most of its bits are gone.
  const Fp8Tensor flat = runtime::quantize_fp8(y, at::kFloat8_e4m3fn, Fp8Scaling::kTensorwise, 1);
  const double row_err = (dequantized(flat)[3] - y[3].to(at::kDouble)).abs().max().item<double>();
  EXPECT_GT(row_err, 0.01 * y[3].abs().max().item<double>());
  // Per column (a weight gradient's operands), and e5m2's range.
  const Fp8Tensor c = runtime::quantize_fp8(x, at::kFloat8_e5m2, Fp8Scaling::kRowwise, 0);
  ASSERT_EQ(c.scale.sizes(), (at::IntArrayRef{1, 32}));
  EXPECT_TRUE(at::all(c.data.to(at::kFloat).abs().amax(0) == 57344.0f).item<bool>());
  expect_quantized(x, c, std::ldexp(1.0, -3), std::ldexp(1.0, -17));
}

// The one-pass cast stores what a float32 product and a cast would: x · (top / amax) rounded
// once into the format.
TEST(Fp8, QuantizedValuesAreTheScaledInputRoundedOnce) {
  at::manual_seed(5);
  const at::Tensor x = (at::randn({64, 48}) * 7).to(at::kBFloat16);
  for (const auto scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kRowwise}) {
    const Fp8Tensor q = runtime::quantize_fp8(x, at::kFloat8_e4m3fn, scaling, 1);
    const at::Tensor want = (x.to(at::kFloat) * q.scale.reciprocal()).to(at::kFloat8_e4m3fn);
    EXPECT_TRUE(at::equal(q.data.to(at::kFloat), want.to(at::kFloat)));
  }
}

TEST(Fp8, AnAllZeroRowQuantizesToZerosWithAFiniteScale) {
  at::Tensor x = at::randn({16, 16});
  x[5].zero_();
  const Fp8Tensor r = runtime::quantize_fp8(x, at::kFloat8_e4m3fn, Fp8Scaling::kRowwise, 1);
  EXPECT_TRUE(at::all(at::isfinite(r.scale)).item<bool>());
  EXPECT_EQ(r.data[5].to(at::kFloat).abs().max().item<float>(), 0.0f);
  const Fp8Tensor z =
      runtime::quantize_fp8(at::zeros({16, 16}), at::kFloat8_e4m3fn, Fp8Scaling::kTensorwise, 1);
  EXPECT_TRUE(std::isfinite(z.scale.item<float>()) && z.scale.item<float>() > 0.0f);
  EXPECT_EQ(z.data.to(at::kFloat).abs().max().item<float>(), 0.0f);
}

// Quantized per column into the transposed layout in one pass: the same values and scales as
// quantizing per column and transposing after, for both scalings and both formats.
TEST(Fp8, TransposedQuantizationEqualsQuantizeThenTranspose) {
  at::manual_seed(9);
  const at::Tensor x = (at::randn({96, 48}) * 5).to(at::kBFloat16);
  for (const auto dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2})
    for (const auto scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kRowwise}) {
      const Fp8Tensor t = runtime::quantize_fp8_transposed(x, dtype, scaling);
      const Fp8Tensor c = runtime::quantize_fp8(x, dtype, scaling, 0);
      ASSERT_EQ(t.data.sizes(), (at::IntArrayRef{48, 96}));
      EXPECT_TRUE(t.data.is_contiguous());
      EXPECT_TRUE(at::equal(t.data.to(at::kFloat), c.data.t().to(at::kFloat)));
      EXPECT_TRUE(at::equal(t.scale, c.scale.reshape({-1, 1})));
    }
}

// A scaled product is the float32 product of the dequantized operands, rounded once to its
// dtype: within bf16's half ulp (2^-8 of each result: 8 significant bits) plus float32 accumulation
// (k·2^-24 of Σ|a||b|). Quantization itself moves the product by about 2^-4 relative, 30x more, so
// a product that skipped it or misapplied a scale fails by orders of magnitude.
void expect_scaled_product(at::ScalarType a_dtype, Fp8Scaling scaling) {
  at::manual_seed(2);
  const int64_t m = 32, k = 64, n = 48;
  const at::Tensor a = at::randn({m, k}) * at::rand({m, 1}) * 4;
  const at::Tensor b = at::randn({n, k}) * at::rand({n, 1});
  const Fp8Tensor qa = runtime::quantize_fp8(a, a_dtype, scaling, 1);
  const Fp8Tensor qb = runtime::quantize_fp8(b, at::kFloat8_e4m3fn, scaling, 1);
  const at::Tensor y = runtime::scaled_product(qa, qb, at::kBFloat16, false).to(at::kDouble);
  const at::Tensor da = dequantized(qa), db = dequantized(qb);
  const at::Tensor want = da.mm(db.t());
  const at::Tensor bound = want.abs() * std::ldexp(1.0, -8) +
                           da.abs().mm(db.abs().t()) * (k * std::ldexp(1.0, -24)) + 1e-30;
  EXPECT_TRUE(at::all((y - want).abs() <= bound).item<bool>())
      << "largest excess " << ((y - want).abs() - bound).max().item<double>();
  const double moved =
      ((want - a.to(at::kDouble).mm(b.to(at::kDouble).t())).abs() / bound).max().item<double>();
  EXPECT_GT(moved, 10) << "the product is as exact as bf16's: quantization did not happen";
}

TEST(Fp8, ScaledProductEqualsTheFloat32ProductOfTheQuantizedOperands) {
  expect_scaled_product(at::kFloat8_e4m3fn, Fp8Scaling::kTensorwise);
  expect_scaled_product(at::kFloat8_e4m3fn, Fp8Scaling::kRowwise);
  expect_scaled_product(at::kFloat8_e5m2, Fp8Scaling::kTensorwise);
  expect_scaled_product(at::kFloat8_e5m2, Fp8Scaling::kRowwise);
}

// runtime::linear under fp8: the forward, input and weight gradients are each a float8 product
// of operands quantized along their own reduction (x and W by rows forward; g by rows and W by
// columns for g·W; g and x by columns for gᵀ·x), e5m2 for g. Compared with bf16's products
// they differ by the quantization (a few %), far less than a gradient of the wrong operands.
TEST(Fp8, ALinearsThreeProductsRunInFloat8) {
  for (const auto math : {runtime::LinearMath::kFp8Tensorwise, runtime::LinearMath::kFp8Rowwise}) {
    at::manual_seed(3);
    const at::Tensor x = at::randn({2, 16, 32}).to(at::kBFloat16).requires_grad_();
    const at::Tensor w = (at::randn({48, 32}) * 0.2).to(at::kBFloat16).requires_grad_();
    const at::Tensor bias = at::randn({48}).to(at::kBFloat16).requires_grad_();
    const at::Tensor g = at::randn({2, 16, 48}).to(at::kBFloat16);
    at::Tensor y = runtime::linear(x, w, bias, math);
    y.backward(g);
    const at::Tensor y_ref = at::linear(x.detach().to(at::kFloat), w.detach().to(at::kFloat),
                                        bias.detach().to(at::kFloat));
    const at::Tensor gx_ref = g.to(at::kFloat).matmul(w.detach().to(at::kFloat));
    const at::Tensor gw_ref =
        g.to(at::kFloat).reshape({-1, 48}).t().mm(x.detach().to(at::kFloat).reshape({-1, 32}));
    auto rel = [](const at::Tensor& got, const at::Tensor& want) {
      return ((got.to(at::kFloat) - want).norm() / want.norm()).item<double>();
    };
    // e4m3 x e4m3 forward: about 2 x 2^-5 relative per operand, summed in quadrature; e5m2
    // gradients double it. Measured 2-4 %; 10 % bounds them, a wrong operand gives ~140 %.
    EXPECT_LT(rel(y, y_ref), 0.1);
    EXPECT_LT(rel(x.grad(), gx_ref), 0.1);
    EXPECT_LT(rel(w.grad(), gw_ref), 0.1);
    // And quantization happened (bf16 alone stays under 1 %).
    EXPECT_GT(rel(w.grad(), gw_ref), 0.005);
    // The forward is exactly the scaled product of its quantized operands.
    const auto scaling =
        math == runtime::LinearMath::kFp8Rowwise ? Fp8Scaling::kRowwise : Fp8Scaling::kTensorwise;
    const Fp8Tensor qx =
        runtime::quantize_fp8(x.detach().reshape({-1, 32}), at::kFloat8_e4m3fn, scaling, 1);
    const Fp8Tensor qw = runtime::quantize_fp8(w.detach(), at::kFloat8_e4m3fn, scaling, 1);
    const at::Tensor want = runtime::scaled_product(qx, qw, at::kBFloat16, true) + bias.detach();
    EXPECT_TRUE(at::equal(y.detach().reshape({-1, 48}), want));
  }
}

Config gpt_config(const std::vector<std::string>& overrides) {
  auto c = parse_config(R"(run: {seed: 3}
model: {type: gpt, preset: tiny}
batch: {global: 8, micro: 2}
optimizer: {type: adamw, lr: 0.003}
)",
                        "fp8.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(Fp8, RefusedOnADeviceWithoutFloat8UnitsNamingIt) {
  unsetenv("LOOM_DEBUG_FP8_ON_CPU");
  auto d = launch::select_device(gpt_config({"run.precision=fp8"}), 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("run.precision"), std::string::npos) << d.error().message;
  EXPECT_NE(d.error().message.find("CPU"), std::string::npos) << d.error().message;
  auto t = launch::create_trainer(gpt_config({"run.precision=fp8"}));
  EXPECT_FALSE(t.ok());
  setenv("LOOM_DEBUG_FP8_ON_CPU", "1", 1);
  auto e = launch::select_device(gpt_config({"run.precision=fp8", "fp8.scaling=rowwise"}), 0);
  unsetenv("LOOM_DEBUG_FP8_ON_CPU");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->linear, runtime::LinearMath::kFp8Rowwise);
  EXPECT_EQ(e->compute, at::kBFloat16);
  auto bad = parse_config("fp8: {scaling: blockwise}\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("fp8.scaling"), std::string::npos) << bad.error().message;
}

// GPT tiny through the executor's fp8 path (every linear, the LM head included: all its sizes
// are multiples of 16) with the products emulated. Its losses follow bf16's: each product moves
// by a few % of quantization noise, which averages out over a loss's tokens (measured 0.44 %
// tensorwise and 0.17 % rowwise over 20 steps; bound 2 %, while training moves the loss more than
// 10 % from where it starts).
TEST(Fp8, GptTinyThroughTheFp8PathFollowsBf16) {
  at::set_num_threads(1);
  setenv("LOOM_DEBUG_FP8_ON_CPU", "1", 1);
  const int steps = 20;
  for (const char* scaling : {"tensorwise", "rowwise"}) {
    const std::vector<double> bf16 =
        testing_support::train_losses(gpt_config({"run.precision=bf16"}), steps);
    const std::vector<double> fp8 = testing_support::train_losses(
        gpt_config({"run.precision=fp8", std::string("fp8.scaling=") + scaling}), steps);
    ASSERT_EQ(bf16.size(), static_cast<size_t>(steps));
    ASSERT_EQ(fp8.size(), static_cast<size_t>(steps));
    EXPECT_LT(bf16.back(), 0.9 * bf16.front()) << "bf16 barely trains";
    double differs = 0;
    for (int i = 0; i < steps; ++i) {
      differs = std::max(differs, std::abs(fp8[i] - bf16[i]) / bf16[i]);
      EXPECT_LE(std::abs(fp8[i] - bf16[i]) / bf16[i], 0.02)
          << scaling << " step " << i + 1 << ": fp8 " << fp8[i] << " vs bf16 " << bf16[i];
    }
    EXPECT_GT(differs, 1e-4) << scaling << ": the fp8 losses equal bf16's: fp8 did not run";
    std::printf("fp8 %s: largest relative loss difference from bf16 over %d steps: %.4f %%\n",
                scaling, steps, 100 * differs);
  }
  unsetenv("LOOM_DEBUG_FP8_ON_CPU");
}

}  // namespace
}  // namespace loom
