#include "graph/tensor.h"

#include <sstream>

#include "core/check.h"

namespace loom::graph {

std::string to_string(TensorRole role) {
  switch (role) {
    case TensorRole::kInput:
      return "input";
    case TensorRole::kParameter:
      return "param";
    case TensorRole::kBuffer:
      return "buffer";
    case TensorRole::kActivation:
      return "act";
    case TensorRole::kLoss:
      return "loss";
  }
  return "?";
}

std::string ParamInit::to_string() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kZeros:
      return "zeros";
    case Kind::kOnes:
      return "ones";
    case Kind::kNormal:
      os << "normal(" << std << ")";
      return os.str();
  }
  return "?";
}

SubTensor SubTensor::full(const FullTensor& t) {
  SubTensor s;
  s.tensor = t.id;
  for (int64_t d : t.shape) s.ranges.push_back({0, d});
  return s;
}

Shape SubTensor::shape() const {
  Shape s;
  for (const auto& r : ranges) s.push_back(r.size());
  return s;
}

bool SubTensor::covers_whole(const Shape& full_shape) const {
  if (ranges.size() != full_shape.size() || value_chunks != 1) return false;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (ranges[i].start != 0 || ranges[i].end != full_shape[i]) return false;
  return true;
}

std::string SubTensor::ranges_string() const {
  std::string s = "[";
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranges[i].start) + ":" + std::to_string(ranges[i].end);
  }
  s += "]";
  if (value_chunks > 1)
    s += "/v" + std::to_string(value_chunk) + "of" + std::to_string(value_chunks);
  return s;
}

}  // namespace loom::graph
