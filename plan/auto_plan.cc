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
#include "plan/auto_plan_parts.h"
#include "plan/plan_spec.h"

namespace loom::plan {
namespace {

using namespace auto_detail;

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
