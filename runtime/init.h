// Parameter initialisation from a seed per FullTensor: every plan draws the same full values
// and slices its piece, so a parallel run starts from the single-device run's weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "graph/tensor.h"

namespace loom::runtime {

// The seed of one FullTensor: the run seed mixed with a hash of the tensor's name.
uint64_t tensor_seed(uint64_t run_seed, const std::string& name);
// The full values of a parameter (float32, CPU).
at::Tensor init_full_parameter(const graph::FullTensor& tensor, uint64_t run_seed);
// The piece `piece` of a parameter: the slice of its full values (value chunk 0 holds the
// values; other chunks of a value-split parameter hold zeros).
at::Tensor init_parameter_piece(const graph::FullTensor& tensor, const graph::SubTensor& piece,
                                uint64_t run_seed);

}  // namespace loom::runtime
