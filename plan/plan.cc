#include "plan/plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "graph/precision.h"
#include "graph/rewriter.h"
#include "graph/verify.h"
#include "lower/equivalence.h"
#include "lower/recompute.h"
#include "lower/schedule_order.h"
#include "plan/plan_hash.h"
#include "plan/plan_spec.h"
#include "plan/size_check.h"
#include "planner/context_parallel.h"
#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/simulator.h"

namespace loom::plan {
namespace {

// Adds a "communication" track under every pipeline device of the chrome trace: after each
// forward (backward or input-gradient) block, the cost-model time of the adapters' forward
// (gradient) paths the device's slowest rank takes part in for one micro-batch. The simulated
// blocks do not wait for it: the track shows how much communication each block brings, not a
// re-simulation.
std::string with_comm_track(const std::string& trace, const lower::Lowered& lowered,
                            int64_t ranks_per_stage) {
  auto json = nlohmann::json::parse(trace, nullptr, false);
  if (json.is_discarded() || !json.contains("traceEvents")) return trace;
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  std::map<int64_t, std::pair<double, double>> per_device;  // pp index -> (forward s, backward s)
  for (int64_t r = 0; r < world; ++r) {
    double f = 0, b = 0;
    for (const auto& a : lowered.adapters) {
      f += path_seconds(a.forward, r);
      b += path_seconds(a.backward, r);
    }
    auto& slot = per_device[r / ranks_per_stage];
    slot.first = std::max(slot.first, f);
    slot.second = std::max(slot.second, b);
  }
  nlohmann::json added = nlohmann::json::array();
  std::set<int64_t> named;
  for (const auto& e : json["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat != "F" && cat != "B" && cat != "I") continue;  // W blocks communicate nothing
    const int64_t pid = e.value("pid", 0);
    const auto it = per_device.find(pid);
    const double dur_us =
        it == per_device.end() ? 0 : (cat == "F" ? it->second.first : it->second.second) * 1e6;
    if (dur_us <= 0) continue;
    if (named.insert(pid).second)
      added.push_back({{"name", "thread_name"},
                       {"ph", "M"},
                       {"pid", pid},
                       {"tid", 1},
                       {"args", {{"name", "communication"}}}});
    added.push_back({{"name", "comm after " + e.value("name", std::string())},
                     {"cat", "comm"},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", 1},
                     {"ts", e.value("ts", 0.0) + e.value("dur", 0.0)},
                     {"dur", dur_us}});
  }
  for (auto& e : added) json["traceEvents"].push_back(std::move(e));
  return json.dump(1);
}

// The largest of a per-rank figure over each pipeline device's ranks.
std::vector<double> slowest_per_device(const std::vector<double>& per_rank, const PlanSpec& spec) {
  std::vector<double> out(static_cast<size_t>(spec.mesh().pp()), 0.0);
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const size_t d = static_cast<size_t>(spec.pipeline_device(Rank(static_cast<int64_t>(r))));
    out[d] = std::max(out[d], per_rank[r]);
  }
  return out;
}

// A predefined or imported schedule's order with its blocks at the plan's durations: a forward
// of a stage chunk takes `unit_ms`, the rest sched::block_time of it, and the blocks that start a
// backward (B, or I when split) `again_ms` more: the forward a recomputing backward runs again.
Result<sched::Schedule> retimed(const sched::Schedule& s, double unit_ms, double again_ms) {
  return s.with_durations(
      [&](const sched::Block& b) { return sched::block_time(b.kind, unit_ms, again_ms); });
}

// Simulates the pipeline schedule the ranks run (order.schedule) at the cost model's block
// durations. Predefined and CSV schedules: a forward takes its device's forward time per stage
// chunk, the others sched::block_time of it. A searched schedule is the one found, its blocks at
// each stage's own durations.
Status simulate_pipeline(const PlanSpec& spec, const std::vector<double>& forward_s,
                         const std::vector<double>& recompute_s, const lower::PipelineOrder& order,
                         Plan& plan) {
  if (!order.schedule) return Status::success();  // no pipeline
  double unit_s = 0;                              // the slowest stage's forward per micro-batch
  for (double f : forward_s) unit_s = std::max(unit_s, f);
  // The renderer draws one time unit as 1 ms: simulate in milliseconds.
  const double chunks = static_cast<double>(spec.space.chunks);
  const double unit_ms = std::max(unit_s / chunks, 1e-15) * 1e3;
  double again_s = 0;  // the forward a recomputing backward runs again
  for (double f : recompute_s) again_s = std::max(again_s, f);
  const double again_ms = again_s / chunks * 1e3;
  sched::Schedule schedule = *order.schedule;
  sched::SimOptions options;
  if (!spec.schedule.as_searched()) {
    LOOM_ASSIGN_OR_RETURN(schedule, retimed(*order.schedule, unit_ms, again_ms));
    // Predefined and CSV schedules time every device as the slowest; each device's blocks take
    // its own share (an embedding or a head makes the end stages heavier than the rest).
    std::vector<double> factor = slowest_per_device(forward_s, spec);
    for (double& f : factor) f = unit_s > 0 ? f / unit_s : 1.0;
    options.device_factor = std::move(factor);
  }
  auto timeline = sched::simulate(schedule, options);
  if (!timeline.ok()) return Status::success();
  plan.pipeline.bubble_ratio = timeline->bubble_ratio;
  plan.pipeline.makespan_s = timeline->makespan * 1e-3;
  for (double b : timeline->busy) plan.pipeline.busy_s.push_back(b * 1e-3);
  plan.pipeline.peak_micro_batches = timeline->peak_memory;
  if (auto csv = sched::to_csv(schedule); csv.ok()) plan.schedule.csv = *csv;
  plan.pipeline.schedule = std::move(schedule);
  plan.pipeline.timeline = std::move(timeline).value();
  return Status::success();
}

}  // namespace

lower::StageCosts stage_costs(const PlanSpec& spec, const graph::Graph& planned,
                              const lower::Lowered& lowered, const CostModel& cost,
                              planner::FlopsMemo* flops, const lower::Fusion* fusion) {
  const ComputeCost compute = compute_cost(planned, lowered, cost, spec.on_gpu(),
                                           planner::graph_flops(planned, flops), fusion);
  const std::vector<RankMemory> memory = rank_memory(spec, planned, lowered, &compute);
  const std::vector<double>& forward_s = compute.forward_s;
  const std::vector<double>& recompute_s = compute.recompute.forward_s;
  lower::StageCosts costs;
  costs.device_memory_bytes = cost.device_memory_bytes;
  const int64_t world = static_cast<int64_t>(memory.size());
  costs.devices.resize(static_cast<size_t>(spec.mesh().pp()));
  // How tight a rank is: the share of its room that one micro-batch takes (without a device
  // memory, its bytes); no room at all is the tightest.
  auto tightness = [&](const RankMemory& m) {
    if (cost.device_memory_bytes <= 0) return m.activation_bytes;
    const double room = cost.device_memory_bytes - m.held_bytes;
    return room > 0 ? m.activation_bytes / room : std::numeric_limits<double>::infinity();
  };
  const std::vector<double> slowest_forward = slowest_per_device(forward_s, spec);
  const std::vector<double> slowest_recompute = slowest_per_device(recompute_s, spec);
  for (size_t d = 0; d < costs.devices.size(); ++d) {
    costs.devices[d].forward_s = slowest_forward[d];
    costs.devices[d].recompute_s = slowest_recompute[d];
  }
  std::vector<double> tightest(costs.devices.size(), -1);
  for (int64_t r = 0; r < world; ++r) {
    const size_t d = static_cast<size_t>(spec.pipeline_device(Rank(r)));
    lower::StageCost& c = costs.devices[d];
    const RankMemory& m = memory[static_cast<size_t>(r)];
    if (tightness(m) > tightest[d]) {
      tightest[d] = tightness(m);
      c.activation_bytes = m.activation_bytes;
      c.held_bytes = m.held_bytes;
    }
  }
  return costs;
}

std::shared_ptr<const PlanCache::Model> PlanCache::model(const std::string& key) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = models_.find(key);
  return it == models_.end() ? nullptr : it->second;
}

planner::FlopsMemo& PlanCache::flops() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::unique_ptr<planner::FlopsMemo>& memo = flops_[std::this_thread::get_id()];
  if (!memo) memo = std::make_unique<planner::FlopsMemo>();
  return *memo;
}

void PlanCache::keep_model(const std::string& key, Model model) {
  std::lock_guard<std::mutex> guard(mutex_);
  models_.emplace(key, std::make_shared<const Model>(std::move(model)));
}

Result<std::shared_ptr<const PlanCache::Lowering>> PlanCache::lowering(const std::string& key,
                                                                       const LoweringMaker& make) {
  std::promise<std::shared_ptr<const Lowering>> made;
  std::shared_future<std::shared_ptr<const Lowering>> kept;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (const auto& [k, l] : lowerings_)
      if (k == key) kept = l;
    if (!kept.valid()) {
      lowerings_.emplace_back(key, made.get_future().share());
      if (lowerings_.size() > kLoweringsKept) lowerings_.pop_front();
    }
  }
  if (kept.valid()) {
    if (std::shared_ptr<const Lowering> l = kept.get()) return l;
  } else {
    std::optional<Result<Lowering>> made_now;
    ++lowerings_made_;
    try {
      made_now = make();
    } catch (...) {  // a broken invariant: whoever waits for this key meets it too
      made.set_exception(std::current_exception());
      throw;
    }
    Result<Lowering>& lowering = *made_now;
    if (!lowering.ok()) {
      made.set_value(nullptr);
      return lowering.error();
    }
    auto l = std::make_shared<const Lowering>(std::move(lowering).value());
    made.set_value(l);
    return l;
  }
  ++lowerings_made_;
  LOOM_ASSIGN_OR_RETURN(Lowering own, make());  // the make waited for failed
  return std::make_shared<const Lowering>(std::move(own));
}

namespace {

// The model type's checks of the split in space: context parallelism always (a type without a
// sequence refuses it), the type's own where the plan has several ranks.
Status check_model_parallel(const Config& config, const PlanSpec& spec,
                            const Registries& registries, int64_t world_size) {
  if (world_size <= 1) return Status::success();
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
  return models::check_parallel(config, spec.space, *type);
}

Result<graph::Graph> build_model(const Config& config, const PlanSpec& spec,
                                 const Registries& registries, int64_t world_size) {
  const planner::SpaceSpec& space = spec.space;
  const models::GraphShape shape{spec.batch.micro * space.mesh.dp(), space.mesh.tp()};
  graph::Graph model;
  if (registries.model) {
    LOOM_ASSIGN_OR_RETURN(model, registries.model(config, shape, registries.ops));
  } else {
    LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
    LOOM_TRY(models::check_context_parallel(space, *type));
    LOOM_ASSIGN_OR_RETURN(model, type->build(config, shape, registries.ops));
    LOOM_TRY(check_model_parallel(config, spec, registries, world_size));
  }
  LOOM_TRY(graph::verify(model, registries.ops));
  // run.precision is a property of the graph: byte counts, estimates and buffers follow it.
  if (bf16_activations(spec.precision))
    model = graph::with_compute_dtype(std::move(model), DType::kBFloat16, registries.ops);
  // Context parallelism rewrites attention as ring steps before any split (its new tensors stay
  // float32 whatever the precision).
  if (space.ring_attention()) {
    auto ring = planner::context_parallel_attention(model, space.mesh.cp(),
                                                    planner::cp_order(space.cp_kind));
    if (!ring.ok()) return Error::at("parallel.cp", ring.error().message);
    model = std::move(ring).value();
  }
  return model;
}

// The static equivalence proof of a plan loom made, where debug builds and tests check each
// transform: a failure is loom's bug, named as such.
Status prove_equivalent(const Plan& plan, const PlanProofs& proofs) {
  if (!proofs.equivalent || graph::default_verify_mode() != graph::VerifyMode::kEachTransform)
    return Status::success();
  Status s = lower::prove_equivalent(plan.model, plan.file.graph, plan.file.lowered,
                                     plan.file.micro_batches);
  if (!s.ok())
    return Error::at("plan",
                     "internal error: the plan loom made is not equal to one device (a "
                     "bug in loom's planner or lowering): " +
                         s.error().message);
  return Status::success();
}

// What build_model's graph is made of: model.* (what the builder reads), the samples of one
// micro-batch over the replicas, the tensor-parallel degree (Llama lays out its kv heads by it),
// the precision and the context-parallel rewrite. Configs that differ only in what else a plan
// reads (the pipeline, recomputation, ZeRO, sequence parallelism, the global batch) share one
// key. The checks of the split are not part of it: they run on every config.
std::string model_key(const Config& config, const PlanSpec& spec) {
  const ModelConfig& m = config.model;
  std::string key = "type " + m.type + "\npreset " + m.preset + "\nfrom_hf " + m.from_hf + "\n";
  for (const auto& [name, value] : m.args) key += "args." + name + " " + value + "\n";
  const planner::SpaceSpec& s = spec.space;
  return key + "replicas_batch " + std::to_string(spec.batch.micro * s.mesh.dp()) + "\ndp " +
         std::to_string(s.mesh.dp()) + "\ntp " + std::to_string(s.mesh.tp()) + "\ncp " +
         std::to_string(s.mesh.cp()) + " " + planner::name(s.cp_kind) + "\nep " +
         std::to_string(s.ep) + "\npolicy " + s.policy + "\nprecision " +
         std::string(name(spec.precision)) + "\n";
}

// build_model through `cache`, with the model's digest: a model built for an equal key is
// copied and its digest reused; the checks of the config's parallel degrees (which build_model
// runs around the build) run all the same, in the same order, so a config is refused as it would
// be without the cache.
Result<PlanCache::Model> cached_model(const Config& config, const PlanSpec& spec,
                                      const Registries& registries, int64_t world_size,
                                      PlanCache* cache) {
  auto built_now = [&]() -> Result<PlanCache::Model> {
    LOOM_ASSIGN_OR_RETURN(graph::Graph model, build_model(config, spec, registries, world_size));
    std::string digest = lower::model_digest(model);
    return PlanCache::Model{std::move(model), std::move(digest)};
  };
  if (!cache || registries.model) return built_now();
  const std::string key = model_key(config, spec);
  if (std::shared_ptr<const PlanCache::Model> built = cache->model(key)) {
    LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
    LOOM_TRY(models::check_context_parallel(spec.space, *type));
    LOOM_TRY(check_model_parallel(config, spec, registries, world_size));
    return *built;
  }
  LOOM_ASSIGN_OR_RETURN(PlanCache::Model model, built_now());
  cache->keep_model(key, model);
  return model;
}

// parallel.zero 3 gathers a linear's weight again in its backward and reduce-scatters its
// gradient there: a weight gradient deferred to a W block would need both again, which the W
// blocks' promise (no communication, lower/program.h) rules out.
// Context parallelism's ring steps recomputed in full inside layers whose weight gradients wait
// for W blocks (llama tiny, cp 2 x pp 2, zb-h1) left a last-stage parameter without its gradient
// when its bucket was flushed: refused until that combination is made to work.
Status check_cp_schedule(const PlanSpec& spec, const lower::Lowered& lowered) {
  if (spec.mesh().cp() == 1 || spec.recompute != lower::Recompute::kFull) return Status::success();
  for (const lower::Program& prog : lowered.programs)
    for (const lower::ProgramBlock& b : prog.blocks)
      if (b.kind == lower::BlockKind::kW)
        return Error::at("parallel.cp",
                         "context parallelism with parallel.recompute: full does not combine "
                         "with a backward split into input- and weight-gradient blocks "
                         "(parallel.schedule: " +
                             spec.schedule.name() +
                             "); use selective recomputation, or a schedule without W blocks");
  return Status::success();
}

Status check_zero3_schedule(const PlanSpec& spec, const lower::Lowered& lowered) {
  if (spec.zero != 3) return Status::success();
  for (const lower::Program& prog : lowered.programs)
    for (const lower::ProgramBlock& b : prog.blocks)
      if (b.kind == lower::BlockKind::kW)
        return Error::at("parallel.zero",
                         "3 (parameters stored split) does not combine with a backward split "
                         "into input- and weight-gradient blocks (parallel.schedule: " +
                             spec.schedule.name() +
                             "); use zero 1, or a schedule without W blocks");
  return Status::success();
}

// The pipeline's order of `file`'s lowered programs (each rank's blocks), found once the
// adapters are known: what they deliver counts in a stage's activations, which bound how many
// micro-batches a searched schedule keeps in flight. Returns the order, whose schedule the plan
// simulates (its ranks moved into the programs).
Result<lower::PipelineOrder> order_pipeline(const PlanSpec& spec, const CostModel& cost,
                                            lower::PlanFile& file, const lower::Fusion& fusion,
                                            sched::SearchMemo* searches,
                                            planner::FlopsMemo& flops) {
  lower::StageCosts costs;  // only the search reads them
  if (spec.schedule.as_searched() && spec.mesh().pp() > 1) {
    lower::Lowered marked = file.lowered;  // what a micro-batch holds depends on recomputation
    lower::mark_recompute(file.graph, marked, spec.recompute, &fusion.into_next);
    costs = stage_costs(spec, file.graph, marked, cost, &flops, &fusion);
  }
  LOOM_ASSIGN_OR_RETURN(lower::PipelineOrder pipeline,
                        lower::pipeline_order(spec.pipeline(), costs, searches));
  std::vector<std::vector<lower::ProgramBlock>>& blocks = pipeline.ranks;
  if (!blocks.empty()) {
    LOOM_CHECK(blocks.size() == file.lowered.programs.size())
        << "an order for " << blocks.size() << " ranks, " << file.lowered.programs.size()
        << " lowered";
    for (size_t r = 0; r < blocks.size(); ++r)
      file.lowered.programs[r].blocks = std::move(blocks[r]);
  }
  blocks.clear();
  return pipeline;
}

// The plan as the policy and the lowering up to the pipeline's order see it, so that plans
// differing only in what they do not read share one key: parallel.recompute (neither reads it),
// parallel.zero 1 (only the estimate reads it; zero 3 stores parameters split) and the schedule,
// but for chimera, whose two pipelines the policy places. A policy registered from code keeps
// the schedule in the key: it may read it.
std::string lowering_key(const Config& config, const PlanSpec& spec, const CostModel& cost,
                         int64_t world_size) {
  static const std::vector<std::string> builtin =
      planner::PolicyRegistry::with_builtin_policies().names();
  PlanSpec s = spec;
  s.recompute = lower::Recompute::kNone;
  if (s.zero == 1) s.zero = 0;  // only zero 3 changes the lowering
  const bool builtin_policy =
      std::find(builtin.begin(), builtin.end(), s.space.policy) != builtin.end();
  if (builtin_policy && !s.schedule.is(sched::ScheduleKind::kChimera))
    s.schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  std::string key = std::to_string(world_size) + "\n" + model_key(config, spec);
  for (const auto& [k, v] : s.plan_fields()) key += k + "=" + v + "\n";
  return key + "device " + std::string(name(s.device)) + "\n" + cost_model_values(cost);
}

// The policy's graph of plan.model, verified when `proofs` ask, its lowering ordered by the
// pipeline's schedule (the order is returned: the plan simulates its schedule) and what the
// plan reads of the lowering (`facts`). The graph, the lowering before the order and its facts
// come from `cache` when a config with the same lowering_key was lowered there, else they are
// made and kept.
Result<lower::PipelineOrder> plan_and_lower(const Config& config, const PlanSpec& spec,
                                            const Registries& registries, const CostModel& cost,
                                            const PlanProofs& proofs, PlanCache* cache,
                                            planner::FlopsMemo& flops, Plan& plan,
                                            PlanCache::LoweringFacts& facts) {
  lower::PlanFile& file = plan.file;
  bool verified = false;
  auto make = [&]() -> Result<PlanCache::Lowering> {
    PlanCache::Lowering out;
    LOOM_ASSIGN_OR_RETURN(
        out.planned, planner::plan_graph(plan.model, {spec.space, file.world_size, spec.optimizer},
                                         registries.policies));
    if (proofs.verify_graph) LOOM_TRY(graph::verify(out.planned, registries.ops));
    verified = proofs.verify_graph;
    lower::PathFinder paths(cost);
    lower::LowerOptions options;
    options.shard_parameters = spec.zero == 3;
    options.check_deadlock = false;  // checked once the recomputed forwards are in place
    LOOM_ASSIGN_OR_RETURN(out.lowered,
                          lower::lower(out.planned, file.world_size, spec.micro_batches(), paths,
                                       lower::BlockOrderFn{}, options));
    PlanCache::LoweringFacts& f = out.facts;
    f.op_flops = planner::graph_flops(out.planned, &flops);
    f.fusion = lower::fusion_of(out.planned, out.lowered);
    f.bytes = std::make_shared<const LoweredBytes>(
        lowered_bytes(out.planned, out.lowered, f.fusion, spec.on_gpu()));
    return out;
  };
  if (cache) {
    LOOM_ASSIGN_OR_RETURN(std::shared_ptr<const PlanCache::Lowering> kept,
                          cache->lowering(lowering_key(config, spec, cost, file.world_size), make));
    file.graph = kept->planned;
    file.lowered = kept->lowered;
    facts = kept->facts;
  } else {
    LOOM_ASSIGN_OR_RETURN(PlanCache::Lowering made, make());
    file.graph = std::move(made.planned);
    file.lowered = std::move(made.lowered);
    facts = std::move(made.facts);
  }
  if (proofs.verify_graph && !verified) LOOM_TRY(graph::verify(file.graph, registries.ops));
  return order_pipeline(spec, cost, file, facts.fusion, cache ? &cache->searches() : nullptr,
                        flops);
}

// make_plan's passes on the spec read from `config` (which the model builder and the plan file
// read as well); errors carry their keys, located by make_plan.
Result<Plan> plan_of(const Config& config, const PlanSpec& spec, const Registries& registries,
                     const CostModel& cost, int64_t world_size, const PlanProofs& proofs,
                     PlanCache* cache) {
  planner::FlopsMemo own_flops;  // sub-ops' FLOPs, counted once per plan or once per cache
  planner::FlopsMemo& flops = cache ? cache->flops() : own_flops;
  Plan plan;
  plan.cost = cost;
  if (!registries.model) {
    LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
    LOOM_TRY(check_model_fits(config, spec, *type, cost, world_size));
  }
  LOOM_ASSIGN_OR_RETURN(PlanCache::Model model,
                        cached_model(config, spec, registries, world_size, cache));
  plan.model = std::move(model.graph);
  LOOM_TRY(check_plan_fits(plan.model, spec, world_size));

  lower::PlanFile& file = plan.file;
  file.code_fingerprint =
      lower::code_fingerprint(registries.ops.types(), registries.policies.names());
  file.model_digest = std::move(model.digest);
  file.hash = plan_hash(spec, cost, file.model_digest, file.code_fingerprint);
  file.config_yaml = to_yaml(config);
  file.world_size = world_size;
  file.micro_batches = spec.micro_batches();

  PlanCache::LoweringFacts facts;  // of file.graph and file.lowered
  LOOM_ASSIGN_OR_RETURN(
      lower::PipelineOrder pipeline,
      plan_and_lower(config, spec, registries, cost, proofs, cache, flops, plan, facts));
  LOOM_TRY(check_zero3_schedule(spec, file.lowered));
  LOOM_TRY(check_cp_schedule(spec, file.lowered));
  lower::mark_recompute(file.graph, file.lowered, spec.recompute, &facts.fusion.into_next);
  // A recomputed forward repeats its collectives inside the backward.
  if (proofs.deadlock_free) LOOM_TRY(lower::check_deadlock_free(file.graph, file.lowered));
  LOOM_TRY(prove_equivalent(plan, proofs));

  ComputeCost compute =
      compute_cost(file.graph, file.lowered, cost, spec.on_gpu(), facts.op_flops, &facts.fusion);
  compute.bytes = facts.bytes;
  LOOM_TRY(simulate_pipeline(spec, compute.forward_s, compute.recompute.forward_s, pipeline, plan));
  plan.schedule.read_as = pipeline.csv_actions;
  file.schedule_csv = plan.schedule.csv;
  plan.estimate = estimate_plan(spec, file.graph, file.lowered, cost, plan.pipeline, &compute);
  return plan;
}

}  // namespace

Result<Plan> make_plan(const Config& config, const Registries& registries, const CostModel& cost,
                       int64_t world_size, const PlanProofs& proofs, PlanCache* cache) {
  if (world_size == 0) world_size = config.parallel.world_size();
  if (world_size < 1)
    return Error::at("world_size",
                     "the world size must be positive, got " + std::to_string(world_size));
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  Result<Plan> plan = plan_of(config, spec, registries, cost, world_size, proofs, cache);
  if (!plan.ok()) return config.locate(plan.error());
  return plan;
}

Result<graph::Graph> build_model(const Config& config, const Registries& registries,
                                 int64_t world_size) {
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  Result<graph::Graph> model = build_model(config, spec, registries, world_size);
  if (!model.ok()) return config.locate(model.error());
  return model;
}

Result<graph::Graph> planned_graph(const Config& config, const Registries& registries,
                                   int64_t world_size) {
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  auto planned = [&]() -> Result<graph::Graph> {
    LOOM_ASSIGN_OR_RETURN(graph::Graph single, build_model(config, spec, registries, world_size));
    return planner::plan_graph(single, {spec.space, world_size, spec.optimizer},
                               registries.policies);
  }();
  if (!planned.ok()) return config.locate(planned.error());
  return planned;
}

Status prove(const Plan& plan, const Registries& registries, const PlanProofs& proofs) {
  if (proofs.verify_graph) LOOM_TRY(graph::verify(plan.file.graph, registries.ops));
  if (proofs.deadlock_free)
    LOOM_TRY(lower::check_deadlock_free(plan.file.graph, plan.file.lowered));
  return prove_equivalent(plan, proofs);
}

ScheduleDrawings draw_schedule(const Plan& plan) {
  if (plan.schedule.csv.empty()) return {};
  const sched::Schedule& schedule = plan.pipeline.schedule;
  const int64_t ranks_per_device =
      std::max<int64_t>(1, plan.world_size() / std::max(1, schedule.num_devices()));
  return {with_comm_track(sched::to_chrome_trace(schedule, plan.pipeline.timeline),
                          plan.file.lowered, ranks_per_device),
          sched::to_svg(schedule, plan.pipeline.timeline)};
}

Result<Plan> make_plan(const Config& config, const Registries& registries) {
  LOOM_ASSIGN_OR_RETURN(CostModel cost, resolve_cost_model(config));
  return make_plan(config, registries, cost);
}

}  // namespace loom::plan
