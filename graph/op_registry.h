// The op registry: for each op type, its annotation and shape rule. No kernels here: the
// runtime maps op types to LibTorch functions, so the planner never needs LibTorch.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/shape.h"
#include "graph/annotation.h"
#include "graph/attrs.h"
#include "graph/op.h"
#include "graph/op_rules.h"

namespace loom::graph {

struct OpSchema {
  std::string type;
  // The annotation text; most ops have a fixed one, some depend on attributes.
  std::function<std::string(const Attrs&)> annotation;
  // Output shapes from input shapes. When unset, sizes follow from the annotation: every
  // label is bound by the inputs or by an integer attribute of the same name.
  std::function<Result<std::vector<Shape>>(const Annotation&, const std::vector<Shape>&,
                                           const Attrs&)>
      infer_shapes;
  // Output dtypes; when unset, every output takes the first floating-point input's dtype.
  std::function<std::vector<DType>(const std::vector<DType>&, const Attrs&)> infer_dtypes;
  // Under a low-precision run (graph/precision.h) its outputs stay float32: reductions whose
  // results a loss sums (log-sum-exp, a target's logit), where bf16's 8-bit mantissa would
  // move the loss by a few tenths of a percent.
  bool fp32_outputs = false;
  // Its kernel keeps tensors the size of its attention scores (queries x keys per head) for its
  // backward, quadratic in the sequence: parallel.recompute: selective recomputes it in its
  // backward instead (Megatron's selective activation recomputation).
  bool attention_core = false;
  // y = x W^T with W [out, in] its second input, as torch.nn.Linear stores it: the runtime runs
  // it through its linear path (float8 under run.precision fp8, the weight gradient deferred to
  // a zero-bubble W block, a following bias_add fused in), ZeRO 3 gathers its weight again for
  // the backward instead of keeping it, and calibration measures its shapes.
  bool weight_product = false;
  // Its FLOPs and how tensor, sequence and context parallelism split it (graph/op_rules.h).
  OpRules rules;

  // A schema with a constant annotation and the default rules.
  static OpSchema simple(std::string type, std::string annotation);
};

class OpRegistry {
 public:
  // The registry with loom's built-in ops (graph/builtin_ops.cc).
  static OpRegistry with_builtin_ops();

  // Fails if the type exists or the annotation does not parse.
  Status add(OpSchema schema);
  const OpSchema* find(const std::string& type) const;
  std::vector<std::string> types() const;

  // Parses the op's annotation and infers its output shapes and dtypes.
  Result<Annotation> annotation_of(const std::string& type, const Attrs& attrs) const;
  Result<std::vector<Shape>> infer_shapes(const std::string& type, const std::vector<Shape>& inputs,
                                          const Attrs& attrs) const;
  std::vector<DType> infer_dtypes(const std::string& type, const std::vector<DType>& inputs,
                                  const Attrs& attrs) const;

 private:
  std::map<std::string, OpSchema> schemas_;
};

// What an op made from `schema` carries of it: its traits and rules (graph::OpDef).
void carry_traits(const OpSchema& schema, OpDef& def);

// The size of every label of `annotation` given the input shapes (and integer attributes named
// like a label). Errors name the label and the sizes that disagree.
Result<std::map<std::string, int64_t>> bind_labels(const Annotation& annotation,
                                                   const std::vector<Shape>& inputs,
                                                   const Attrs& attrs);

// The default shape rule: binds label sizes from the inputs (and integer attributes named like
// a label) and builds the output shapes. Errors name the label and the sizes that disagree.
Result<std::vector<Shape>> shapes_from_annotation(const Annotation& annotation,
                                                  const std::vector<Shape>& inputs,
                                                  const Attrs& attrs);

}  // namespace loom::graph
