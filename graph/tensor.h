// Logical tensors (FullTensor) and the pieces of them that ops read and write (SubTensor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/shape.h"

namespace loom::graph {

using loom::to_string;

enum class TensorRole { kInput, kParameter, kBuffer, kActivation, kLoss };
std::string to_string(TensorRole role);

// How a parameter's values are drawn. Each FullTensor is drawn from its own seed (run seed and
// name), so every plan slices the same full values.
struct ParamInit {
  enum class Kind { kNone, kNormal, kZeros, kOnes };
  Kind kind = Kind::kNone;
  double std = 0.0;

  static ParamInit normal(double std) { return {Kind::kNormal, std}; }
  static ParamInit zeros() { return {Kind::kZeros, 0.0}; }
  static ParamInit ones() { return {Kind::kOnes, 0.0}; }
  std::string to_string() const;
  bool operator==(const ParamInit& o) const { return kind == o.kind && std == o.std; }
};

// A tensor of the single-device model.
struct FullTensor {
  TensorId id;
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  TensorRole role = TensorRole::kActivation;
  ParamInit init;
  // Integer inputs hold values in [0, value_bound) (class labels, token ids); 0 when unbounded
  // or not an integer input. Synthetic data draws from this range.
  int64_t value_bound = 0;

  int64_t bytes() const { return numel(shape) * size_bytes(dtype); }
};

// A half-open index range [start, end) along one dimension.
struct Range {
  int64_t start = 0;
  int64_t end = 0;
  int64_t size() const { return end - start; }
  bool operator==(const Range& o) const { return start == o.start && end == o.end; }
  bool operator!=(const Range& o) const { return !(*this == o); }
};

// A piece of a FullTensor: a range per dimension, and a value chunk: the piece holds chunk
// `value_chunk` of `value_chunks` partial sums whose total is the FullTensor's values.
struct SubTensor {
  TensorId tensor;
  std::vector<Range> ranges;
  int64_t value_chunk = 0;
  int64_t value_chunks = 1;

  static SubTensor full(const FullTensor& t);
  Shape shape() const;
  bool is_partial() const { return value_chunks > 1; }
  bool covers_whole(const Shape& full_shape) const;
  std::string ranges_string() const;  // "[0:2, 0:32]" and "/v1of2" when partial
  bool operator==(const SubTensor& o) const {
    return tensor == o.tensor && ranges == o.ranges && value_chunk == o.value_chunk &&
           value_chunks == o.value_chunks;
  }
  bool operator!=(const SubTensor& o) const { return !(*this == o); }
};

}  // namespace loom::graph
