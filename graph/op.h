// An operator of the graph: a type from the op registry, its attributes, the SubTensors it
// reads and writes, its annotation, and after planning a device and a pipeline stage.
#pragma once

#include <string>
#include <vector>

#include "core/ids.h"
#include "graph/annotation.h"
#include "graph/attrs.h"
#include "graph/tensor.h"

namespace loom::graph {

// Layer tags used by pipeline staging: ops before the first block and after the last one.
constexpr int64_t kPreLayers = -1;
constexpr int64_t kPostLayers = 1 << 30;

struct Op {
  OpId id;
  std::string type;
  std::string name;
  Attrs attrs;
  std::vector<SubTensor> inputs;
  std::vector<SubTensor> outputs;
  Annotation annotation;
  int64_t layer = kPreLayers;  // model layer the op belongs to
  DeviceId device{0};
  StageId stage{0};
};

}  // namespace loom::graph
