#include "runtime/fp8.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <optional>

#include "core/debug_env.h"

#if LOOM_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace loom::runtime {

namespace {

// The largest finite value of each float8 format.
double largest(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

// A scale as at::_scaled_mm takes it for the operand of rows x: one element (tensorwise) or
// [rows, 1]; for mat2 (the transposed operand) [1, rows].
at::Tensor as_mat2_scale(const at::Tensor& scale) { return scale.reshape({1, -1}); }

// The largest magnitude of x, whole ([1]) or along `dim` (kept), in float32: one reduction (the
// infinity norm reads x once and writes no |x|). Exact: it is one of x's values.
at::Tensor amax_of(const at::Tensor& x, std::optional<int64_t> dim) {
  if (!dim) return at::linalg_vector_norm(x, INFINITY).to(at::kFloat).reshape({1});
  return at::linalg_vector_norm(x, INFINITY, at::IntArrayRef{*dim}, /*keepdim=*/true)
      .to(at::kFloat);
}

// The factor that maps each slice's amax onto the format's largest finite value. An all-zero
// slice is taken as amax 1e-30: any finite factor quantizes zeros to zeros, and this one keeps
// the scale (its reciprocal) a normal float32.
at::Tensor factor_onto(const at::Tensor& x, at::ScalarType dtype, Fp8Scaling scaling,
                       int64_t reduce_dim) {
  const at::Tensor amax = amax_of(
      x, scaling == Fp8Scaling::kTensorwise ? std::nullopt : std::optional<int64_t>(reduce_dim));
  return at::clamp_min(amax, 1e-30).reciprocal().mul_(largest(dtype));
}

// out = x · to_fp8 in float8: x times a float32 tensor with dimensions is computed in float32
// and rounded once into the format as it is stored, one pass over x (a float32 product first and
// a cast after would write and read x's size in float32 again), into `out` as laid out (a
// transposed view: the cast and the transpose in the same pass). Where LibTorch's kernels cannot
// store float8 on x's device (found once per process and device type), the two passes. No clamp:
// |x · top / amax| passes top by float32 rounding at most, which the rounding brings back onto
// top (the format's next value is far above).
void scaled_cast_into(at::Tensor out, const at::Tensor& x, const at::Tensor& to_fp8) {
  static std::atomic<bool> direct[2] = {true, true};
  std::atomic<bool>& ok = direct[x.is_cuda() ? 1 : 0];
  if (ok.load()) {
    try {
      at::mul_out(out, x, to_fp8);
      return;
    } catch (const c10::Error&) {
      ok.store(false);
    }
  }
  out.copy_(at::mul(x, to_fp8));
}

}  // namespace

Fp8Tensor quantize_fp8(const at::Tensor& x, at::ScalarType dtype, Fp8Scaling scaling,
                       int64_t reduce_dim) {
  const at::Tensor to_fp8 = factor_onto(x, dtype, scaling, reduce_dim);
  Fp8Tensor out;
  out.data = at::empty(x.sizes(), x.options().dtype(dtype));
  scaled_cast_into(out.data, x, to_fp8);
  out.scale = to_fp8.reciprocal();
  return out;
}

Fp8Tensor quantize_fp8_transposed(const at::Tensor& x, at::ScalarType dtype, Fp8Scaling scaling) {
  const at::Tensor to_fp8 = factor_onto(x, dtype, scaling, 0);
  Fp8Tensor out;
  out.data = at::empty({x.size(1), x.size(0)}, x.options().dtype(dtype));
  scaled_cast_into(out.data.t(), x, to_fp8);
  out.scale = to_fp8.reciprocal().reshape({-1, 1});
  return out;
}

at::Tensor scaled_product(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out,
                          bool fast_accumulation) {
  // mat2 is bᵀ: [k, n] with unit stride down its columns, the layout the kernels take.
  const at::Tensor mat2 = b.data.t();
  if (a.data.is_cuda())
    return at::_scaled_mm(a.data, mat2, a.scale, as_mat2_scale(b.scale), std::nullopt, std::nullopt,
                          out, fast_accumulation);
  const at::Tensor one = at::ones({}, a.scale.options());
  at::Tensor y = at::_scaled_mm(a.data, mat2, one, one, std::nullopt, std::nullopt, at::kFloat);
  return (y * a.scale * as_mat2_scale(b.scale)).to(out);
}

bool fp8_fits(int64_t m, int64_t k, int64_t n) {
  return m > 0 && m % 16 == 0 && k % 16 == 0 && n % 16 == 0;
}

std::optional<std::string> fp8_refusal(const c10::Device& device) {
  if (device.is_cpu()) {
    if (debug_env_int("LOOM_DEBUG_FP8_ON_CPU", 0) == 1) return std::nullopt;
    return std::string(
        "the CPU has no float8 matrix units: fp8 needs a GPU of compute capability 8.9 or "
        "later (Ada, Hopper, Blackwell); use run.precision=bf16 here");
  }
#if LOOM_TORCH_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    if (p->major * 10 + p->minor >= 89) return std::nullopt;
    return "GPU " + std::to_string(device.index()) + " (" + p->name + ", compute capability " +
           std::to_string(p->major) + "." + std::to_string(p->minor) +
           ") has no float8 tensor cores: fp8 needs compute capability 8.9 or later (Ada, "
           "Hopper, Blackwell); use run.precision=bf16 there";
  }
#endif
  return "device " + device.str() + " has no float8 matrix units";
}

}  // namespace loom::runtime
