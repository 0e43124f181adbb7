// An operator of the graph: a type from the op registry, its attributes and annotation (the
// definition, shared by every sub-operator a split makes of it), the SubTensors it reads and
// writes, and after planning a device and a pipeline stage.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ids.h"
#include "graph/annotation.h"
#include "graph/attrs.h"
#include "graph/op_rules.h"
#include "graph/tensor.h"

namespace loom::graph {

// Layer tags used by pipeline staging: ops before the first block and after the last one.
constexpr int64_t kPreLayers = -1;
constexpr int64_t kPostLayers = 1 << 30;

// What the single-device op was; shared, so a plan of a million sub-ops stays small.
struct OpDef {
  std::string type;
  std::string name;
  Attrs attrs;
  Annotation annotation;
  int64_t layer = kPreLayers;  // model layer the op belongs to
  // Its kernel keeps tensors the size of its scores (queries x keys) for its backward:
  // parallel.recompute: selective recomputes exactly these ops (OpSchema::attention_core).
  bool attention_core = false;
  // A product with a weight, x W^T (OpSchema::weight_product).
  bool weight_product = false;
  // Its type's FLOPs and parallelism rules (OpSchema::rules); empty in a graph read back from a
  // plan file, which is run, not planned again.
  OpRules rules;
};

// Which piece of its op a sub-operator is: one (index, count) per split or replication, in the
// order they were made, e.g. [(1, 2), (0, 4)] = part 1 of a 2-way split, then part 0 of 4.
struct Part {
  int32_t index = 0;
  int32_t count = 1;
  bool operator==(const Part& o) const { return index == o.index && count == o.count; }
};

struct Op {
  OpId id;
  std::shared_ptr<const OpDef> def;
  std::vector<SubTensor> inputs;
  std::vector<SubTensor> outputs;
  std::vector<Part> parts;
  DeviceId device{0};
  StageId stage{0};

  const std::string& type() const { return def->type; }
  const Attrs& attrs() const { return def->attrs; }
  const Annotation& annotation() const { return def->annotation; }
  int64_t layer() const { return def->layer; }
  // The definition's name with the parts, e.g. "h0.attn.q[1/2][0/4]".
  std::string name() const;
};

}  // namespace loom::graph
