// The config read once, as values: the split in space (the device mesh and what the policies
// read), the pipeline schedule, the memory features, the batch, and what the run is made of
// (device, precision, communication backend, gradient buckets, optimizer). PlanSpec::of is the
// only reader of parallel.*, batch.*, run.device, run.precision, comm.backend, comm.bucket_mb
// and optimizer.type; everything below plan/ takes these values. Errors found below carry their
// key (Error::at) and the door adds where the key came from (locate).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/ids.h"
#include "core/result.h"
#include "core/run_spec.h"
#include "lower/recompute.h"
#include "lower/schedule_order.h"
#include "planner/space_spec.h"
#include "scheduler/schedule_spec.h"

namespace loom::plan {

struct PlanSpec {
  // The mesh, stages and splits the policy applies; two_pipelines where the schedule is
  // chimera's.
  planner::SpaceSpec space;
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  lower::Recompute recompute = lower::Recompute::kNone;
  int64_t zero = 0;  // 0, 1 (optimizer state sharded) or 3 (parameters too)
  BatchSpec batch;
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  CommBackend backend = CommBackend::kAuto;  // as asked; job_backend() resolves auto
  int64_t bucket_bytes = int64_t{25} << 20;  // a gradient bucket's most bytes (comm.bucket_mb)
  OptimizerKind optimizer = OptimizerKind::kAdamw;
  bool weight_decay = false;  // optimizer.weight_decay is not 0 (SGD's step then holds a temporary)
  double memory_limit_gb = 0;  // parallel.memory_limit_gb (policy auto); 0: the device's

  // The spec of `config`, checked: chimera's two pipelines need an even pipeline degree, one
  // stage per device in each direction and no context parallelism. Errors name the key and
  // where it came from.
  static Result<PlanSpec> of(const Config& config);

  const planner::DeviceMesh& mesh() const { return space.mesh; }
  bool pipelined() const { return space.mesh.pp() > 1 || space.chunks > 1; }
  // The pipeline device (pp coordinate) of `rank`.
  int64_t pipeline_device(Rank rank) const { return space.mesh.coord(rank).pp; }
  int64_t micro_batches() const { return batch.micro_batches(); }
  bool on_gpu() const { return device == Device::kCuda; }
  // The backend's traits for a job loomrun starts (comm.backend auto resolved per device).
  CommTraits comm_traits() const { return CommTraits::of(job_backend(backend, device)); }
  // What lower::pipeline_order reads.
  lower::PipelineRequest pipeline() const;

  // The values that shape a plan, as (config key, value) in a fixed order: what a plan's hash
  // covers and what a stale plan's message compares. The run's device, backend, buckets and
  // optimizer are left out: they change the estimate, not the plan file.
  std::vector<std::pair<std::string, std::string>> plan_fields() const;
};

// `config` with parallel.* and batch.* as `spec` says (PlanSpec::of's inverse; the rest of the
// config as it is): the config a plan made of `spec` records and runs with.
Config with_spec(const Config& config, const PlanSpec& spec);

}  // namespace loom::plan
