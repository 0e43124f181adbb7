#include "runtime/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace loom::runtime {

uint64_t tensor_seed(uint64_t run_seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h ^ (run_seed * 0x9E3779B97F4A7C15ull);
}

at::Tensor init_full_parameter(const graph::FullTensor& t, uint64_t run_seed) {
  using Kind = graph::ParamInit::Kind;
  auto options = at::TensorOptions().dtype(at::kFloat);
  switch (t.init.kind) {
    case Kind::kZeros:
    case Kind::kNone:
      return at::zeros(t.shape, options);
    case Kind::kOnes:
      return at::ones(t.shape, options);
    case Kind::kNormal: {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(tensor_seed(run_seed, t.name));
      return at::normal(0.0, t.init.std, t.shape, gen, options);
    }
  }
  return at::Tensor();
}

at::Tensor init_parameter_piece(const graph::FullTensor& t, const graph::SubTensor& piece,
                                uint64_t run_seed) {
  at::Tensor full = init_full_parameter(t, run_seed);
  at::Tensor slice = full;
  for (size_t d = 0; d < piece.ranges.size(); ++d)
    slice = slice.slice(static_cast<int64_t>(d), piece.ranges[d].start, piece.ranges[d].end);
  slice = slice.contiguous().clone();
  if (piece.value_chunk != 0) slice.zero_();
  return slice;
}

}  // namespace loom::runtime
