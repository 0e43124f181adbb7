#include "plan/plan_spec.h"

#include <sstream>

namespace loom::plan {
namespace {

// core/config.cc has already refused any other value.
planner::CpKind cp_kind_of(const std::string& name) {
  if (name == "p2p-contiguous") return planner::CpKind::kRingContiguous;
  if (name == "all-to-all") return planner::CpKind::kAllToAll;
  return planner::CpKind::kRing;  // p2p, ring
}

Result<planner::SpaceSpec> space_of(const Config& config) {
  const ParallelConfig& p = config.parallel;
  planner::SpaceSpec spec;
  spec.policy = p.policy;
  auto mesh = planner::DeviceMesh::make(p.dp, p.pp, p.tp, p.cp);
  if (!mesh.ok()) return config.error("parallel.dp", mesh.error().message);
  spec.mesh = *mesh;
  spec.ep = p.ep;
  spec.sp = p.sp;
  spec.cp_kind = cp_kind_of(p.cp_kind);
  spec.chunks = p.chunks;
  for (size_t k = 0; k < p.stages.size(); ++k) {
    if (p.stages[k].size() != 2)
      return config.error("parallel.stages",
                          "entry " + std::to_string(k) + " must be [first_layer, last_layer]");
    spec.stages.push_back({p.stages[k][0], p.stages[k][1]});
  }
  return spec;
}

Status check_two_pipelines(const planner::SpaceSpec& space) {
  const planner::DeviceMesh& mesh = space.mesh;
  if (mesh.cp() > 1)
    return Error::at("parallel.cp",
                     "context parallelism does not combine with chimera's two "
                     "pipelines; choose another parallel.schedule");
  if (mesh.pp() < 2 || mesh.pp() % 2 != 0)
    return Error::at("parallel.pp",
                     "chimera needs an even number of pipeline stages, got parallel.pp=" +
                         std::to_string(mesh.pp()));
  if (space.chunks != 1)
    return Error::at("parallel.chunks",
                     "chimera places one stage per pipeline rank in each direction, got "
                     "parallel.chunks=" +
                         std::to_string(space.chunks));
  return Status::success();
}

// run.*, comm.* and optimizer.type: core/config.cc has checked each spelling, so a parse that
// fails here is loom's bug.
template <class T>
T parsed(Result<T> value, const char* key) {
  LOOM_CHECK(value.ok()) << key << ": " << value.error().message;
  return *value;
}

std::string real(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

}  // namespace

Result<PlanSpec> PlanSpec::of(const Config& config) {
  const ParallelConfig& p = config.parallel;
  PlanSpec spec;
  LOOM_ASSIGN_OR_RETURN(spec.space, space_of(config));
  auto schedule = sched::ScheduleSpec::parse(p.schedule, p.schedule_csv);
  if (!schedule.ok()) return config.error("parallel.schedule", schedule.error().message);
  spec.schedule = std::move(schedule).value();
  spec.space.two_pipelines = spec.schedule.is(sched::ScheduleKind::kChimera);
  if (spec.space.two_pipelines)
    if (Status s = check_two_pipelines(spec.space); !s.ok()) return config.locate(s.error());
  auto recompute = lower::parse_recompute(p.recompute);
  if (!recompute.ok()) return config.error("parallel.recompute", recompute.error().message);
  spec.recompute = *recompute;
  spec.zero = p.zero;
  spec.batch = BatchSpec{config.batch.global, config.batch.micro, p.dp};
  spec.device = parsed(parse_device(config.run.device), "run.device");
  spec.precision = parsed(parse_precision(config.run.precision), "run.precision");
  spec.backend = parsed(parse_backend(config.comm.backend), "comm.backend");
  spec.bucket_bytes = static_cast<int64_t>(config.comm.bucket_mb * 1024 * 1024);
  spec.optimizer = parsed(parse_optimizer(config.optimizer.type), "optimizer.type");
  spec.weight_decay = config.optimizer.weight_decay != 0;
  spec.memory_limit_gb = p.memory_limit_gb;
  return spec;
}

lower::PipelineRequest PlanSpec::pipeline() const {
  return lower::PipelineRequest{schedule,
                                space.mesh.pp(),
                                space.chunks,
                                batch,
                                space.mesh.size() / space.mesh.pp(),
                                batch.micro_batches()};
}

std::vector<std::pair<std::string, std::string>> PlanSpec::plan_fields() const {
  const planner::SpaceSpec& s = space;
  std::string stages;
  for (const planner::StageRange& r : s.stages)
    stages += "[" + std::to_string(r.first_layer) + ", " + std::to_string(r.last_layer) + "]";
  const sched::ScheduleSpec::Imported* csv = schedule.as_imported();
  return {
      {"parallel.policy", s.policy},
      {"parallel.dp", std::to_string(s.mesh.dp())},
      {"parallel.tp", std::to_string(s.mesh.tp())},
      {"parallel.pp", std::to_string(s.mesh.pp())},
      {"parallel.cp", std::to_string(s.mesh.cp())},
      {"parallel.cp_kind", planner::name(s.cp_kind)},
      {"parallel.ep", std::to_string(s.ep)},
      {"parallel.sp", s.sp ? "true" : "false"},
      {"parallel.chunks", std::to_string(s.chunks)},
      {"parallel.stages", stages},
      {"parallel.schedule", schedule.name()},
      {"parallel.schedule_csv", csv ? csv->csv : ""},
      {"parallel.recompute", lower::name(recompute)},
      {"parallel.zero", std::to_string(zero)},
      {"parallel.memory_limit_gb", real(memory_limit_gb)},
      {"batch.global", std::to_string(batch.global)},
      {"batch.micro", std::to_string(batch.micro)},
      {"run.precision", std::string(name(precision))},
  };
}

Config with_spec(const Config& config, const PlanSpec& spec) {
  Config c = config;
  ParallelConfig& p = c.parallel;
  const planner::SpaceSpec& s = spec.space;
  p.policy = s.policy;
  p.dp = s.mesh.dp();
  p.tp = s.mesh.tp();
  p.pp = s.mesh.pp();
  p.cp = s.mesh.cp();
  p.cp_kind = planner::name(s.cp_kind);
  p.ep = s.ep;
  p.sp = s.sp;
  p.chunks = s.chunks;
  p.stages.clear();
  for (const planner::StageRange& r : s.stages) p.stages.push_back({r.first_layer, r.last_layer});
  p.schedule = spec.schedule.name();
  const sched::ScheduleSpec::Imported* csv = spec.schedule.as_imported();
  p.schedule_csv = csv ? csv->csv : "";
  p.recompute = lower::name(spec.recompute);
  p.zero = spec.zero;
  p.memory_limit_gb = spec.memory_limit_gb;
  c.batch.global = spec.batch.global;
  c.batch.micro = spec.batch.micro;
  return c;
}

}  // namespace loom::plan
