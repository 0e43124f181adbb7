// How the search runs:
//
// - Skeletons first: every policy, tp (within a node), cp, pp, dp, ep and micro-batch size
//   (world = dp x cp x tp x pp), in 1F1B order with sequence parallelism on tp. Then the best
//   `expand` skeletons again under every other schedule (GPipe, ZB-H1, interleaved, Chimera, the
//   repetend search with and without the split backward) and tp without sp.
// - Context parallelism (cp_kind p2p, the hybrid policy, model types that declare it: GPT and
//   Llama) is searched from the start for sequences of 8192 tokens or more, cutting them into
//   chunks of at least 1024 tokens: below that a sample's activations are small next to the
//   weights, and a ring sending key/value chunks in every attention layer would only multiply
//   the shapes with losers. When nothing fits the memory, every other cut of the sequence is
//   searched in a second pass, whatever its length.
// - Expert parallelism (models with experts: GPT's and Llama's model.args.moe) is carved out of
//   dp: ep runs over the divisors of dp that divide the experts; the world size is unchanged.
// - Memory prunes first: a shape whose weights, gradients and optimizer state alone exceed the
//   limit at best (split over every rank) is not planned. Otherwise it takes the first rung of
//   its memory ladder that fits: for each recomputation level (none, selective, full) in turn
//   ZeRO 0 then 1 (free in time), and only then ZeRO 3 at each level (its gathers cost more than
//   recomputing). ZeRO shards over dp x cp, the ranks a parameter is replicated on, as the
//   lowering does. One plan per recomputation level tells which ZeRO level fits; the rung chosen
//   is then planned itself.
// - Large worlds (more ranks than `exact_ranks`) are searched on data-parallel proxies: the plan
//   of one replica (dp 1, the same micro-batches per replica; cp, tp and pp as the shape has
//   them), with the gradient all-reduce over dp x cp (or ZeRO-3's gathers) in place of the
//   proxy's own over cp, and the ZeRO shares, added from the cost model. ep cannot be expressed
//   with dp 1, so a shape with ep keeps one ep group: its proxy has dp = ep (every expert, and
//   the all-to-all that reaches it, as in the whole plan), and its ZeRO shares count the experts'
//   replicas (dp / ep x cp), not dp x cp, so a proxy never promises memory an expert rank lacks.
//   Proxies with cp or ep stay within tp's node times 32 stages ranks, the largest proxy without
//   them. The best `top` are then planned whole and ranked on their own estimates. What a proxy
//   does not see: a mixture's router statistics (its load-balancing loss) are all-reduced over
//   dp in every micro-batch, over the proxy's own ep ranks only on a proxy (nowhere with ep 1),
//   so mixtures' proxies underestimate those small all-reduces; the whole plans carry them.
#include "plan/auto_plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/training_state.h"
#include "lower/program.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "plan/plan_spec.h"

namespace loom::plan {
namespace {

// What a candidate is before its memory ladder: how the model is split and ordered.
struct Shape {
  std::string policy;  // hybrid, or the model's own (window, dap) of degree tp
  // world = dp x cp x tp x pp; ep is carved out of dp (it divides dp).
  int64_t dp = 1, cp = 1, ep = 1, tp = 1, pp = 1, chunks = 1, micro = 1;
  sched::ScheduleSpec schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
  bool sp = false;

  // The ranks a parameter outside the experts is replicated over: ZeRO shards over them.
  int64_t replicas() const { return dp * cp; }
};

// A rung of the memory ladder: recomputation and ZeRO level.
struct Rung {
  std::string recompute = "none";
  int64_t zero = 0;
};

// Recomputation levels in the order of what they cost (an extra forward of the attention
// cores, then of every layer).
const char* const kRecompute[] = {"none", "selective", "full"};

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

// What the model offers to split besides the batch, the layers and tensor-parallel dimensions.
struct ModelSplits {
  int64_t seq = 0;      // the sequence context parallelism may cut; 0: none (not a decoder)
  int64_t experts = 0;  // the routed experts expert parallelism may split; 0: a dense model
};

// A sequence this long (tokens) has context parallelism searched from the start. Below it a
// sample's activations are small next to the weights, so data, tensor and pipeline splits and
// recomputation bring a plan under the limit for less than a ring that sends key/value chunks in
// every attention layer, and cp would multiply the shapes only to add losers. The threshold is
// the planner's choice (where long-context training usually starts), not a measured crossover;
// shorter sequences still get cp when nothing fits without it (CpSearch::kFallback).
constexpr int64_t kLongSequence = 8192;
// Fewest tokens per context-parallel chunk in that search: a ring step's attention work grows
// with the chunk squared and its message only with the chunk, so short chunks leave the sends
// exposed; it also bounds cp by seq / 1024 (8 for 8192 tokens).
constexpr int64_t kMinCpChunk = 1024;

// Which context-parallel degrees a pass of skeletons takes.
enum class CpSearch {
  kLong,      // cp 1, and for a sequence of kLongSequence or more each cut of kMinCpChunk or more
  kFallback,  // the other cuts of the sequence (cp > 1): nothing kLong took fitted the memory
};

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
// parallelism (GPT, Llama), the routed experts of GPT's and Llama's mixtures. A model built by
// Registries::model is searched without either.
Result<ModelSplits> model_splits(const Config& config, const Registries& registries) {
  ModelSplits out;
  if (registries.model) return out;
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, registries.models.of(config));
  if (type->context_parallel && type->items) {
    LOOM_ASSIGN_OR_RETURN(const models::SampleItems items, type->items(config));
    out.seq = items.per_sample;
  }
  if (type->name == "gpt") {
    LOOM_ASSIGN_OR_RETURN(const models::GptSpec spec, models::gpt_spec(config));
    out.experts = spec.moe.experts;
  } else if (type->name == "llama") {
    LOOM_ASSIGN_OR_RETURN(const models::LlamaSpec spec, models::llama_spec(config));
    out.experts = spec.moe.experts;
  }
  return out;
}

// The search's state: the user's config, what is searched with.
struct Search {
  const Config& config;
  PlanSpec user;  // the user's config's spec, what a candidate's spec starts from
  const Registries& registries;
  const CostModel& cost;
  int64_t world = 0;
  double limit = 0;
  bool whole = true;               // plan each candidate whole; else on a data-parallel proxy
  double bytes_per_parameter = 0;  // weights, gradients and optimizer state (training_state_bytes)
  double parameters = 0;           // of the single-device model
  ModelSplits model;               // the sequence and experts cp and ep may split
  PlanCache* cache = nullptr;      // what the candidates' plans share (their models, searches)
};

enum class Outcome { kFits, kOverMemory, kInvalid };

// The data-parallel ranks a shape's proxy keeps: one replica, or under expert parallelism one ep
// group (ep is carved out of dp and cannot be expressed with dp 1; a proxy of ep replicas routes
// tokens to every expert as the whole plan does).
int64_t proxy_dp(const Shape& shape) { return shape.ep; }

// The first `n` ranks of a shape's replica axes (dp x cp, tensor-parallel position 0 of the
// first stage): a group the cost model can price an all-reduce over (planner/mesh.h's order).
std::vector<DeviceId> replica_group(const Shape& shape, int64_t n) {
  std::vector<DeviceId> group;
  for (int64_t j = 0; j < n; ++j) group.push_back(DeviceId(j * shape.tp));
  return group;
}

// A plan's figures under ZeRO level `zero`, from its figures at zero 0 (or, on a data-parallel
// proxy, from the proxy's). ZeRO shards over the ranks a parameter is replicated on, dp x cp as
// the lowering does: ZeRO 1 keeps 1/(dp cp) of the optimizer state, ZeRO 3 1/(dp cp) of
// weights, gradients and state. On a proxy the whole plan's gradient all-reduce over dp x cp
// replaces the proxy's own over its proxy_dp x cp (ZeRO 1 moves the same bytes as a
// reduce-scatter and an all-gather; ZeRO 3 gathers every parameter in each micro-batch's forward
// and again for its backward, and reduce-scatters its gradient: 1.5 all-reduces per
// micro-batch). Expert parameters are replicated over dp / ep x cp only: a proxy counts all
// gradients as if over dp x cp (the top candidates are planned whole before they are ranked),
// and shares ZeRO's memory over dp / ep x cp, which never promises an expert rank memory it
// lacks.
AutoCandidate at_zero(const Search& s, const Shape& shape, const Estimate& e, int64_t zero,
                      bool proxy) {
  const double shards =
      static_cast<double>(proxy && shape.ep > 1 ? shape.replicas() / shape.ep : shape.replicas());
  const std::vector<DeviceId> all = replica_group(shape, shape.replicas());
  const std::vector<DeviceId> proxied = replica_group(shape, proxy_dp(shape) * shape.cp);
  const double m = static_cast<double>(s.config.batch.global / (shape.dp * shape.micro));
  AutoCandidate c;
  c.bubble = e.bubble_ratio;
  for (const RankEstimate& r : e.ranks) {
    double comm = r.comm_s;
    if (proxy) {
      const double sync = all_reduce_seconds(s.cost, all, r.grad_bytes);
      comm +=
          (zero == 3 ? 1.5 * m * sync : sync) - all_reduce_seconds(s.cost, proxied, r.grad_bytes);
    }
    double peak = r.peak_bytes;
    if (zero == 1) peak -= r.optimizer_bytes * (1 - 1 / shards);
    if (zero == 3) peak -= (r.param_bytes + r.grad_bytes + r.optimizer_bytes) * (1 - 1 / shards);
    c.peak_bytes = std::max(c.peak_bytes, peak);
    if (r.compute_s + comm > c.step_s) {
      c.step_s = r.compute_s + comm;
      c.compute_s = r.compute_s;
      c.comm_s = comm;
    }
  }
  return c;
}

// A shape's memory ladder: for each recomputation level, its plan at ZeRO 0 (on a proxy: one
// replica's) tells which ZeRO level fits; ZeRO 0 and 1 are tried at every level before ZeRO 3,
// whose gathers cost more than recomputation. On whole plans a rung other than the one planned
// is planned too, and counts only if its own estimate fits.
Outcome ladder(const Search& s, const Shape& shape, AutoCandidate& out, int64_t& planned) {
  const int64_t global = s.config.batch.global;
  // Weights, gradients and state over every rank at best (ZeRO 3 over dp x cp): a floor no rung
  // goes under.
  const double floor = s.parameters * s.bytes_per_parameter /
                       static_cast<double>(shape.tp * shape.pp * shape.replicas());
  if (floor > s.limit) return Outcome::kOverMemory;
  Shape planned_shape = shape;
  int64_t ranks = s.world;
  int64_t planned_global = global;
  if (!s.whole) {  // one replica (one ep group), the same micro-batches per replica
    planned_shape.dp = proxy_dp(shape);
    planned_global = global / shape.dp * planned_shape.dp;
    ranks = planned_shape.dp * shape.cp * shape.tp * shape.pp;
  }
  std::map<std::string, Result<Plan>> base;  // recompute level -> its plan at ZeRO 0
  auto plan_of = [&](const std::string& recompute) -> const Result<Plan>& {
    auto it = base.find(recompute);
    if (it != base.end()) return it->second;
    const Config config =
        with_spec(s.config, spec_of(s.user, planned_shape, {recompute, 0}, planned_global));
    ++planned;
    // A proxy's plan is estimated and dropped: the proofs are left to the whole plans kept.
    PlanProofs proofs;
    proofs.verify_graph = proofs.deadlock_free = proofs.equivalent = s.whole;
    Result<Plan> plan = make_plan(config, s.registries, s.cost, ranks, proofs, s.cache);
    return base.emplace(recompute, std::move(plan)).first->second;
  };
  bool any_valid = false;
  for (const std::vector<int64_t>& zeros : {std::vector<int64_t>{0, 1}, std::vector<int64_t>{3}})
    for (const char* recompute : kRecompute) {
      const Result<Plan>& plan = plan_of(recompute);
      if (!plan.ok()) {
        if (!any_valid) return Outcome::kInvalid;
        continue;
      }
      any_valid = true;
      for (int64_t zero : zeros) {
        if (!zero_applies(shape, zero)) continue;
        AutoCandidate c = at_zero(s, shape, plan->estimate, zero, !s.whole);
        if (c.peak_bytes > s.limit) continue;
        const Rung rung{recompute, zero};
        if (s.whole && zero != 0) {  // its own plan, its own figures
          const Config config = with_spec(s.config, spec_of(s.user, shape, rung, global));
          ++planned;
          auto exact = make_plan(config, s.registries, s.cost, s.world, {}, s.cache);
          if (!exact.ok()) continue;
          c = figures(exact->estimate);
          if (c.peak_bytes > s.limit) continue;
        }
        c.overrides = overrides_of(shape, rung, global);
        c.spec = spec_of(s.user, shape, rung, global);
        c.label = label_of(shape, rung);
        c.whole = s.whole;
        out = std::move(c);
        return Outcome::kFits;
      }
    }
  return any_valid ? Outcome::kOverMemory : Outcome::kInvalid;
}

// Runs `work(i)` for i in [0, n) on `threads` threads.
void parallel_for(int64_t n, int64_t threads, const std::function<void(int64_t)>& work) {
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t i = next++; i < n; i = next++) work(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
}

bool faster(const AutoCandidate& a, const AutoCandidate& b) {
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  return a.label < b.label;
}

}  // namespace

namespace {

// Each shape's memory ladder, in parallel: the fitting ones join `fits` (fastest first); the
// counts of `result` grow by the shapes tried.
void search_shapes(const Search& s, const std::vector<Shape>& shapes, int64_t threads,
                   std::atomic<int64_t>& planned, AutoPlan& result,
                   std::vector<AutoCandidate>& fits) {
  std::vector<Outcome> outcome(shapes.size(), Outcome::kInvalid);
  std::vector<AutoCandidate> found(shapes.size());
  // The shapes with the most ranks to plan (the most work) start first, so that the threads
  // finish together rather than one planning the largest alone at the end; the outcomes keep
  // the shapes' order.
  std::vector<size_t> by_work(shapes.size());
  for (size_t k = 0; k < by_work.size(); ++k) by_work[k] = k;
  std::stable_sort(by_work.begin(), by_work.end(), [&](size_t a, size_t b) {
    const Shape &x = shapes[a], &y = shapes[b];
    return x.cp * x.ep * x.tp * x.pp > y.cp * y.ep * y.tp * y.pp;
  });
  parallel_for(static_cast<int64_t>(shapes.size()), threads, [&](int64_t i) {
    int64_t made = 0;
    const size_t k = by_work[static_cast<size_t>(i)];
    outcome[k] = ladder(s, shapes[k], found[k], made);
    planned += made;
  });
  for (size_t k = 0; k < shapes.size(); ++k) {
    ++result.considered;
    result.with_cp += shapes[k].cp > 1;
    result.with_ep += shapes[k].ep > 1;
    if (outcome[k] == Outcome::kFits) fits.push_back(found[k]);
    result.over_memory += outcome[k] == Outcome::kOverMemory;
    result.invalid += outcome[k] == Outcome::kInvalid;
  }
  std::sort(fits.begin(), fits.end(), faster);
}

// Every schedule (and tp without sp) of the best `expand` skeletons that fit.
std::vector<Shape> expansions(const std::vector<Shape>& skeletons,
                              const std::vector<AutoCandidate>& fits, int64_t expand,
                              int64_t global) {
  std::map<std::string, Shape> by_label;
  for (const Shape& shape : skeletons) by_label[label_of(shape, {})] = shape;
  std::vector<Shape> out;
  int64_t expanded = 0;
  for (const AutoCandidate& c : fits) {
    if (expanded == expand) break;
    std::string base = c.label.substr(0, c.label.find(" recompute"));
    base = base.substr(0, base.find(" zero"));
    auto it = by_label.find(base);
    if (it == by_label.end()) continue;
    for (const Shape& v : variants(it->second, global)) out.push_back(v);
    ++expanded;
  }
  return out;
}

// One pass of the search: its skeletons first, then every schedule (and tp without sp) of the
// best of them.
void search_pass(const Search& s, CpSearch cp_search, const AutoOptions& options, int64_t threads,
                 std::atomic<int64_t>& planned, AutoPlan& result,
                 std::vector<AutoCandidate>& fits) {
  const std::vector<Shape> first =
      skeletons(s.config, s.registries, s.cost, s.model, cp_search, s.world, s.whole);
  search_shapes(s, first, threads, planned, result, fits);
  search_shapes(s, expansions(first, fits, options.expand, s.config.batch.global), threads, planned,
                result, fits);
}

// The best `top` proxies planned whole and ranked on their own estimates (those over the limit
// dropped); the fastest one's plan is kept so the winner is not planned twice. They are planned
// without make_plan's proofs, which only the plan kept needs (auto_plan proves it): the proofs
// change no figure, and at a thousand ranks the deadlock check is the largest part of a plan.
struct WholeRanking {
  std::vector<AutoCandidate> ranked;
  std::optional<Plan> best_plan;
  AutoCandidate best;
  // The first proxy's whole plan, proved by the thread that made it while the others plan the
  // rest: the proxies' favourite usually stays first, and its proof is then off the critical
  // path. Unset when that plan was not made.
  std::optional<std::string> first_label;
  Status first_proved;
};
WholeRanking rank_whole(const Search& s, const std::vector<AutoCandidate>& proxies, int64_t top,
                        int64_t threads, std::atomic<int64_t>& planned) {
  WholeRanking out;
  std::mutex lock;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(proxies.size()), top);
  // Candidates differing only in schedule, recomputation or ZeRO 1 share a lowering (PlanCache):
  // one of each layout is planned first, so that no thread waits for a lowering another makes
  // while there is a layout left to lower.
  std::vector<int64_t> order, later;
  std::set<std::vector<std::pair<std::string, std::string>>> layouts;
  for (int64_t i = 0; i < n; ++i) {
    PlanSpec layout = proxies[static_cast<size_t>(i)].spec;
    layout.schedule = sched::ScheduleSpec::predefined(sched::ScheduleKind::k1F1B);
    layout.recompute = lower::Recompute::kNone;
    layout.zero = 0;
    (layouts.insert(layout.plan_fields()).second ? order : later).push_back(i);
  }
  order.insert(order.end(), later.begin(), later.end());
  parallel_for(n, threads, [&](int64_t task) {
    const int64_t i = order[static_cast<size_t>(task)];
    const AutoCandidate& proxy = proxies[static_cast<size_t>(i)];
    const Config c = with_spec(s.config, proxy.spec);
    PlanProofs unproved;
    unproved.verify_graph = unproved.deadlock_free = unproved.equivalent = false;
    auto plan = make_plan(c, s.registries, s.cost, s.world, unproved, s.cache);
    ++planned;
    if (!plan.ok()) return;
    if (i == 0) {  // only this thread writes these, read after parallel_for joins it
      out.first_label = proxy.label;
      out.first_proved = prove(*plan, s.registries);
    }
    AutoCandidate w = figures(plan->estimate);
    if (w.peak_bytes > s.limit) return;
    w.overrides = proxy.overrides;
    w.spec = proxy.spec;
    w.label = proxy.label;
    w.whole = true;
    std::lock_guard<std::mutex> guard(lock);
    if (!out.best_plan || faster(w, out.best)) {
      out.best = w;
      out.best_plan = std::move(*plan);
    }
    out.ranked.push_back(std::move(w));
  });
  std::sort(out.ranked.begin(), out.ranked.end(), faster);
  return out;
}

}  // namespace

Result<AutoPlan> auto_plan(const Config& config, const Registries& registries,
                           const CostModel& cost, int64_t world_size, const AutoOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  AutoPlan result;
  LOOM_ASSIGN_OR_RETURN(const PlanSpec asked, PlanSpec::of(config));
  result.memory_limit_bytes =
      asked.memory_limit_gb > 0 ? asked.memory_limit_gb * 1e9 : cost.device_memory_bytes;
  Search s{config,
           asked,
           registries,
           cost,
           world_size,
           result.memory_limit_bytes,
           world_size <= options.exact_ranks,
           0,
           0,
           {},
           nullptr};
  PlanCache cache;
  s.cache = &cache;
  s.bytes_per_parameter = training_state_bytes(asked.optimizer).total();
  LOOM_ASSIGN_OR_RETURN(s.model, model_splits(config, registries));
  {
    LOOM_ASSIGN_OR_RETURN(const graph::Graph model, build_model(config, registries, 1));
    for (const auto& t : model.tensors())
      if (t.role == graph::TensorRole::kParameter)
        s.parameters += static_cast<double>(numel(t.shape));
  }
  const int64_t threads = options.threads > 0
                              ? options.threads
                              : std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::atomic<int64_t> planned{0};
  std::vector<AutoCandidate> fits;
  search_pass(s, CpSearch::kLong, options, threads, planned, result, fits);
  // Nothing fits without cutting the sequence (or into long chunks): the other cuts.
  if (fits.empty()) search_pass(s, CpSearch::kFallback, options, threads, planned, result, fits);
  // Proxies rank the candidates; the best are planned whole and ranked on their own estimates.
  WholeRanking whole;
  if (!s.whole) {
    whole = rank_whole(s, fits, options.top, threads, planned);
    fits = whole.ranked;
  }
  result.planned = planned;
  if (fits.empty() && result.over_memory == 0)
    return config.error(
        "parallel.policy",
        "auto found no way to split this model over " + std::to_string(world_size) +
            " ranks: none of the " + std::to_string(result.considered) +
            " shapes whose degrees multiply to " + std::to_string(world_size) +
            " fits the model (the degrees must divide its heads, layers, experts and the "
            "batch); run on a number of ranks the model divides, e.g. a power of two");
  if (fits.empty())
    return config.error("parallel.memory_limit_gb",
                        "no plan of " + std::to_string(world_size) + " ranks fits " +
                            human_bytes(result.memory_limit_bytes) + " per device (" +
                            std::to_string(result.considered) +
                            " shapes: " + std::to_string(result.over_memory) +
                            " over the limit at every rung of recomputation and ZeRO, " +
                            std::to_string(result.invalid) + " not possible for this model)");
  if (static_cast<int64_t>(fits.size()) > options.top)
    fits.resize(static_cast<size_t>(options.top));
  result.top = fits;
  result.config = with_spec(config, fits[0].spec);
  for (const std::string& o : fits[0].overrides) {
    result.config.overrides.push_back(o);
    result.config.where_[o.substr(0, o.find('='))] = "parallel.policy auto (" + o + ")";
  }
  if (whole.best_plan && whole.best.label == fits[0].label) {
    result.plan = std::move(*whole.best_plan);
    if (whole.first_label == fits[0].label) {
      LOOM_TRY(whole.first_proved);
    } else {
      LOOM_TRY(prove(result.plan, registries));  // ranked unproved (rank_whole)
    }
  } else {
    LOOM_ASSIGN_OR_RETURN(result.plan,
                          make_plan(result.config, registries, cost, world_size, {}, &cache));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Result<AutoCandidate> plan_within_memory(const Config& config, const Registries& registries,
                                         const CostModel& cost, int64_t world_size) {
  LOOM_ASSIGN_OR_RETURN(const PlanSpec spec, PlanSpec::of(config));
  Search s{
      config,     spec,
      registries, cost,
      world_size, spec.memory_limit_gb > 0 ? spec.memory_limit_gb * 1e9 : cost.device_memory_bytes,
      true,       0,
      0,          {},
      nullptr};
  const planner::DeviceMesh& mesh = spec.mesh();
  Shape shape;
  shape.policy = spec.space.policy;
  shape.tp = mesh.tp();
  shape.pp = mesh.pp();
  shape.cp = mesh.cp();
  shape.ep = spec.space.ep;
  shape.dp = world_size / (shape.tp * shape.pp * shape.cp);
  shape.chunks = spec.space.chunks;
  shape.micro = spec.batch.micro;
  shape.schedule = spec.schedule;
  shape.sp = spec.space.sp;
  PlanCache cache;  // the rungs share the model and, with their recomputation, the search
  s.cache = &cache;
  AutoCandidate c;
  int64_t planned = 0;
  switch (ladder(s, shape, c, planned)) {
    case Outcome::kFits:
      return c;
    case Outcome::kOverMemory:
      return config.error("parallel.memory_limit_gb",
                          "no rung of recomputation and ZeRO fits " + human_bytes(s.limit));
    case Outcome::kInvalid:
      break;
  }
  auto plan = make_plan(config, registries, cost, world_size);  // says why it is not possible
  if (!plan.ok()) return plan.error();
  return config.error("parallel", "not a plan the search would make");
}

std::string describe(const AutoPlan& r) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "parallel.policy auto: %lld shapes of %lld ranks (%lld plans made, %lld over %s "
                "per device at every rung of recomputation and ZeRO, %lld not possible) in %.1f "
                "s\n",
                static_cast<long long>(r.considered), static_cast<long long>(r.plan.world_size()),
                static_cast<long long>(r.planned), static_cast<long long>(r.over_memory),
                human_bytes(r.memory_limit_bytes).c_str(), static_cast<long long>(r.invalid),
                r.seconds);
  os << line;
  if (r.with_cp > 0 || r.with_ep > 0)
    os << "  of the shapes, " << r.with_cp << " with context parallelism (cp > 1), " << r.with_ep
       << " with expert parallelism (ep > 1)\n";
  os << "  #  plan                                                est. step   peak/rank   bubble  "
        "comm/step\n";
  for (size_t i = 0; i < r.top.size(); ++i) {
    const AutoCandidate& c = r.top[i];
    std::snprintf(line, sizeof line, "%3zu  %-50s  %10s  %10s  %6.3f  %10s\n", i + 1,
                  c.label.c_str(), human_seconds(c.step_s).c_str(),
                  human_bytes(c.peak_bytes).c_str(), c.bubble, human_seconds(c.comm_s).c_str());
    os << line;
  }
  const AutoCandidate& w = r.top[0];
  os << "chosen: " << w.label;
  if (r.top.size() > 1) {
    const AutoCandidate& n = r.top[1];
    std::snprintf(line, sizeof line,
                  ", %.1f %% faster than #2: bubble %.3f vs %.3f, compute %s vs %s, "
                  "communication %s vs %s, peak %s vs %s of %s",
                  100 * (n.step_s - w.step_s) / n.step_s, w.bubble, n.bubble,
                  human_seconds(w.compute_s).c_str(), human_seconds(n.compute_s).c_str(),
                  human_seconds(w.comm_s).c_str(), human_seconds(n.comm_s).c_str(),
                  human_bytes(w.peak_bytes).c_str(), human_bytes(n.peak_bytes).c_str(),
                  human_bytes(r.memory_limit_bytes).c_str());
    os << line;
  }
  os << "\n";
  return os.str();
}

}  // namespace loom::plan
