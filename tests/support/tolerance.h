// The numerical policy of loom's tests lives in runtime/tolerance.h, where `loom verify`
// applies it too; the tests use it under their own namespace, plus a failure message per piece.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "runtime/tolerance.h"

namespace loom::testing_support {

using runtime::gradient_tolerance;
using runtime::kBf16Eps;
using runtime::kBf16GradRoundingOfMax;
using runtime::kBf16LossRelTolerance;
using runtime::kFp32Eps;
using runtime::kGradRoundingOfMax;
using runtime::kLossRelTolerance;
using runtime::loss_tolerance;
using runtime::OptimizerTrace;
using runtime::parameter_difference;
using runtime::parameter_tolerance;
using runtime::ParameterTolerance;

// nullopt when `got` is within `tol` of `want`; otherwise what differs and which term failed.
inline std::optional<std::string> compare_parameter(const at::Tensor& got, const at::Tensor& want,
                                                    const at::Tensor& init,
                                                    const ParameterTolerance& tol) {
  const runtime::ParameterDifference d = parameter_difference(got, want, init, tol);
  if (std::getenv("LOOM_TEST_TOLERANCE_REPORT") != nullptr)
    std::fprintf(stderr, "tolerance: err %.3e bound %.3e (moved %.3e abs %.3e floor %.3e) %.4f\n",
                 d.err, d.bound, d.max_moved, d.max_abs, tol.floor, d.err / d.bound);
  if (d.ok()) return std::nullopt;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "max |difference| %.3e > bound %.3e = %.0e x moved %.3e + %.1e x |p| %.3e + "
                "floor %.3e (%s)",
                d.err, d.bound, tol.moved, d.max_moved, tol.stored, d.max_abs, tol.floor,
                tol.why.c_str());
  return std::string(buf);
}

}  // namespace loom::testing_support
