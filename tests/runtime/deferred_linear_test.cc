// The split backward's linear (runtime/deferred_linear.h): its backward gives the input and
// bias gradients of at::linear and leaves the weight's to the stash, whose weight gradient is
// at::linear's; I and W together run as many matrix products as one full backward.
#include "runtime/deferred_linear.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <string>

namespace loom::runtime {
namespace {

// Counts the matrix-product kernels run on this thread while alive (the autograd engine runs a
// CPU backward on the calling thread).
class MatmulCounter {
 public:
  MatmulCounter() {
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(
        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          const std::string name = fn.name();
          // runtime/linear.h's CPU float32 products run as oneDNN's linear or on the small-GEMM
          // kernel (recorded as loom::small_gemm).
          if (name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm" ||
              name == "mkldnn::_linear_pointwise" || name == "loom::small_gemm")
            ++count_;
          return nullptr;
        }));
  }
  ~MatmulCounter() { at::removeCallback(handle_); }
  int take() { return count_.exchange(0); }

 private:
  static inline std::atomic<int> count_{0};
  at::CallbackHandle handle_;
};

struct Leaves {
  at::Tensor x, w, b;
};
Leaves leaves() {
  at::manual_seed(1);
  return {at::randn({2, 3, 4}).requires_grad_(true), at::randn({5, 4}).requires_grad_(true),
          at::randn({5}).requires_grad_(true)};
}

TEST(DeferredLinear, BackwardLeavesTheWeightGradientToTheStash) {
  Leaves ref = leaves(), split = leaves();
  at::Tensor target = at::randn({2, 3, 5});
  auto loss = [&](const at::Tensor& y) { return ((y - target) * (y - target)).sum(); };
  MatmulCounter count;
  at::Tensor y_ref = at::linear(ref.x, ref.w, ref.b);
  EXPECT_EQ(count.take(), 1);
  loss(y_ref).backward();
  const int full = count.take();
  WeightGradStash stash;
  at::Tensor y = deferred_linear(split.x, split.w, split.b, stash, 7);
  EXPECT_EQ(count.take(), 1);
  loss(y).backward();
  const int input_grad = count.take();
  // After I: the input and bias gradients are at::linear's; the weight has none yet.
  EXPECT_FALSE(split.w.grad().defined());
  EXPECT_TRUE(at::allclose(split.x.grad(), ref.x.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(split.b.grad(), ref.b.grad(), 1e-6, 1e-6));
  EXPECT_EQ(stash.size(), 1);
  // W: the deferred product gives at::linear's weight gradient.
  auto grads = stash.take_weight_grads();
  const int weight_grad = count.take();
  EXPECT_EQ(stash.size(), 0);
  ASSERT_EQ(grads.size(), 1u);
  ASSERT_TRUE(grads.count(7));
  EXPECT_TRUE(at::allclose(grads.at(7), ref.w.grad(), 1e-5, 1e-6));
  // The full backward's products, split between I and W; none runs twice.
  EXPECT_EQ(input_grad, 1);
  EXPECT_EQ(weight_grad, 1);
  EXPECT_EQ(input_grad + weight_grad, full);
}

TEST(DeferredLinear, ReadsOfOneWeightAreSummedInFloat32) {
  Leaves l = leaves();
  WeightGradStash stash;
  at::Tensor w16 = l.w.to(at::kBFloat16);
  at::Tensor x16 = l.x.detach().to(at::kBFloat16).requires_grad_(true);
  at::Tensor y = deferred_linear(x16, w16, at::Tensor(), stash, 0) +
                 deferred_linear(x16 * 2, w16, at::Tensor(), stash, 0);
  y.sum().backward();
  EXPECT_FALSE(l.w.grad().defined());  // the compute copy's gradient never reaches the master
  EXPECT_EQ(stash.size(), 2);
  auto grads = stash.take_weight_grads();
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(grads.at(0).scalar_type(), at::kFloat);
  const at::Tensor want = (at::ones({6, 5}).t().mm(l.x.detach().reshape({6, 4}))) * 3;
  EXPECT_TRUE(at::allclose(grads.at(0), want, 0.05, 0.05));
}

}  // namespace
}  // namespace loom::runtime
