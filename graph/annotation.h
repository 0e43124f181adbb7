// Operator annotations (einops-like, as in nnScaler): which dimensions of an op's tensors may
// be split, which are reduced, and which are fixed. Every split loom makes follows from these.
//
//   matmul      "m k+, k+ n -> m n"
//   layer norm  "b s h^, h^, h^ -> b s h^"
//   attention   "b s^ (h d^), b t^ (h d^), b t^ (h d^) -> b s^ (h d^)"
//
// Grammar (see graph/README.md):
//   annotation := tensors "->" tensors
//   tensors    := tensor ("," tensor)*          an empty tensor is a scalar
//   tensor     := dim*
//   dim        := label | "(" label label* ")"  a group: one dimension made of several labels
//   label      := NAME [ "+" | "^" ] | INTEGER
// NAME: may be split (inputs and outputs split together). NAME+: reduced (splitting it makes
// the outputs value-partial). NAME^: never split. INTEGER: a fixed size. In a group only the
// first label may be split, so a split stays one contiguous range.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace loom::graph {

enum class LabelKind { kSplit, kReduce, kFrozen, kFixed };

struct Label {
  std::string name;  // empty for kFixed
  LabelKind kind = LabelKind::kSplit;
  int64_t size = 0;  // kFixed only

  bool operator==(const Label& o) const {
    return name == o.name && kind == o.kind && size == o.size;
  }
  std::string to_string() const;
};

// One dimension of a tensor: a single label, or a group "(h d)" whose size is the product.
struct DimSpec {
  std::vector<Label> labels;
  bool operator==(const DimSpec& o) const { return labels == o.labels; }
  std::string to_string() const;
};

struct TensorSpec {
  std::vector<DimSpec> dims;  // empty: a scalar
  bool operator==(const TensorSpec& o) const { return dims == o.dims; }
  std::string to_string() const;
};

class Annotation {
 public:
  static Result<Annotation> parse(std::string_view text);

  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  // Distinct named labels in order of first appearance.
  const std::vector<std::string>& labels() const { return labels_; }
  LabelKind kind_of(const std::string& label) const;

  // Where a named label appears: (is_output, tensor index, dim index, position in group).
  struct Site {
    bool output;
    size_t tensor;
    size_t dim;
    size_t position;
  };
  std::vector<Site> sites(const std::string& label) const;

  std::string to_string() const;  // canonical text; parse(to_string()) == *this
  bool operator==(const Annotation& o) const {
    return inputs_ == o.inputs_ && outputs_ == o.outputs_;
  }

 private:
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
  std::vector<std::string> labels_;
};

}  // namespace loom::graph
