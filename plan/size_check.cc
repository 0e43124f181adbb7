#include "plan/size_check.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace loom::plan {
namespace {

std::string gigabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  return buf;
}

std::string count(double n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  return buf;
}

// Physical memory of this machine, 0 where the system does not say.
double machine_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

}  // namespace

Status check_model_fits(const Config& config, const PlanSpec& spec, const models::ModelType& type,
                        const CostModel& cost, int64_t world_size) {
  if (!type.size || cost.device_memory_bytes <= 0) return Status::success();
  LOOM_ASSIGN_OR_RETURN(const models::ModelSize size, type.size(config));
  // Float32 weights (bf16 keeps them as master weights), gradients at least in bf16, and AdamW's
  // two float32 moments: what every plan holds somewhere, however it shards them.
  const double grads = bf16_activations(spec.precision) ? 2 : 4;
  const double moments = spec.optimizer == OptimizerKind::kAdamw ? 8 : 0;
  const double bytes_per_parameter = 4 + grads + moments;
  const double needed = size.parameters * bytes_per_parameter;
  const double held = cost.device_memory_bytes * static_cast<double>(world_size);
  if (needed <= held) return Status::success();
  return config.error(size.key, "the model (" + size.shape + ") has " + count(size.parameters) +
                                    " parameters at least, whose weights, gradients and "
                                    "optimizer state alone (" +
                                    gigabytes(needed) + ") exceed the memory of its " +
                                    std::to_string(world_size) + " rank(s) (" +
                                    gigabytes(cost.device_memory_bytes) + " each, cost model " +
                                    cost.name + "); make it smaller or give it more ranks");
}

Status check_plan_fits(const graph::Graph& model, const PlanSpec& spec, int64_t world_size) {
  const double machine = machine_bytes();
  if (machine <= 0) return Status::success();
  // Every op is on every rank of its stage, split or replicated; pipeline stages divide them.
  const double ops = static_cast<double>(model.ops().size()) * static_cast<double>(world_size) /
                     static_cast<double>(spec.space.mesh.pp());
  const double needed = ops * kPlannedOpBytes;
  if (needed <= machine) return Status::success();
  return Error::at("world_size",
                   "a plan of " + std::to_string(world_size) + " ranks holds about " + count(ops) +
                       " sub-operators (" + std::to_string(model.ops().size()) +
                       " per replica of the model), about " + gigabytes(needed) +
                       " while loom plans it, more than this machine's " + gigabytes(machine) +
                       "; plan it on a larger machine, or with fewer ranks (parallel.dp)");
}

}  // namespace loom::plan
