// Recomputed regions (parallel.recompute, lower/recompute.h): a region's forward runs as
// one autograd function that keeps only what the region reads from outside; its backward runs
// the region again with recording on and differentiates that.
#include "lower/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "runtime/executor_impl.h"

namespace loom::runtime {
namespace {

using lower::Adapter;
using Source = Executor::Impl::Source;
using ForwardStep = Executor::Impl::ForwardStep;
using Value = Executor::Impl::Value;
using Region = Executor::Impl::Region;

// What region `r` (forward steps [begin, end) of segment `g`) reads from outside and makes for
// outside: the values its recomputation starts from and the ones it hands on.
void add_region_values(const Executor::Impl& s, size_t g, size_t region, Region& r) {
  const auto& steps = s.forward_steps[g];
  const auto& ops = s.graph.ops();
  std::set<Value> made, read;
  auto read_source = [&](const Source& src) {
    switch (src.kind) {
      case Source::Kind::kInput:
        return;  // cut again from the micro-batch's inputs
      case Source::Kind::kParameter:
        read.insert({Value::Kind::kParameter, src.index});
        return;
      case Source::Kind::kAdapter:
        read.insert({Value::Kind::kAdapted, src.index});
        return;
      case Source::Kind::kSameStage:
        read.insert({Value::Kind::kEnv, src.index});
        return;
      case Source::Kind::kStageLeaf:
        read.insert({Value::Kind::kLeaf, src.index});
        return;
    }
  };
  for (size_t i = r.begin; i < r.end; ++i) {
    const ForwardStep& step = steps[i];
    if (step.adapter) {
      const Adapter& a = s.lowered.adapters[static_cast<size_t>(step.adapter->index)];
      LOOM_CHECK(!step.adapter->producer_side && !a.disjoint && !a.cross_stage())
          << "a recomputed region may only hold adapters within its stage's ranks";
      if (a.parameter)  // gathered from this rank's shard (param_gather.cc)
        read.insert({Value::Kind::kParameter, s.shard_slot.at(a.id)});
      else
        read.insert({Value::Kind::kEnv, a.tensor.value()});
      made.insert({Value::Kind::kAdapted, a.id});
      continue;
    }
    LOOM_CHECK(!step.makes_loss) << "a recomputed region makes the loss";
    for (const Source& src : step.sources) read_source(src);
    if (step.gathered >= 0) read.insert({Value::Kind::kAdapted, step.gathered});
    if (step.fused_bias >= 0) read_source(step.bias);
    const graph::Op& last =
        ops[step.fused_bias >= 0 ? static_cast<size_t>(step.fused_bias) : step.op];
    for (const auto& out : last.outputs) made.insert({Value::Kind::kEnv, out.tensor.value()});
  }
  for (const Value& v : read)
    if (!made.count(v)) r.inputs.push_back(v);
  // What readers outside the region take from it (lower/recompute.h: the estimate counts the
  // same values).
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  const lower::RegionBorder border =
      lower::region_border(s.graph, s.lowered, prog, g, prog.segments[g].recompute[region]);
  std::set<Value> wanted;
  for (int64_t t : border.tensors) wanted.insert({Value::Kind::kEnv, t});
  for (int64_t a : border.adapters) wanted.insert({Value::Kind::kAdapted, a});
  for (const Value& v : made)
    if (wanted.count(v)) r.outputs.push_back(v);
}

}  // namespace

void plan_regions(Executor::Impl& s) {
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  s.regions.resize(prog.segments.size());
  s.region_start.resize(prog.segments.size());
  for (size_t g = 0; g < prog.segments.size(); ++g) {
    const auto& steps = s.forward_steps[g];
    s.region_start[g].assign(steps.size(), -1);
    for (const lower::RecomputeRegion& marked : prog.segments[g].recompute) {
      Region r;
      auto first_at = [&](int64_t item) {
        size_t i = 0;
        while (i < steps.size() && steps[i].item < item) ++i;
        return i;
      };
      r.begin = first_at(marked.begin);
      r.end = first_at(marked.end);
      LOOM_CHECK(r.begin < r.end && r.begin < steps.size())
          << "rank " << s.rank << ": recompute region [" << marked.begin << ", " << marked.end
          << ") holds no forward step";
      add_region_values(s, g, s.regions[g].size(), r);
      s.region_start[g][r.begin] = static_cast<int64_t>(s.regions[g].size());
      s.regions[g].push_back(std::move(r));
    }
  }
}

namespace {

// What a recomputed region of one micro-batch keeps for its backward: the values it reads from
// outside, in Region::inputs order.
struct Checkpoint {
  Executor::Impl* s = nullptr;
  size_t segment = 0, region = 0;
  int64_t mb = 0;
  const Inputs* inputs = nullptr;
  std::vector<at::Tensor> values;
};

// Runs the region on `values` (its inputs) in a scratch micro-batch and returns what it hands
// on, in Region::outputs order. Nothing else it makes outlives the call.
std::vector<at::Tensor> replay(const Checkpoint& cp, const std::vector<at::Tensor>& values) {
  Executor::Impl& s = *cp.s;
  const Region& r = s.regions[cp.segment][cp.region];
  Executor::Impl::Micro local;
  local.env.resize(s.graph.tensors().size());
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const Value& v = r.inputs[i];
    switch (v.kind) {
      case Value::Kind::kEnv:
        local.env[static_cast<size_t>(v.index)] = values[i];
        break;
      case Value::Kind::kAdapted:
        local.adapted[v.index] = values[i];
        break;
      case Value::Kind::kLeaf:
        local.leaves[v.index] = values[i];
        break;
      case Value::Kind::kParameter:
        local.params[v.index] = values[i];
        break;
    }
  }
  run_steps(s, local, cp.segment, r.begin, r.end, cp.mb, *cp.inputs);
  std::vector<at::Tensor> out;
  for (const Value& v : r.outputs) {
    at::Tensor t = v.kind == Value::Kind::kEnv ? local.env[static_cast<size_t>(v.index)]
                                               : local.adapted.at(v.index);
    LOOM_CHECK(t.defined()) << "a recomputed region did not make what it hands on";
    // An autograd function's output must not be a view of something it made and dropped.
    out.push_back(t.is_view() ? t.clone() : t);
  }
  return out;
}

// A region as one autograd function: its forward runs without recording (keeping only its
// inputs); its backward runs the region again with recording on and differentiates that.
struct RegionFn : public torch::autograd::Function<RegionFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs, int64_t checkpoint) {
    ctx->saved_data["checkpoint"] = checkpoint;
    const auto& cp = *reinterpret_cast<const Checkpoint*>(checkpoint);
    return replay(cp, std::vector<at::Tensor>(inputs.begin(), inputs.end()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& cp = *reinterpret_cast<Checkpoint*>(ctx->saved_data["checkpoint"].toInt());
    std::vector<at::Tensor> values;
    for (const at::Tensor& v : cp.values)
      values.push_back(v.requires_grad() ? v.detach().requires_grad_(true) : v.detach());
    torch::autograd::variable_list out(values.size() + 1);
    {
      at::AutoGradMode recording(true);
      std::vector<at::Tensor> outs = replay(cp, values), roots, seeds, wrt;
      for (size_t i = 0; i < outs.size(); ++i)
        if (grads[i].defined() && outs[i].requires_grad()) {
          roots.push_back(outs[i]);
          seeds.push_back(grads[i]);
        }
      std::vector<size_t> wrt_index;
      for (size_t i = 0; i < values.size(); ++i)
        if (values[i].requires_grad()) {
          wrt.push_back(values[i]);
          wrt_index.push_back(i);
        }
      if (!roots.empty() && !wrt.empty()) {
        auto g = torch::autograd::grad(roots, wrt, seeds, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t k = 0; k < g.size(); ++k) out[wrt_index[k]] = g[k];
      }
    }
    cp.values.clear();  // the checkpoint is spent
    return out;
  }
};

// The value `v` of the micro-batch's forward so far (a stage leaf is made on first read).
at::Tensor fetch(Executor::Impl& s, Executor::Impl::Micro& m, const Value& v) {
  switch (v.kind) {
    case Value::Kind::kEnv:
      return s.value(m, v.index);
    case Value::Kind::kAdapted:
      return m.adapted.at(v.index);
    case Value::Kind::kLeaf: {
      auto& leaf = m.leaves[v.index];
      if (!leaf.defined()) leaf = s.value(m, v.index).detach().requires_grad_(true);
      return leaf;
    }
    case Value::Kind::kParameter:
      return s.compute_params[static_cast<size_t>(v.index)];
  }
  return at::Tensor();
}

}  // namespace

void run_region(Executor::Impl& s, Executor::Impl::Micro& m, size_t segment, size_t region,
                int64_t mb, const Inputs& inputs) {
  const Region& r = s.regions[segment][region];
  auto cp = std::make_shared<Checkpoint>();
  cp->s = &s;
  cp->segment = segment;
  cp->region = region;
  cp->mb = mb;
  cp->inputs = &inputs;
  for (const Value& v : r.inputs) cp->values.push_back(fetch(s, m, v));
  const std::vector<at::Tensor> outs =
      RegionFn::apply(at::TensorList(cp->values), reinterpret_cast<int64_t>(cp.get()));
  m.checkpoints.push_back(std::move(cp));
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const Value& v = r.outputs[i];
    if (v.kind == Value::Kind::kEnv)
      m.env[static_cast<size_t>(v.index)] = outs[i];
    else
      m.adapted[v.index] = outs[i];
  }
}

}  // namespace loom::runtime
