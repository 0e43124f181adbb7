// A linear layer's products (runtime/linear.h) against at::linear: the same output and
// gradients, whichever kernel runs them; where LibTorch has oneDNN, the CPU float32 products run
// on it.
#include "runtime/linear.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>

namespace loom::runtime {
namespace {

// The largest difference relative to the reference's largest element. Two kernels sum the k
// products of a dot product in different orders: each partial sum may round differently, so
// they differ by at most about k·2⁻²⁴ of the sum of magnitudes. With k ≤ 512 standard-normal
// terms that is below 3e-5 of the output's largest element (measured: under 1e-6); a wrong
// operand, transpose or a missing bias is off by the size of the elements themselves (order 1).
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}
constexpr double kTolerance = 3e-5;

struct Case {
  std::vector<int64_t> x_shape;
  int64_t out = 0;
  bool bias = true;
  bool transposed_x = false;  // x a non-contiguous view
};

void check_against_at_linear(const Case& c, at::ScalarType dtype) {
  at::manual_seed(3);
  at::Tensor x0 = at::randn(c.x_shape);
  if (c.transposed_x) x0 = x0.transpose(0, 1).contiguous().transpose(0, 1);
  const int64_t in = c.x_shape.back();
  const at::Tensor w0 = at::randn({c.out, in}), b0 = at::randn({c.out});
  std::vector<int64_t> y_shape = c.x_shape;
  y_shape.back() = c.out;
  const at::Tensor dy = at::randn(y_shape);
  auto leaf = [&](const at::Tensor& t) { return t.to(dtype).detach().requires_grad_(true); };
  at::Tensor xr = leaf(x0), wr = leaf(w0), br = leaf(b0);
  at::Tensor xl = leaf(x0), wl = leaf(w0), bl = leaf(b0);
  at::Tensor yr = at::linear(xr, wr, c.bias ? br : at::Tensor());
  at::Tensor yl = linear(xl, wl, c.bias ? bl : at::Tensor());
  ASSERT_EQ(yl.sizes(), yr.sizes());
  (yr * dy.to(dtype)).sum().backward();
  (yl * dy.to(dtype)).sum().backward();
  const double tol = dtype == at::kFloat ? kTolerance : 0.0;  // bf16 runs at::linear itself
  EXPECT_LE(relative_error(yl.to(at::kFloat), yr.to(at::kFloat)), tol);
  EXPECT_LE(relative_error(xl.grad().to(at::kFloat), xr.grad().to(at::kFloat)), tol);
  EXPECT_LE(relative_error(wl.grad().to(at::kFloat), wr.grad().to(at::kFloat)), tol);
  if (c.bias) {
    EXPECT_LE(relative_error(bl.grad().to(at::kFloat), br.grad().to(at::kFloat)), tol);
  }
}

TEST(Linear, EqualsAtLinearWithItsGradients) {
  // Products of 2^24 multiply-adds and more run on oneDNN, the last one on the small-GEMM kernel.
  for (const Case& c :
       {Case{{256, 256}, 256}, Case{{2, 128, 256}, 384, false}, Case{{512, 384}, 96},
        Case{{128, 2, 256}, 320, true, true}, Case{{24, 2, 64}, 80}}) {
    SCOPED_TRACE(c.x_shape.size());
    check_against_at_linear(c, at::kFloat);
    check_against_at_linear(c, at::kBFloat16);
  }
}

TEST(Linear, ProductsAloneEqualAtLinearOnes) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 128, 256}), w = at::randn({160, 256}), b = at::randn({160});
  const at::Tensor g = at::randn({4, 128, 160});
  EXPECT_LE(relative_error(linear_product(x, w, b), at::linear(x, w, b)), kTolerance);
  EXPECT_LE(relative_error(linear_input_grad(g, w), at::matmul(g, w)), kTolerance);
  EXPECT_LE(
      relative_error(linear_weight_grad(g, x), g.reshape({512, 160}).t().mm(x.reshape({512, 256}))),
      kTolerance);
}

// The oneDNN operator calls and the small-GEMM products (recorded as loom::small_gemm) made on
// this thread while alive.
class ProductCalls {
 public:
  ProductCalls() {
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(
        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          const std::string name = fn.name();
          if (name == "mkldnn::_linear_pointwise") ++onednn_;
          if (name == "loom::small_gemm") ++small_;
          return nullptr;
        }));
  }
  ~ProductCalls() { at::removeCallback(handle_); }
  int onednn() { return onednn_.exchange(0); }
  int small() { return small_.exchange(0); }

 private:
  static inline std::atomic<int> onednn_{0}, small_{0};
  at::CallbackHandle handle_;
};

// Where LibTorch has oneDNN, a product of 2^24 multiply-adds runs on it, forward and input
// gradient (and the weight gradient of a non-square weight), and a smaller one does not. A LibTorch
// whose operator loom could not find (renamed, or its signature changed) would silently run the
// slower kernel: this fails instead.
TEST(Linear, LargeFloat32ProductsRunOnOnednn) {
  if (!at::hasMKLDNN()) GTEST_SKIP() << "this LibTorch is built without oneDNN";
  ASSERT_TRUE(linear_uses_onednn());
  ProductCalls calls;
  at::Tensor x = at::randn({256, 256}).requires_grad_(true), w = at::randn({256, 256});
  linear(x, w, at::Tensor()).sum().backward();
  EXPECT_EQ(calls.onednn(), 2);
  at::Tensor small = at::randn({255, 256}).requires_grad_(true);
  linear(small, w, at::Tensor()).sum().backward();
  EXPECT_EQ(calls.onednn(), 0);
  linear(x.to(at::kBFloat16), w.to(at::kBFloat16), at::Tensor());
  EXPECT_EQ(calls.onednn(), 0);
  // The weight gradient runs on oneDNN where inputs and outputs differ in number (as gᵀ·x with
  // more inputs, as (xᵀ·g)ᵀ with more outputs), on the small-GEMM kernel for a square weight.
  at::Tensor rows = at::randn({512, 256}).requires_grad_(true);  // 2^24 multiply-adds at 128
  for (const int64_t out : {128, 512, 256}) {
    at::Tensor wide = at::randn({out, 256}).requires_grad_(true);
    calls.small();
    // A dense upstream gradient (sum()'s is an expanded view, which the small-GEMM kernel does
    // not read).
    (linear(rows, wide, at::Tensor()) * at::randn({512, out})).sum().backward();
    EXPECT_EQ(calls.onednn(), out == 256 ? 2 : 3) << out << " outputs";
    EXPECT_EQ(calls.small(), out == 256 ? 1 : 0) << out << " outputs";
  }
}

// A float32 product under oneDNN's threshold runs on the small-GEMM kernel, forward, input and
// weight gradient; one wider than 1024 on at::linear's.
TEST(Linear, SmallFloat32ProductsRunOnTheSmallGemmKernel) {
  ProductCalls calls;
  at::Tensor x = at::randn({64, 96}).requires_grad_(true);
  at::Tensor w = at::randn({80, 96}).requires_grad_(true), b = at::randn({80});
  (linear(x, w, b) * at::randn({64, 80})).sum().backward();
  EXPECT_EQ(calls.small(), 3);
  EXPECT_EQ(calls.onednn(), 0);
  at::Tensor deep = at::randn({4, 2048}).requires_grad_(true);
  (linear(deep, at::randn({8, 2048}), at::Tensor()) * at::randn({4, 8})).sum().backward();
  EXPECT_EQ(calls.small(), 0);
}

}  // namespace
}  // namespace loom::runtime
