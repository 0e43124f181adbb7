// What user code adds to a trainer: op types (annotation and shape rule), their kernels,
// parallel policies, and a model builder that replaces the model zoo. Starts from loom's
// built-in ops, kernels and policies.
#pragma once

#include "plan/plan.h"
#include "runtime/kernels.h"

namespace loom::launch {

// Builds the single-device graph of one micro-batch across all data-parallel replicas
// (batch.micro x parallel.dp samples). The trainer feeds inputs named "tokens" and "targets"
// ([samples, seq] int64) and reads the vocabulary from the first "embedding" op's table.
using ModelBuilder = plan::ModelBuilder;

// What plans are made with (ops, policies, model: plan::Registries) and the kernels that run them.
struct Extensions : plan::Registries {
  runtime::KernelRegistry kernels = runtime::KernelRegistry::with_builtin_kernels();
};

}  // namespace loom::launch
