// The auto-planner's candidates: the skeletons of a world, their variants, their specs and
// labels, and what the model offers to split.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/training_state.h"
#include "lower/program.h"
#include "plan/auto_plan_parts.h"

namespace loom::plan::auto_detail {

bool zero_applies(const Shape& s, int64_t zero) {
  if (zero > 0 && s.replicas() == 1) return false;
  // A split backward's weight gradients would need zero 3's gathers in the W blocks.
  if (zero == 3 && s.schedule.splits_backward()) return false;
  return true;
}

std::vector<std::string> overrides_of(const Shape& s, const Rung& r, int64_t global) {
  return {"parallel.policy=" + s.policy,
          "parallel.dp=" + std::to_string(s.dp),
          "parallel.cp=" + std::to_string(s.cp),
          "parallel.cp_kind=p2p",
          "parallel.ep=" + std::to_string(s.ep),
          "parallel.tp=" + std::to_string(s.tp),
          "parallel.pp=" + std::to_string(s.pp),
          "parallel.sp=" + std::string(s.sp ? "true" : "false"),
          "parallel.chunks=" + std::to_string(s.chunks),
          "parallel.schedule=" + s.schedule.name(),
          "parallel.recompute=" + r.recompute,
          "parallel.zero=" + std::to_string(r.zero),
          "batch.micro=" + std::to_string(s.micro),
          "batch.global=" + std::to_string(global)};
}

// The spec of shape `s` at rung `r` with `global` samples per step, the rest as `user`'s.
PlanSpec spec_of(const PlanSpec& user, const Shape& s, const Rung& r, int64_t global) {
  PlanSpec spec = user;
  auto mesh = planner::DeviceMesh::make(s.dp, s.pp, s.tp, s.cp);
  LOOM_CHECK(mesh.ok()) << mesh.error().message;  // the search makes positive degrees only
  spec.space.mesh = *mesh;
  spec.space.policy = s.policy;
  spec.space.ep = s.ep;
  spec.space.sp = s.sp;
  spec.space.cp_kind = planner::CpKind::kRing;
  spec.space.chunks = s.chunks;
  spec.schedule = s.schedule;
  spec.space.two_pipelines = s.schedule.is(sched::ScheduleKind::kChimera);
  auto recompute = lower::parse_recompute(r.recompute);
  LOOM_CHECK(recompute.ok()) << recompute.error().message;
  spec.recompute = *recompute;
  spec.zero = r.zero;
  spec.batch = BatchSpec{global, s.micro, s.dp};
  return spec;
}

std::string label_of(const Shape& s, const Rung& r) {
  std::ostringstream os;
  os << "dp" << s.dp << " ";
  if (s.ep > 1) os << "ep" << s.ep << " ";
  if (s.cp > 1) os << "cp" << s.cp << " ";
  if (s.policy == "hybrid")
    os << "tp" << s.tp << (s.sp ? "+sp" : "");
  else
    os << s.policy << s.tp;
  os << " pp" << s.pp;
  if (s.chunks > 1) os << "x" << s.chunks;
  os << " mb" << s.micro;
  if (s.pp > 1) os << " " << s.schedule.name();
  if (r.recompute != "none") os << " recompute " << r.recompute;
  if (r.zero > 0) os << " zero" << r.zero;
  return os.str();
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The context-parallel degrees (dividing `ranks`, the ranks tp leaves) a pass takes.
std::vector<int64_t> cp_degrees(const ModelSplits& model, CpSearch search, int64_t ranks) {
  std::vector<int64_t> out;
  if (search == CpSearch::kLong) out.push_back(1);
  if (model.seq == 0) return out;
  for (int64_t cp : divisors(ranks)) {
    if (cp == 1 || model.seq % cp != 0) continue;
    const bool long_cut = model.seq >= kLongSequence && model.seq / cp >= kMinCpChunk;
    if (long_cut == (search == CpSearch::kLong)) out.push_back(cp);
  }
  return out;
}

// The expert-parallel degrees of `dp` data-parallel ranks: the divisors of dp that divide the
// experts.
std::vector<int64_t> ep_degrees(const ModelSplits& model, int64_t dp) {
  std::vector<int64_t> out = {1};
  if (model.experts == 0) return out;
  for (int64_t ep : divisors(dp))
    if (ep > 1 && model.experts % ep == 0) out.push_back(ep);
  return out;
}

// The most ranks a data-parallel proxy has: tensor parallelism within a node times the 32 stages
// large worlds are searched with. cp and ep (whose proxies keep an ep group, see ladder) are
// searched on proxies within it, so a proxy never costs more to plan than one without them.
int64_t max_proxy_ranks(const CostModel& cost) {
  return std::max<int64_t>(cost.devices_per_node, 1) * 32;
}

// The skeletons of `world` ranks: policy, degrees and micro-batch size, each with the plain
// order (1F1B under pipelining) and sequence parallelism with tp. make_plan refuses what the
// model rules out (degrees that do not divide it, too few layers for the stages).
std::vector<Shape> skeletons(const Config& config, const Registries& registries,
                             const CostModel& cost, const ModelSplits& model, CpSearch cp_search,
                             int64_t world, bool whole) {
  std::vector<std::string> policies = {"hybrid"};
  const std::vector<std::string> known = registries.policies.names();
  auto has = [&](const std::string& p) {
    return std::find(known.begin(), known.end(), p) != known.end();
  };
  if (cp_search == CpSearch::kLong) {  // context parallelism runs under the hybrid policy only
    if (config.model.type == "swin" && has("window")) policies.push_back("window");
    if (config.model.type == "evoformer" && has("dap")) policies.push_back("dap");
  }
  const int64_t global = config.batch.global;
  // Large worlds: micro-batches of 1 and 2 (what memory allows at scale) and at most 32 stages.
  const int64_t max_micro = whole ? 16 : 2, max_pp = whole ? 128 : 32;
  std::vector<Shape> out;
  for (const std::string& policy : policies)
    for (int64_t tp : divisors(world)) {
      if (tp > std::max<int64_t>(cost.devices_per_node, 1)) continue;  // tp within a node
      if (policy != "hybrid" && tp == 1) continue;
      const std::vector<int64_t> cps =
          policy == "hybrid" ? cp_degrees(model, cp_search, world / tp) : std::vector<int64_t>{1};
      for (int64_t cp : cps)
        for (int64_t pp : divisors(world / (tp * cp))) {
          if (pp > max_pp) continue;
          const int64_t dp = world / (tp * cp * pp);
          if (global % dp != 0) continue;
          const std::vector<int64_t> eps =
              policy == "hybrid" ? ep_degrees(model, dp) : std::vector<int64_t>{1};
          for (int64_t ep : eps) {
            if (!whole && ep * cp * tp * pp > max_proxy_ranks(cost)) continue;
            for (int64_t micro : divisors(global / dp)) {
              if (micro > max_micro) break;
              if (global / (dp * micro) > lower::kMaxMicroBatches) continue;
              Shape s;
              s.policy = policy;
              s.dp = dp;
              s.cp = cp;
              s.ep = ep;
              s.tp = tp;
              s.pp = pp;
              s.micro = micro;
              s.sp = policy == "hybrid" && tp > 1;
              out.push_back(s);
            }
          }
        }
    }
  return out;
}

// The other orders and splits of a skeleton: every predefined schedule and the repetend search
// under pipelining, tp without sequence parallelism.
std::vector<Shape> variants(const Shape& skeleton, int64_t global) {
  std::vector<Shape> out;
  const int64_t micro_batches = global / (skeleton.dp * skeleton.micro);
  if (skeleton.pp > 1) {
    using sched::ScheduleKind;
    using sched::ScheduleSpec;
    std::vector<std::pair<int64_t, ScheduleSpec>> orders = {
        {1, ScheduleSpec::predefined(ScheduleKind::kGPipe)},
        {1, ScheduleSpec::predefined(ScheduleKind::kZbH1)},
        {1, ScheduleSpec::searched(false)},
        {1, ScheduleSpec::searched(true)}};
    if (skeleton.pp % 2 == 0 && micro_batches % 2 == 0)
      orders.push_back({1, ScheduleSpec::predefined(ScheduleKind::kChimera)});
    if (micro_batches % skeleton.pp == 0)
      orders.push_back({2, ScheduleSpec::predefined(ScheduleKind::kInterleaved)});
    for (const auto& [chunks, schedule] : orders) {
      Shape v = skeleton;
      v.chunks = chunks;
      v.schedule = schedule;
      out.push_back(v);
    }
  }
  if (skeleton.sp) {
    Shape v = skeleton;
    v.sp = false;
    out.push_back(v);
  }
  return out;
}

// The busiest rank's figures of an estimate.
AutoCandidate figures(const Estimate& e) {
  AutoCandidate c;
  c.step_s = e.step_s;
  c.peak_bytes = e.max_peak_bytes();
  c.bubble = e.bubble_ratio;
  for (const RankEstimate& r : e.ranks)
    if (r.step_s >= c.comm_s + c.compute_s) {
      c.comm_s = r.comm_s;
      c.compute_s = r.compute_s;
    }
  return c;
}

// What config's model offers cp and ep: the sequence of a type that declares context
// parallelism (GPT, Llama), the routed experts of a type that may hold a mixture
// (ModelType::experts). A model built by Registries::model is searched without either.
Result<ModelSplits> model_splits(const Config& config, const Registries& registries) {
  ModelSplits out;
  if (registries.model) return out;
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
  if (type->context_parallel && type->items) {
    LOOM_ASSIGN_OR_RETURN(const models::SampleItems items, type->items(config));
    out.seq = items.per_sample;
  }
  if (type->experts) {
    LOOM_ASSIGN_OR_RETURN(out.experts, type->experts(config));
  }
  return out;
}

}  // namespace loom::plan::auto_detail
