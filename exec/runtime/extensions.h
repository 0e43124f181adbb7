// What user code adds to a trainer: op types (annotation and shape rule), their kernels,
// parallel policies, and a model builder that replaces the model zoo. Starts from loom's
// built-in ops, kernels and policies.
#pragma once

#include <functional>

#include "core/config.h"
#include "core/result.h"
#include "exec/runtime/kernels.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/policy.h"

namespace loom::runtime {

// Builds the single-device graph of one micro-batch across all data-parallel replicas
// (batch.micro x parallel.dp samples). The trainer feeds inputs named "tokens" and "targets"
// ([samples, seq] int64) and reads the vocabulary from the first "embedding" op's table.
using ModelBuilder = std::function<Result<graph::Graph>(const Config&, const graph::OpRegistry&)>;

struct Extensions {
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  KernelRegistry kernels = KernelRegistry::with_builtin_kernels();
  planner::PolicyRegistry policies = planner::PolicyRegistry::with_builtin_policies();
  ModelBuilder model;  // empty: the model zoo (model.type)
};

}  // namespace loom::runtime
