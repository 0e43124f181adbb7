// bench/model_plans (Evoformer rows): the AlphaFold2 Evoformer at paper size (48 blocks, crop
// 256, 128 sequences) planned and lowered for 8 and 16 virtual devices under data parallelism,
// Megatron-style tensor parallelism (the hybrid policy on the linears' `tp` hints), pipeline
// parallelism over blocks and dynamic axial parallelism. For each plan: the estimated step time
// and time per sample (forward + backward FLOPs at an effective device rate, plus the cost of
// every communication step the lowering inserted, from the path search's alpha-beta model) and
// the estimated peak memory of the fullest rank (parameters, gradients, AdamW moments and the
// activations in flight, as `loom plan` counts them). Ratios are against dp in the same run.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "exec/lower/program.h"
#include "exec/lower/schedule_order.h"
#include "models/model.h"
#include "planner/cost.h"

namespace {

using namespace loom;

constexpr double kDeviceFlops = 100e12;  // effective FLOP/s of one GPU on these kernels

struct Estimate {
  double step_s = 0;
  double samples = 1;
  double peak_bytes = 0;
  double compute_s = 0, comm_s = 0;  // the slowest rank's, per micro-batch
};

bool member(const lower::CommStep& s, int64_t rank) {
  for (const auto& g : s.groups)
    for (DeviceId d : g)
      if (d.value() == rank) return true;
  return false;
}

Result<Estimate> estimate(const std::vector<std::string>& overrides, int64_t world) {
  auto c = parse_config(
      "model: {type: evoformer, preset: alphafold2}\n"
      "optimizer: {type: adamw}\n",
      "bench.yaml", overrides);
  if (!c.ok()) return c.error();
  LOOM_ASSIGN_OR_RETURN(
      graph::Graph g, models::build_plan(*c, graph::OpRegistry::with_builtin_ops(),
                                         planner::PolicyRegistry::with_builtin_policies(), world));
  const int64_t m = c->micro_batches();
  LOOM_ASSIGN_OR_RETURN(auto order, lower::pipeline_order(*c, m));
  lower::PathFinder paths;
  LOOM_ASSIGN_OR_RETURN(lower::Lowered l,
                        lower::lower(g, world, m, paths, order.empty() ? nullptr : &order));

  const size_t n = static_cast<size_t>(world);
  std::vector<double> flops(n, 0), comm_s(n, 0), params(n, 0), acts(n, 0);
  std::vector<std::set<std::string>> seen(n);
  for (const auto& op : g.ops()) {
    const size_t r = static_cast<size_t>(op.device.value());
    flops[r] += 3 * planner::op_flops(op);  // backward ~ twice the forward
    acts[r] += planner::op_output_bytes(g, op);
    for (const auto& in : op.inputs) {
      const auto& t = g.tensor(in.tensor);
      if (t.role == graph::TensorRole::kParameter &&
          seen[r].insert(t.name + in.ranges_string()).second)
        params[r] += static_cast<double>(numel(in.shape()));
    }
  }
  const lower::CostModel cost;
  for (int64_t r = 0; r < world; ++r) {
    for (const auto& a : l.adapters)
      for (const auto* path : {&a.forward, &a.backward})
        for (const auto& s : path->steps)
          if (member(s, r)) comm_s[static_cast<size_t>(r)] += s.cost_s;
    // Gradients are synchronised in buckets: one all-reduce per device group, its bytes summed.
    std::map<std::vector<int64_t>, double> buckets;
    for (int64_t id : l.programs[static_cast<size_t>(r)].grad_syncs) {
      const auto& sync = l.grad_syncs[static_cast<size_t>(id)];
      std::vector<int64_t> group;
      for (DeviceId d : sync.devices) group.push_back(d.value());
      buckets[group] += static_cast<double>(numel(sync.piece.shape()) * 4);
    }
    for (const auto& [group, bytes] : buckets) {
      const double k = static_cast<double>(group.size());
      const bool one_node =
          group.front() / cost.devices_per_node == group.back() / cost.devices_per_node;
      const double alpha = one_node ? cost.intra_alpha_s : cost.inter_alpha_s;
      const double beta = one_node ? cost.intra_beta_s_per_byte : cost.inter_beta_s_per_byte;
      comm_s[static_cast<size_t>(r)] +=
          (2 * (k - 1) * alpha + 2 * (k - 1) / k * bytes * beta) / static_cast<double>(m);
    }
  }
  // Per micro-batch, each rank computes and communicates in turn (no overlap assumed); a
  // pipeline adds (pp - 1) micro-batch slots of its slowest stage, and its first stage holds
  // min(pp, m) micro-batches of activations under 1F1B.
  const int64_t pp = c->parallel.pp;
  double slot = 0;
  Estimate e;
  for (size_t r = 0; r < n; ++r) {
    if (flops[r] / kDeviceFlops + comm_s[r] > slot) {
      slot = flops[r] / kDeviceFlops + comm_s[r];
      e.compute_s = flops[r] / kDeviceFlops;
      e.comm_s = comm_s[r];
    }
    const double in_flight = static_cast<double>(std::min<int64_t>(pp, m));
    e.peak_bytes = std::max(e.peak_bytes, params[r] * 4 * 4 + acts[r] * in_flight);
  }
  e.step_s = slot * static_cast<double>(m + pp - 1);
  e.samples = static_cast<double>(c->batch.global);
  return e;
}

double gib(double b) { return b / (1024.0 * 1024 * 1024); }

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::vector<int64_t> worlds = quick ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 16};
  std::printf(
      "bench/model_plans: AlphaFold2 Evoformer (48 blocks, crop 256, 128 sequences), one "
      "sample per micro-batch, estimates at %.0f TFLOP/s per device\n",
      kDeviceFlops / 1e12);
  std::printf("%-6s %-8s %8s %10s %10s %10s %12s %10s %10s %10s\n", "ranks", "plan", "samples",
              "compute", "comm", "step (s)", "s / sample", "vs dp", "peak GiB", "vs dp");
  for (int64_t w : worlds) {
    const std::string ws = std::to_string(w);
    std::vector<std::pair<std::string, std::vector<std::string>>> plans = {
        {"dp" + ws,
         {"parallel.policy=dp", "parallel.dp=" + ws, "batch.global=" + ws, "batch.micro=1"}},
        {"tp" + ws, {"parallel.policy=tp", "parallel.tp=" + ws, "batch.global=1", "batch.micro=1"}},
        {"pp" + ws,
         {"parallel.policy=pp", "parallel.pp=" + ws, "batch.global=" + ws, "batch.micro=1"}},
        {"dap" + ws,
         {"parallel.policy=dap", "parallel.tp=" + ws, "batch.global=1", "batch.micro=1"}},
    };
    // Past one node: DAP inside each node, pipeline stages across nodes.
    if (w > 8)
      plans.push_back(
          {"dap8pp" + std::to_string(w / 8),
           {"parallel.policy=dap", "parallel.tp=8", "parallel.pp=" + std::to_string(w / 8),
            "batch.global=" + ws, "batch.micro=1"}});
    Estimate base;
    for (const auto& [name, overrides] : plans) {
      auto e = estimate(overrides, w);
      if (!e.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), e.error().message.c_str());
        return 1;
      }
      if (name.rfind("dp", 0) == 0) base = *e;
      const double per_sample = e->step_s / e->samples;
      std::printf("%-6lld %-8s %8.0f %10.3f %10.3f %10.3f %12.4f %9.2fx %10.2f %9.2fx\n",
                  static_cast<long long>(w), name.c_str(), e->samples, e->compute_s, e->comm_s,
                  e->step_s, per_sample, per_sample / (base.step_s / base.samples),
                  gib(e->peak_bytes), e->peak_bytes / base.peak_bytes);
      std::fflush(stdout);
    }
  }
  return 0;
}
