// The one way from a config to a plan: build the single-device model, check it, plan it (the
// policy), verify, order the pipeline, lower to per-rank programs with their communication,
// prove the programs deadlock-free and estimate what the plan costs, on one cost model.
// `loom train`, `loom plan`, the embedding API and the benches all call make_plan; the runtime
// receives the Plan and runs it. LibTorch-free: a plan for thousands of ranks is made here.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/config.h"
#include "core/cost_model.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "lower/plan_file.h"
#include "lower/schedule_order.h"
#include "models/model.h"
#include "plan/estimate.h"
#include "plan/plan_spec.h"
#include "planner/cost.h"
#include "planner/policy.h"
#include "scheduler/repetend.h"

namespace loom::plan {

// Builds a user's single-device model (the embedding API's Setup::set_model).
using ModelBuilder = models::ModelBuilder;

// What plans are made with: the op types, the policies and the model types (model.type picks
// one; `model`, when set, builds every run's model instead).
struct Registries {
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  planner::PolicyRegistry policies = planner::PolicyRegistry::with_builtin_policies();
  models::ModelRegistry models = models::ModelRegistry::with_builtin_models();
  ModelBuilder model;
};

// The pipeline schedule of a plan as a file: empty without pipeline parallelism.
struct ScheduleFiles {
  std::string csv;  // torch.distributed.pipelining's action-per-cell format
  // parallel.schedule csv: how parallel.schedule_csv named its backwards (torch's older B + W,
  // or I + W); what `loom plan` reports.
  std::optional<sched::CsvActions> read_as;
};

struct Plan {
  graph::Graph model;    // the single-device graph the plan was made from
  lower::PlanFile file;  // the planned graph and per-rank programs, hashed: plan.json
  CostModel cost;
  PipelineTimes pipeline;
  ScheduleFiles schedule;
  Estimate estimate;

  int64_t world_size() const { return file.world_size; }
};

// The pipeline schedule drawn, for a user to read: empty without pipeline parallelism. Drawn on
// demand (the auto-planner makes hundreds of plans and dumps one).
struct ScheduleDrawings {
  std::string chrome_trace;  // chrome://tracing, Perfetto: blocks and a communication track
  std::string svg;           // a Gantt chart
};
ScheduleDrawings draw_schedule(const Plan& plan);

// The single-device graph of `config` (registries.model's, or model.type's entry), its split in
// space checked against the model when `world_size` > 1, verified, in run.precision, with
// context parallelism's ring attention in place.
Result<graph::Graph> build_model(const Config& config, const Registries& registries,
                                 int64_t world_size);

// The policy's graph of `config` for `world_size` ranks: build_model, then the policy with the
// plan's space spec (make_plan's chain without lowering: policy tests, the graph goldens and
// bench/plan_scale).
Result<graph::Graph> planned_graph(const Config& config, const Registries& registries,
                                   int64_t world_size);

// What one micro-batch costs each pipeline device of a lowered plan, the block graph of
// parallel.schedule search: its slowest rank's forward (forward_seconds) and, of the rank with
// the least room for activations, what it holds and what a micro-batch adds (rank_memory).
// `flops` as forward_seconds'; `fusion` as compute_cost's.
lower::StageCosts stage_costs(const PlanSpec& spec, const graph::Graph& planned,
                              const lower::Lowered& lowered, const CostModel& cost,
                              planner::FlopsMemo* flops = nullptr,
                              const lower::Fusion* fusion = nullptr);

// What make_plan proves of the plan it makes, besides refusing what cannot be planned: that
// the policy's graph verifies, that the programs cannot deadlock and, in debug builds and tests
// (graph::default_verify_mode(): LOOM_VERIFY_EACH_TRANSFORM), that the lowered programs compute
// the single-device model (lower/equivalence.h; `loom verify --static` runs it on any plan).
// All hold of every plan loom makes (a failure is loom's bug); the auto-planner's proxies,
// estimated and discarded, skip them, and what it keeps is planned whole with them.
struct PlanProofs {
  bool verify_graph = true;
  bool deadlock_free = true;
  bool equivalent = true;  // where graph::default_verify_mode() checks each transform
};

// What plans of one model made one after another share, made once: the single-device graph of
// each distinct model config (what build_model reads: model.*, batch.micro, parallel.dp, tp, cp,
// ep, policy, run.*), each distinct schedule search, and the last few lowerings (what configs
// that differ only in recomputation or the pipeline schedule share). The auto-planner's
// candidates differ in parallel.* only, so most of their work is found here. Safe to share
// between threads; used with one set of Registries.
class PlanCache {
 public:
  // A single-device graph and its digest (lower::model_digest, what the plan file records).
  struct Model {
    graph::Graph graph;
    std::string digest;
  };
  // The model built for `key`, or null.
  std::shared_ptr<const Model> model(const std::string& key) const;
  void keep_model(const std::string& key, Model model);

  // What a lowering's plans read of it besides their plan file, found once.
  struct LoweringFacts {
    std::vector<double> op_flops;               // planner::graph_flops of the planned graph
    lower::Fusion fusion;                       // lower::fusion_of the lowering
    std::shared_ptr<const LoweredBytes> bytes;  // lowered_bytes on the run's device
  };
  // A planned graph lowered to per-rank programs before the pipeline's order and recomputation
  // are applied: what plans that differ only in parallel.recompute and in a schedule that does
  // not change the stages' placement share.
  struct Lowering {
    graph::Graph planned;
    lower::Lowered lowered;
    LoweringFacts facts;
  };
  // The lowering kept for `key`, made by `make` when none is: once, a caller asking for a key
  // being made waits for it. `make`'s error goes to its caller; one waiting for a make that
  // failed makes its own. Only the newest kLoweringsKept stay (a search asks for one shape's
  // rungs and schedules close together, and a 256-rank lowering is tens of MB).
  using LoweringMaker = std::function<Result<Lowering>()>;
  Result<std::shared_ptr<const Lowering>> lowering(const std::string& key,
                                                   const LoweringMaker& make);
  int64_t lowerings_made() const { return lowerings_made_; }  // makes run through lowering()
  static constexpr size_t kLoweringsKept = 8;
  sched::SearchMemo& searches() { return searches_; }
  // The calling thread's memo of sub-ops' FLOPs (each search thread counts into its own).
  planner::FlopsMemo& flops();

 private:
  mutable std::mutex mutex_;
  std::map<std::thread::id, std::unique_ptr<planner::FlopsMemo>> flops_;
  std::map<std::string, std::shared_ptr<const Model>> models_;
  // Newest last; null once made by a make that failed.
  std::deque<std::pair<std::string, std::shared_future<std::shared_ptr<const Lowering>>>>
      lowerings_;
  std::atomic<int64_t> lowerings_made_{0};
  sched::SearchMemo searches_;
};

// The plan of `config` for `world_size` ranks (0: parallel.dp x tp x pp). Every user mistake
// (config, model arguments, degrees that do not divide the model) is an error naming the key.
// `cache`, when given, answers what an earlier plan made with it has built or searched: the
// plan is the same with or without it.
Result<Plan> make_plan(const Config& config, const Registries& registries, const CostModel& cost,
                       int64_t world_size = 0, const PlanProofs& proofs = {},
                       PlanCache* cache = nullptr);

// The proofs of `proofs` on a plan made without them (make_plan's own, run afterwards): what
// the auto-planner runs on the one plan it keeps of those it ranks.
Status prove(const Plan& plan, const Registries& registries, const PlanProofs& proofs = {});
// The same on the config's own cost model (cost.*).
Result<Plan> make_plan(const Config& config, const Registries& registries = {});

}  // namespace loom::plan
