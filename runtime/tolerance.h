// The numerical policy of loom's tests (tests/README.md) and of `loom verify`: what "a parallel
// run equals the single-device run" can promise on any x86-64 CPU, whatever ATen's vector kernels
// (ATEN_CPU_CAPABILITY), OpenBLAS's kernels and the thread counts are.
//
// A plan sums the same terms in another order (a split reduction, an all-reduce, a gradient
// accumulated from pieces), so its float results differ from one device's in the last bits. What
// those differences become after T optimizer steps is bounded here per parameter tensor, from the
// optimizer's own arithmetic; every bound is a sum of named terms so a failure says which one was
// exceeded and by how much.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/run_spec.h"

namespace loom::runtime {

// float's machine epsilon (2^-23): one rounding moves a value by at most half of it, relatively.
constexpr double kFp32Eps = 1.1920929e-7;

// A loss is a mean over thousands of token losses; summed in another order its relative change is
// a few eps (1e-7 .. 1e-6 measured on default, avx2 and avx512 kernels). 1e-5 leaves a decade for
// the drift of the parameters it is computed from, and is still 100x below what a real bug moves
// (a dropped all-reduce or a mis-sliced shard changes step 2's loss by 1e-3 or more).
constexpr double kLossRelTolerance = 1e-5;

// run.precision=bf16 keeps 8 significant bits: one rounding moves a value by up to 2^-9
// relatively. A plan rounds at other points than one device (a row-parallel layer's partial sums
// are each rounded to bf16 before the all-reduce adds them; one device rounds the whole sum
// once), so its activations differ from one device's by about one bf16 rounding, and what
// follows from them (the loss, the gradients) by a few. The bf16 terms below replace the fp32
// ones with the same derivations, at bf16's rounding (measured figures next to each).
constexpr double kBf16Eps = 3.90625e-3;
// The loss averages thousands of token losses whose roundings mostly cancel: measured at most
// 1.5e-5 relative (GPT tiny tp2 x pp2, 6 steps); 2e-4 leaves 13x, and a dropped all-reduce moves
// step 2's loss by more than 1e-2.
constexpr double kBf16LossRelTolerance = 2e-4;

// What the single-device run knows about its own updates, to bound how far rounding can carry
// a parameter.
struct OptimizerTrace {
  OptimizerKind type = OptimizerKind::kAdamw;
  Precision precision = Precision::kFp32;
  double momentum = 0;     // sgd
  std::vector<double> lr;  // per step, as applied
  // Per parameter tensor (FullTensor name), per step: max |g| over its elements, as applied
  // (after clipping).
  std::map<std::string, std::vector<double>> grad_max;
};

// The bound on max|got - want| for one parameter tensor after the traced steps:
//   moved * max|want - init|  +  stored * max|want|  +  floor
struct ParameterTolerance {
  // Relative error of the distance a parameter travelled. SGD is linear in the gradient, so a
  // gradient summed in another order (relative change ~1e-6: a few eps times log2 of the terms)
  // moves the update by the same relative amount; 1e-5 leaves a decade. A gradient scaled by
  // 1.001 (a shard counted wrong) exceeds it by 100x, a dropped all-reduce by 10^4 (the floor
  // below, for cancelling sums, takes some of that margin back).
  double moved = 1e-5;
  // Rounding of the stored float: each step's p - lr*v rounds to the nearest float of p, and two
  // runs whose updates differ in the last bit may round apart: one eps of |p| per step.
  double stored = 0;
  // Absolute floor for elements whose gradient is a sum that cancels to near zero (a norm's shift,
  // a bias feeding a softmax): their rounding is relative to the terms summed, not to the result.
  double floor = 0;
  std::string why;  // the floor's derivation, printed with a failure

  double bound(double max_moved, double max_abs) const {
    return moved * max_moved + stored * max_abs + floor;
  }
};

// Rounding of a gradient element relative to the largest element of the same tensor's gradient.
// An element sums a few thousand products (batch x positions); summed in another order it moves
// by a few eps of the terms, and where the terms cancel (a norm's shift, a bias feeding a softmax)
// that is more than eps of the element itself but stays small against the tensor's largest
// element, which is of the size of the terms. Measured: at most 3.7e-6 for GPT, Swin and the
// Evoformer under every plan of the tests, with ATen's default, avx2 and avx512 kernels; 2e-5
// leaves 5x. A gradient shard scaled by 1.001 (a piece counted wrong) measures 2.5e-4 of it and
// fails the whole bound by 10x; a dropped all-reduce (GPT tp2, a norm's weight) by 1600x.
constexpr double kGradRoundingOfMax = 2e-5;

// AdamW's update is m / (sqrt(v) + eps), about lr * sign(g) whatever |g| is, and invariant to the
// gradient's scale: rounding that moves every gradient alike changes nothing, and an element's
// update moves by its own gradient's relative rounding. That is eps (~1e-7) of the terms the
// element sums, so 1e-3 of the element where they cancel down to 1e-4 of their size: the floor
// lets every element's update differ by 3e-3 of a full step (lr) at every step. (Measured: at
// most 1.4e-4 of sum(lr) with LibTorch 1.13's kernels; with the fused AdamW of LibTorch 2.11 and
// MKL held to AVX2, 1.1e-3 on one element of GPT tiny's tied embedding under dp2 x tp2 ZeRO 3,
// whose gradient sums the lookup's and the LM head's and cancels: 3e-3 leaves 2.7x. A dropped
// update, a step of lr, is still 300x over.) An element whose gradient cancels further, down to
// rounding noise, could take a whole step the other way (2 lr): the tensors where that happens
// by construction are named and skipped by the tests.
constexpr double kAdamStepRounding = 3e-3;

// A bf16 gradient element against the tensor's largest gradient: the products it sums come from
// activations rounded to bf16 at different points, a few bf16 roundings of the terms. Measured:
// the largest parameter difference of GPT tiny tp2 x pp2 is 1.8e-3 of the largest gradient
// carried (all of it counted here); 1e-2 leaves 5x. A dropped all-reduce moves a parameter by
// about half its travel: 10x over the whole bound.
constexpr double kBf16GradRoundingOfMax = 1e-2;

inline double loss_tolerance(const OptimizerTrace& t) {
  return t.precision == Precision::kBf16 ? kBf16LossRelTolerance : kLossRelTolerance;
}

// The bound for the parameter tensor named `name` (a FullTensor name of the trace).
inline ParameterTolerance parameter_tolerance(const OptimizerTrace& t, const std::string& name) {
  ParameterTolerance tol;
  const size_t steps = t.lr.size();
  const bool bf16 = t.precision == Precision::kBf16;
  // The masters are float32 in both precisions: storing rounds at float32's eps.
  tol.stored = static_cast<double>(steps) * kFp32Eps;
  // Travel moves with the gradients' relative rounding: a few bf16 roundings (measured 0.6 %).
  if (bf16) tol.moved = 5 * kBf16Eps;
  if (t.type == OptimizerKind::kAdamw) {
    tol.moved = 1e-4;  // sqrt(v)'s normalisation drifts with the parameters it came from
    double lr_sum = 0;
    for (double lr : t.lr) lr_sum += lr;
    tol.floor = kAdamStepRounding * lr_sum;
    tol.why = "AdamW: " + std::to_string(kAdamStepRounding) + " of a step of lr, every step (" +
              std::to_string(lr_sum) + ")";
    return tol;
  }
  // SGD with momentum mu: the velocity after step t is sum_{s<=t} mu^(t-s) g_s, so an error e_s
  // in step s's gradient moves the parameter by lr * sum_{t>=s} mu^(t-s) e_s at the end. With
  // e_s = kGradRoundingOfMax * max|g_s| of this tensor:
  const auto it = t.grad_max.find(name);
  const std::vector<double> no_gradient(steps, 0.0);
  const std::vector<double>& grad_max = it == t.grad_max.end() ? no_gradient : it->second;
  double distance = 0;
  for (size_t s = 0; s < steps && s < grad_max.size(); ++s) {
    double carried = 0, weight = 1;
    for (size_t u = s; u < steps; ++u, weight *= t.momentum) carried += t.lr[u] * weight;
    distance += carried * grad_max[s];
  }
  const double rounding = bf16 ? kBf16GradRoundingOfMax : kGradRoundingOfMax;
  tol.floor = rounding * distance;
  tol.why = "SGD: " + std::to_string(rounding) + " of the tensor's largest gradient " +
            "carried over " + std::to_string(steps) + " steps by lr and momentum (" +
            std::to_string(distance) + ")";
  return tol;
}

// How far `got` is from `want` for one parameter piece (`init`: its value before the first step),
// against the bound `tol` gives it.
struct ParameterDifference {
  double err = 0;        // max |got - want|
  double bound = 0;      // tol.bound(max_moved, max_abs)
  double max_moved = 0;  // max |want - init|
  double max_abs = 0;    // max |want|
  bool ok() const { return err <= bound && std::isfinite(err); }
};

// `allowance` (optional, the piece's shape): a distance each element may differ by beyond the
// bound (adam_noise_allowance).
inline ParameterDifference parameter_difference(const at::Tensor& got, const at::Tensor& want,
                                                const at::Tensor& init,
                                                const ParameterTolerance& tol,
                                                const at::Tensor& allowance = {}) {
  const at::Tensor g = got.detach().to(at::kCPU).to(at::kDouble),
                   w = want.detach().to(at::kCPU).to(at::kDouble);
  ParameterDifference d;
  at::Tensor diff = (g - w).abs();
  if (allowance.defined()) diff = (diff - allowance.to(at::kDouble)).clamp_min(0);
  d.err = diff.max().item<double>();
  d.max_moved = (w - init.detach().to(at::kCPU).to(at::kDouble)).abs().max().item<double>();
  d.max_abs = w.abs().max().item<double>();
  d.bound = tol.bound(d.max_moved, d.max_abs);
  return d;
}

// AdamW normalises each element's update (m / sqrt(v)), so an element's gradient error counts
// relative to that element, not to its tensor's largest gradient: with `rounding` the gradient
// rounding of the run's precision (gradient_tolerance), an element with gradient g at step s may
// have an error of rounding * grad_max[s], a relative error e = rounding * grad_max[s] / |g|,
// which moves its update by up to 2 e lr (m and sqrt(v) each carry e), and by at most a whole
// step the other way (2 lr) where e >= 1, the gradient being rounding noise, where two
// summation orders may disagree even in sign. Per element of one piece: the sum over the steps,
// from the single-device gradients `grads[s]` (the piece's, as applied) and `grad_max[s]`, the
// tensor's largest gradient at step s. A lost or doubled gradient (error ~ |g|) still exceeds it
// wherever |g| is above the noise. (The tests skip whole tensors where noise happens by
// construction; `loom verify` runs few steps and allows it per element.)
inline at::Tensor adam_noise_allowance(const std::vector<at::Tensor>& grads,
                                       const std::vector<double>& grad_max,
                                       const std::vector<double>& lr, double rounding) {
  at::Tensor allowed;
  for (size_t s = 0; s < grads.size() && s < grad_max.size() && s < lr.size(); ++s) {
    const at::Tensor g = grads[s].detach().to(at::kCPU).to(at::kDouble).abs();
    const double noise = rounding * grad_max[s];
    const at::Tensor relative =
        noise > 0 ? (noise / g.clamp_min(noise * 1e-12)).clamp_max(1.0) : at::zeros_like(g);
    const at::Tensor step = relative * (2 * lr[s]);
    allowed = allowed.defined() ? allowed + step : step;
  }
  return allowed;
}

// The bound on a gradient element's difference, relative to the largest element of the same
// tensor's single-device gradient (kGradRoundingOfMax's derivation).
inline double gradient_tolerance(const OptimizerTrace& t) {
  return t.precision == Precision::kBf16 ? kBf16GradRoundingOfMax : kGradRoundingOfMax;
}

// run.precision=bf16, measured rather than assumed: the single-device run in bf16 against the
// same run in float32 shows how far bf16's roundings move each gradient tensor (`measured`: the
// largest difference over its elements, relative to its largest element). Where a gradient is a
// sum that cancels (a layer norm's shift summed over every token) that is more than
// kBf16GradRoundingOfMax: measured 1.6e-2 for GPT tiny's ln1.b under tp2, whose input gradient
// adds the two tensor-parallel ranks' bf16 partial sums. A plan rounds at more points than one
// device (each partial sum, then their sum: three roundings where one device has one), so its
// gradients differ from one device's bf16 ones by up to 1 + 3 times the measured rounding. A
// dropped all-reduce or a shard counted twice moves a gradient by a large part of its own size,
// still 10x over.
constexpr double kBf16PlanRoundings = 4;
inline double bf16_gradient_tolerance(double measured) {
  return std::max(kBf16GradRoundingOfMax, kBf16PlanRoundings * measured);
}

// run.precision=bf16 with a discrete op (graph::OpRules::discrete: a mixture of experts' top-k
// routing): where two experts' scores lie within a rounding of each other, the plan's roundings
// can send a token to the other expert, and the loss moves by that token's share of the change:
// a jump that no bound on rounding's continuous effect covers. The same happens between one
// device in bf16 and in float32, so the loss is judged against that measured move (`measured`:
// the largest over the steps so far of |bf16 - float32| / |float32| on one device, its own flips
// included), times the plan's extra roundings, never below the dense bound. Measured on
// moe-tiny (ep2 x tp2, top 2 of 4 experts, 3 steps): one device's bf16 loss moves by 1.0e-3,
// 1.7e-3 and 2.0e-3 from float32, so the bounds are 4.1e-3, 6.7e-3 and 7.8e-3; the plan's loss
// differs by under 1e-6 at steps 1-2 and by 2.9e-3 at step 3 (a flip). The loss is the coarse
// check here: an expert's weights taken from the wrong rank hardly move it at initialisation,
// but fail the oracle and the parameters (hundreds of times their bounds) from step 1.
inline double bf16_routed_loss_tolerance(double measured) {
  return std::max(kBf16LossRelTolerance, kBf16PlanRoundings * measured);
}

}  // namespace loom::runtime
