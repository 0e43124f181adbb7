#include "lower/equivalence.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "core/strings.h"
#include "lower/equivalence_parts.h"
#include "lower/grad_bucketing.h"
#include "lower/region.h"

namespace loom::lower {

namespace proof {

std::string adapter_name(const graph::Graph& g, const Adapter& a) {
  return std::string(a.parameter ? "the gather of parameter '" : "the adapter of '") +
         g.tensor(a.tensor).name + "' for " + join(a.consumers, ", ");
}

Error rank_error(int64_t rank, const std::string& why) {
  return Error::at("rank " + std::to_string(rank), "rank " + std::to_string(rank) + ": " + why);
}

}  // namespace proof

namespace {

using proof::adapter_name;
using proof::rank_error;

using graph::Range;
using graph::SubTensor;

std::string devices_string(const std::vector<DeviceId>& ds) {
  std::vector<std::string> parts;
  for (DeviceId d : ds) parts.push_back(std::to_string(d.value()));
  return "[" + join(parts, ",") + "]";
}

bool holds(const Layout& l, int64_t d) {
  return std::any_of(l.devices.begin(), l.devices.end(),
                     [&](DeviceId x) { return x.value() == d; });
}
int64_t position(const Layout& l, int64_t d) {
  for (size_t p = 0; p < l.devices.size(); ++p)
    if (l.devices[p].value() == d) return static_cast<int64_t>(p);
  return -1;
}

// Per activation (and loss) tensor, the (rank, piece) pairs its ops write.
using Writers = std::unordered_map<int64_t, std::vector<std::pair<int64_t, const SubTensor*>>>;
Writers writers_of(const graph::Graph& g) {
  Writers out;
  for (const graph::Op& op : g.ops())
    for (const SubTensor& o : op.outputs) {
      auto& list = out[o.tensor.value()];
      bool seen = false;
      for (const auto& [d, s] : list) seen |= d == op.device.value() && *s == o;
      if (!seen) list.push_back({op.device.value(), &o});
    }
  return out;
}

// Runs `path` from `state`, naming the adapter, direction and step on failure.
Status run_path(const graph::Graph& g, const Adapter& a, const CommPath& path, bool forward,
                DeviceRegions& state) {
  for (size_t i = 0; i < path.steps.size(); ++i) {
    Status s = run_step(path.steps[i], state);
    if (!s.ok())
      return Error::at(g.tensor(a.tensor).name,
                       adapter_name(g, a) + ", step " + std::to_string(i) + " of its " +
                           (forward ? "forward" : "gradient") + " path: " + s.error().message);
  }
  return Status::success();
}

// The regions the adapter starts from: a parameter's pieces as its producers' layout places
// them, or the pieces the ops write, which must be what that layout says.
Status producer_regions(const graph::Graph& g, const Adapter& a, const Writers& writers,
                        DeviceRegions& state) {
  const graph::FullTensor& t = g.tensor(a.tensor);
  const std::string name = adapter_name(g, a);
  if (a.parameter) {
    for (size_t p = 0; p < a.from.devices.size(); ++p)
      state.set(a.from.devices[p].value(),
                Region::of(a.from.piece(static_cast<int64_t>(p), a.tensor, t.shape)));
    return Status::success();
  }
  const auto w = writers.find(a.tensor.value());
  if (w == writers.end()) return Error::at(t.name, name + ": no op writes '" + t.name + "'");
  for (const auto& [d, piece] : w->second) {
    const int64_t p = position(a.from, d);
    if (p < 0)
      return rank_error(d, "writes '" + t.name + "' " + piece->ranges_string() + ", but " + name +
                               " takes its producers from ranks " + devices_string(a.from.devices));
    const SubTensor expected = a.from.piece(p, a.tensor, t.shape);
    if (!(expected == *piece))
      return rank_error(d, "writes '" + t.name + "' " + piece->ranges_string() + ", but " + name +
                               " expects it to hold " + expected.ranges_string());
    state.set(d, Region::of(*piece));
  }
  for (DeviceId d : a.from.devices)
    if (!state.has(d.value()))
      return rank_error(d.value(),
                        "writes no piece of '" + t.name + "', but " + name + " takes one from it");
  return Status::success();
}

// After the forward path: every rank of the consumers' layout holds what the layout promises,
// whole, and every consumer op there reads exactly that.
Status check_delivery(
    const graph::Graph& g, const Lowered& l, const Adapter& a, const DeviceRegions& state,
    const std::unordered_map<std::string, std::vector<const graph::Op*>>& by_name) {
  const size_t world = l.programs.size();
  const graph::FullTensor& t = g.tensor(a.tensor);
  const std::string name = adapter_name(g, a);
  for (size_t p = 0; p < a.to.devices.size(); ++p) {
    const int64_t d = a.to.devices[p].value();
    const SubTensor want = a.to.piece(static_cast<int64_t>(p), a.tensor, t.shape);
    if (!state.has(d))
      return rank_error(d, name + " leaves it without its piece " + want.ranges_string() + " of '" +
                               t.name + "'");
    const Region& got = state.region[static_cast<size_t>(d)];
    if (got.ranges != want.ranges || !got.value.is_whole())
      return rank_error(d, name + " delivers '" + t.name + "' " + got.to_string() +
                               " where its layout promises " + want.ranges_string());
  }
  std::vector<char> in_to(world, 0);
  for (DeviceId d : a.to.devices) in_to[static_cast<size_t>(d.value())] = 1;
  for (const std::string& consumer : a.consumers) {
    const auto ops = by_name.find(consumer);
    if (ops == by_name.end()) return Error::at(consumer, name + ": no op '" + consumer + "'");
    for (const graph::Op* op : ops->second) {
      const int64_t d = op->device.value();
      if (op->stage != a.consumer_stage || !in_to[static_cast<size_t>(d)]) continue;
      const Region& got = state.region[static_cast<size_t>(d)];
      for (const SubTensor& in : op->inputs)
        if (in.tensor == a.tensor && in.ranges != got.ranges)
          return rank_error(d, "op '" + op->name() + "' reads '" + t.name + "' " +
                                   in.ranges_string() + ", but " + name + " delivers " +
                                   got.to_string());
    }
  }
  return Status::success();
}

// The gradient: consumer replicas hold partial gradients (grad_layout(to)); each producer
// must end with its piece's gradient, the V partials of each of its replicas summing to the
// whole exactly once.
Status check_gradient_path(const graph::Graph& g, const Lowered& l, const Adapter& a) {
  const size_t world = l.programs.size();
  const graph::FullTensor& t = g.tensor(a.tensor);
  const std::string name = adapter_name(g, a);
  const Layout gto = grad_layout(a.to), gfrom = grad_layout(a.from);
  DeviceRegions grad(world);
  for (size_t p = 0; p < gto.devices.size(); ++p)
    grad.set(gto.devices[p].value(),
             Region::of(gto.piece(static_cast<int64_t>(p), a.tensor, t.shape)));
  LOOM_TRY(run_path(g, a, a.backward, false, grad));
  std::map<std::vector<int64_t>, std::pair<std::vector<Range>, ValueMix>> sums;
  for (size_t p = 0; p < gfrom.devices.size(); ++p) {
    const int64_t d = gfrom.devices[p].value();
    const SubTensor want = gfrom.piece(static_cast<int64_t>(p), a.tensor, t.shape);
    if (!grad.has(d))
      return rank_error(d, "the gradient path of " + name + " leaves it without the gradient of " +
                               want.ranges_string());
    const Region& got = grad.region[static_cast<size_t>(d)];
    if (got.ranges != want.ranges)
      return rank_error(d, "the gradient path of " + name + " leaves it the gradient of '" +
                               t.name + "' " + ranges_string(got.ranges) + " where it holds " +
                               want.ranges_string());
    std::vector<int64_t> key = gfrom.coords(static_cast<int64_t>(p));
    key[1] = 0;
    auto [it, fresh] = sums.try_emplace(key, got.ranges, got.value);
    if (!fresh) it->second.second = it->second.second + got.value;
  }
  for (const auto& [key, sum] : sums)
    if (!sum.second.is_whole())
      return Error::at(t.name, "the gradient path of " + name + " gives the replicas of '" +
                                   t.name + "' " + ranges_string(sum.first) + " " +
                                   sum.second.to_string() +
                                   " of its gradient together: each partial must count once");
  return Status::success();
}

// What one adapter delivers: its forward path, run on the regions the producers hold, gives
// every consuming rank the region its ops read, whole; its gradient path, run from the
// consumers' gradients (replicas' partials), gives every producer its gradient.
Status check_adapter(
    const graph::Graph& g, const Lowered& l, const Adapter& a, const Writers& writers,
    const std::unordered_map<std::string, std::vector<const graph::Op*>>& by_name) {
  DeviceRegions state(l.programs.size());
  LOOM_TRY(producer_regions(g, a, writers, state));
  LOOM_TRY(run_path(g, a, a.forward, true, state));
  LOOM_TRY(check_delivery(g, l, a, state, by_name));
  return check_gradient_path(g, l, a);
}

// Per op and input: the adapter it reads that input through (-1: none), an adapter serving the
// ops named among its consumers, in its consumer stage, on the ranks of its consumers' layout.
using ReadVia = std::vector<std::vector<int32_t>>;
ReadVia read_via(const graph::Graph& g, const Lowered& l,
                 const std::unordered_map<std::string, std::vector<const graph::Op*>>& by_name) {
  const auto& ops = g.ops();
  ReadVia out(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) out[i].assign(ops[i].inputs.size(), -1);
  std::vector<char> in_to(l.programs.size(), 0);
  for (const Adapter& a : l.adapters) {
    for (DeviceId d : a.to.devices) in_to[static_cast<size_t>(d.value())] = 1;
    for (const std::string& consumer : a.consumers) {
      const auto it = by_name.find(consumer);
      if (it == by_name.end()) continue;
      for (const graph::Op* op : it->second) {
        if (op->stage != a.consumer_stage || !in_to[static_cast<size_t>(op->device.value())])
          continue;
        const size_t i = static_cast<size_t>(op - ops.data());
        for (size_t k = 0; k < op->inputs.size(); ++k)
          if (op->inputs[k].tensor == a.tensor) out[i][k] = static_cast<int32_t>(a.id);
      }
    }
    for (DeviceId d : a.to.devices) in_to[static_cast<size_t>(d.value())] = 0;
  }
  return out;
}

// Ranks taking part in an adapter's steps.
std::set<int64_t> participants(const Adapter& a) {
  std::set<int64_t> out;
  for (DeviceId d : a.to.devices) out.insert(d.value());
  if (!a.disjoint)  // a disjoint adapter's producers run its sending part (checked apart)
    for (const CommPath* path : {&a.forward, &a.backward})
      for (const CommStep& st : path->steps)
        for (const auto& grp : st.groups)
          for (DeviceId d : grp) out.insert(d.value());
  return out;
}

// One rank's program in item order: every op its own and in its stage, every value it reads
// made or delivered earlier (the stages a value crosses on this rank are returned, for the
// block order to put first).
struct LocalDependency {
  int64_t from_stage, to_stage;
  bool operator<(const LocalDependency& o) const {
    return std::tie(from_stage, to_stage) < std::tie(o.from_stage, o.to_stage);
  }
};
Status walk_program(const graph::Graph& g, const Lowered& l, const ReadVia& via, int64_t r,
                    std::vector<int32_t>& op_seen, std::vector<std::set<int64_t>>& adapter_ranks,
                    std::set<LocalDependency>& local) {
  const Program& prog = l.programs[static_cast<size_t>(r)];
  // Per tensor: the pieces this rank wrote and in which stage.
  std::unordered_map<int64_t, std::vector<std::pair<const SubTensor*, int64_t>>> made;
  for (const Segment& seg : prog.segments) {
    const int64_t stage = seg.stage.value();
    std::set<int64_t> delivered;
    for (size_t i = 0; i < seg.items.size(); ++i) {
      const SegmentItem& it = seg.items[i];
      if (it.kind == SegmentItem::Kind::kAdapter) {
        const Adapter& a = l.adapters[static_cast<size_t>(it.index)];
        const std::string& tname = g.tensor(a.tensor).name;
        if (!adapter_ranks[static_cast<size_t>(a.id)].insert(r * 2 + it.producer_side).second)
          return rank_error(r, "runs " + adapter_name(g, a) + " twice");
        const bool stage_ok =
            it.producer_side ? a.producer_stage == seg.stage : a.consumer_stage == seg.stage;
        if (!stage_ok)
          return rank_error(r, "runs " + adapter_name(g, a) + " in stage " + seg.stage.to_string());
        const bool produces = !a.parameter && holds(a.from, r) && (it.producer_side || !a.disjoint);
        if (it.producer_side && (!a.disjoint || !holds(a.from, r)))
          return rank_error(r, "sends for " + adapter_name(g, a) + " without producing it");
        if (produces) {
          const auto m = made.find(a.tensor.value());
          const bool ready = m != made.end() &&
                             std::any_of(m->second.begin(), m->second.end(), [&](const auto& x) {
                               return x.second == a.producer_stage.value();
                             });
          if (!ready)
            return rank_error(r, "item " + std::to_string(i) + " of stage " +
                                     seg.stage.to_string() + " runs " + adapter_name(g, a) +
                                     " before any op writes '" + tname + "' there");
        }
        if (!it.producer_side) delivered.insert(a.id);
        continue;
      }
      const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
      if (op.device.value() != r)
        return rank_error(r, "runs op '" + op.name() + "', which the plan places on rank " +
                                 op.device.to_string());
      if (op.stage != seg.stage)
        return rank_error(r, "runs op '" + op.name() + "' in stage " + seg.stage.to_string() +
                                 ", its stage is " + op.stage.to_string());
      ++op_seen[static_cast<size_t>(it.index)];
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        const SubTensor& in = op.inputs[k];
        const graph::FullTensor& t = g.tensor(in.tensor);
        const int32_t through = via[static_cast<size_t>(it.index)][k];
        if (through >= 0) {
          const Adapter* a = &l.adapters[static_cast<size_t>(through)];
          if (!delivered.count(a->id))
            return rank_error(r, "op '" + op.name() + "' (item " + std::to_string(i) +
                                     " of stage " + seg.stage.to_string() + ") reads '" + t.name +
                                     "' " + in.ranges_string() + " before " + adapter_name(g, *a) +
                                     " delivers it");
          continue;
        }
        if (t.role != graph::TensorRole::kActivation && t.role != graph::TensorRole::kLoss)
          continue;
        const auto m = made.find(in.tensor.value());
        const std::pair<const SubTensor*, int64_t>* src = nullptr;
        if (m != made.end())
          for (const auto& x : m->second)
            if (*x.first == in && (!src || x.second == stage)) src = &x;
        if (!src)
          return rank_error(r, "op '" + op.name() + "' (item " + std::to_string(i) + " of stage " +
                                   seg.stage.to_string() + ") reads '" + t.name + "' " +
                                   in.ranges_string() +
                                   ", which no earlier item on this rank makes and no adapter "
                                   "delivers");
        if (src->second != stage) local.insert({src->second, stage});
      }
      for (const SubTensor& o : op.outputs) made[o.tensor.value()].push_back({&o, stage});
    }
  }
  return Status::success();
}

// Per stage a rank runs and per micro-batch it runs there: one F then one B, or one F, one I,
// one W in that order; values a stage reads from another stage on this rank made in that
// stage's F first. `runs`: per stage, the micro-batches the rank runs in it.
Status check_blocks(const Program& prog, int64_t r, int64_t micro_batches,
                    const std::set<LocalDependency>& local,
                    std::map<int64_t, std::vector<char>>& runs) {
  const size_t m = static_cast<size_t>(micro_batches);
  std::map<int64_t, std::vector<std::array<int64_t, 4>>> at;  // stage -> mb -> F,B,I,W position
  for (const Segment& seg : prog.segments)
    at[seg.stage.value()].assign(m, std::array<int64_t, 4>{-1, -1, -1, -1});
  for (size_t i = 0; i < prog.blocks.size(); ++i) {
    const ProgramBlock& b = prog.blocks[i];
    int64_t& slot = at[b.stage.value()][static_cast<size_t>(b.micro_batch.value())]
                      [static_cast<size_t>(b.kind)];
    if (slot >= 0)
      return rank_error(r, std::string("runs block ") + sched::to_char(b.kind) +
                               b.stage.to_string() + "." + b.micro_batch.to_string() + " twice");
    slot = static_cast<int64_t>(i);
  }
  for (const auto& [stage, mbs] : at) {
    std::vector<char>& mine = runs[stage];
    mine.assign(m, 0);
    for (size_t mb = 0; mb < m; ++mb) {
      const auto& x = mbs[mb];
      const std::string where = std::to_string(stage) + "." + std::to_string(mb);
      const bool whole = x[1] >= 0, split = x[2] >= 0 || x[3] >= 0;
      if (x[0] < 0 && !whole && !split) continue;
      mine[mb] = 1;
      if (x[0] < 0)
        return rank_error(r, "runs the backward of " + where + " but never its forward F" + where);
      if (whole == split || (split && (x[2] < 0 || x[3] < 0)))
        return rank_error(r, "runs the backward of " + where +
                                 (whole ? " both whole and split" : " incompletely or never"));
      const int64_t back = whole ? x[1] : x[2];
      if (back < x[0])
        return rank_error(r, "runs the backward of " + where + " before its forward");
      if (split && x[3] < x[2])
        return rank_error(r, "runs the weight gradient W" + where + " before its input gradient");
    }
  }
  for (const LocalDependency& dep : local)
    for (size_t mb = 0; mb < m; ++mb)
      if (at[dep.from_stage][mb][0] > at[dep.to_stage][mb][0])
        return rank_error(r, "runs F" + std::to_string(dep.to_stage) + "." + std::to_string(mb) +
                                 " before F" + std::to_string(dep.from_stage) + "." +
                                 std::to_string(mb) + ", whose values it reads");
  return Status::success();
}

// Every micro-batch runs through exactly one copy of the model (one, or Chimera's two
// pipelines, whose op names differ by a suffix from '@'), on every rank of each of its stages.
Status check_micro_batches(const graph::Graph& g, const Lowered& l, int64_t micro_batches,
                           const std::vector<std::map<int64_t, std::vector<char>>>& runs) {
  std::map<int64_t, std::string> copy_of;  // stage -> the suffix of its ops' names
  std::set<std::string> copies;
  for (const graph::Op& op : g.ops()) {
    const std::string& n = op.def->name;
    const auto at = n.find('@');
    copy_of[op.stage.value()] = at == std::string::npos ? "" : n.substr(at);
    copies.insert(copy_of[op.stage.value()]);
  }
  std::map<int64_t, std::pair<int64_t, std::vector<char>>> stage_runs;  // first rank, its mbs
  for (size_t r = 0; r < runs.size(); ++r)
    for (const auto& [stage, mbs] : runs[r]) {
      auto [it, fresh] = stage_runs.try_emplace(stage, static_cast<int64_t>(r), mbs);
      if (!fresh && it->second.second != mbs)
        for (size_t mb = 0; mb < mbs.size(); ++mb)
          if (mbs[mb] != it->second.second[mb])
            return rank_error(static_cast<int64_t>(r),
                              std::string(mbs[mb] ? "runs" : "never runs") + " micro-batch " +
                                  std::to_string(mb) + " in stage " + std::to_string(stage) +
                                  ", which rank " + std::to_string(it->second.first) +
                                  (mbs[mb] ? " never runs" : " runs") + " there");
    }
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    std::set<std::string> by;
    for (const auto& [stage, x] : stage_runs)
      if (x.second[static_cast<size_t>(mb)]) by.insert(copy_of[stage]);
    if (by.size() != 1)
      return Error::at("program", "micro-batch " + std::to_string(mb) + " runs through " +
                                      std::to_string(by.size()) +
                                      " copies of the model, not one: its loss would count " +
                                      std::to_string(by.size()) + " times");
    for (const auto& [stage, x] : stage_runs)
      if (copy_of[stage] == *by.begin() && !x.second[static_cast<size_t>(mb)])
        return Error::at("program", "micro-batch " + std::to_string(mb) + " skips stage " +
                                        std::to_string(stage));
  }
  return Status::success();
}

// Parameters stored split (parallel.zero 3): one stored layout per parameter, tiling it once.
Result<std::set<int64_t>> check_sharded(const graph::Graph& g, const Lowered& l) {
  std::map<int64_t, const Adapter*> stored;
  for (const Adapter& a : l.adapters) {
    if (!a.parameter) continue;
    const graph::FullTensor& t = g.tensor(a.tensor);
    auto [it, fresh] = stored.emplace(a.tensor.value(), &a);
    if (!fresh && it->second->from != a.from)
      return Error::at(t.name, "parameter '" + t.name + "' is stored as " + a.from.to_string() +
                                   " for " + a.consumer + " and as " +
                                   it->second->from.to_string() + " for " + it->second->consumer);
    if (!fresh) continue;
    std::vector<std::vector<Range>> boxes;
    for (int64_t p = 0; p < a.from.size(); ++p)
      boxes.push_back(a.from.piece(p, a.tensor, t.shape).ranges);
    std::vector<Range> whole;
    for (int64_t n : t.shape) whole.push_back(Range{0, n});
    std::string why;
    if (a.from.v != 1 || !tiles_exactly(boxes, whole, &why))
      return Error::at(t.name, "the ZeRO shards of parameter '" + t.name + "' (" +
                                   a.from.to_string() + ") do not store it once: " +
                                   (a.from.v != 1 ? "they hold partial sums" : why));
  }
  std::set<int64_t> out;
  for (const auto& [t, a] : stored) out.insert(t);
  return out;
}

// Each parameter piece read on several ranks has its gradient summed over exactly them, once.
Status check_grad_syncs(const graph::Graph& g, const Lowered& l, const std::set<int64_t>& sharded,
                        ProofStats& stats) {
  std::map<std::pair<int64_t, std::string>, std::pair<const SubTensor*, std::set<int64_t>>> readers;
  for (const graph::Op& op : g.ops())
    for (const SubTensor& in : op.inputs) {
      if (g.tensor(in.tensor).role != graph::TensorRole::kParameter ||
          sharded.count(in.tensor.value()))
        continue;
      auto& e = readers[{in.tensor.value(), in.ranges_string()}];
      e.first = &in;
      e.second.insert(op.device.value());
    }
  std::map<std::pair<int64_t, std::string>, int64_t> synced;
  for (size_t i = 0; i < l.grad_syncs.size(); ++i) {
    const GradSync& s = l.grad_syncs[i];
    const graph::FullTensor& t = g.tensor(s.tensor);
    const std::string what = "the gradient of '" + t.name + "' " + s.piece.ranges_string();
    const auto key = std::make_pair(s.tensor.value(), s.piece.ranges_string());
    if (!synced.emplace(key, static_cast<int64_t>(i)).second)
      return Error::at(t.name,
                       what + " is summed twice: two gradient syncs over ranks " +
                           devices_string(l.grad_syncs[static_cast<size_t>(synced[key])].devices) +
                           " and " + devices_string(s.devices));
    const auto it = readers.find(key);
    if (it == readers.end() || it->second.second.size() < 2)
      return Error::at(t.name, what + " is summed over ranks " + devices_string(s.devices) +
                                   (sharded.count(s.tensor.value())
                                        ? ", but it is stored split: its reduce-scatter sums it"
                                        : ", but " + std::string(it == readers.end()
                                                                     ? "no rank reads that piece"
                                                                     : "one rank alone reads it")));
    std::set<int64_t> members;
    for (DeviceId d : s.devices)
      if (!members.insert(d.value()).second)
        return Error::at(t.name, what + " counts rank " + d.to_string() +
                                     " twice in its sum over " + devices_string(s.devices));
    if (members != it->second.second) {
      std::vector<std::string> missing, extra;
      for (int64_t d : it->second.second)
        if (!members.count(d)) missing.push_back(std::to_string(d));
      for (int64_t d : members)
        if (!it->second.second.count(d)) extra.push_back(std::to_string(d));
      return Error::at(
          t.name,
          what + " is summed over ranks " + devices_string(s.devices) +
              (missing.empty() ? "" : ", missing rank(s) " + join(missing, ",") + " that read it") +
              (extra.empty() ? "" : ", with rank(s) " + join(extra, ",") + " that do not"));
    }
    for (int64_t d : members) {
      const auto& mine = l.programs[static_cast<size_t>(d)].grad_syncs;
      if (std::count(mine.begin(), mine.end(), static_cast<int64_t>(i)) != 1)
        return rank_error(d, "does not join the sum of " + what + " once");
    }
    ++stats.grad_syncs;
  }
  for (const auto& [key, e] : readers)
    if (e.second.size() > 1 && !synced.count(key)) {
      std::vector<DeviceId> ds;
      for (int64_t d : e.second) ds.push_back(DeviceId(d));
      return Error::at(g.tensor(TensorId(key.first)).name,
                       "the gradient of '" + g.tensor(TensorId(key.first)).name + "' " +
                           key.second + " is read on ranks " + devices_string(ds) +
                           " and never summed");
    }
  for (size_t r = 0; r < l.programs.size(); ++r)
    for (int64_t s : l.programs[r].grad_syncs)
      if (!holds(Layout{1, 1, {}, l.grad_syncs[static_cast<size_t>(s)].devices},
                 static_cast<int64_t>(r)))
        return rank_error(static_cast<int64_t>(r),
                          "joins the gradient sum of '" +
                              g.tensor(l.grad_syncs[static_cast<size_t>(s)].tensor).name +
                              "' without being one of its ranks");
  return Status::success();
}

// parallel.zero 1 splits each gradient group's buckets over its members (lower/
// grad_bucketing.h, made at run time from comm.bucket_mb): for the plan's own groups, at the
// default bucket size and at one that cuts pieces across buckets, the members' owned parts
// tile every piece once, so each element's optimizer state is updated by exactly one rank.
Status check_zero1_split(const graph::Graph& g, const Lowered& l) {
  std::map<std::vector<DeviceId>, std::vector<size_t>> groups;
  for (size_t i = 0; i < l.grad_syncs.size(); ++i) groups[l.grad_syncs[i].devices].push_back(i);
  for (const auto& [devices, syncs] : groups) {
    std::vector<int64_t> numel;
    for (size_t i : syncs) numel.push_back(loom::numel(l.grad_syncs[i].piece.shape()));
    const int64_t members = static_cast<int64_t>(devices.size());
    for (int64_t bucket_bytes : {int64_t{25} << 20, int64_t{4096}})
      for (const BucketPlan& b : plan_buckets(numel, 4, bucket_bytes, members, true))
        for (size_t j = 0; j < b.params.size(); ++j) {
          const int64_t n = numel[b.params[j]];
          std::vector<std::pair<int64_t, int64_t>> parts;
          for (int64_t m = 0; m < members; ++m) {
            const auto part = b.owned(j, n, m);
            if (part.second > part.first) parts.push_back(part);
          }
          std::sort(parts.begin(), parts.end());
          int64_t reach = 0;
          for (const auto& [lo, hi] : parts) reach = lo == reach ? hi : -1;
          if (reach != n) {
            const GradSync& s = l.grad_syncs[syncs[b.params[j]]];
            return Error::at(g.tensor(s.tensor).name,
                             "ZeRO-1 splits the optimizer state of '" + g.tensor(s.tensor).name +
                                 "' " + s.piece.ranges_string() + " over ranks " +
                                 devices_string(devices) + " with a gap or an overlap");
          }
        }
  }
  return Status::success();
}

// The loss counts once: each rank holding a piece seeds its backward with 1 / its replicas.
Status check_loss(const graph::Graph& g, const Lowered& l, const Writers& writers) {
  std::vector<double> want(l.programs.size(), 0.0);
  for (const graph::FullTensor& t : g.tensors()) {
    if (t.role != graph::TensorRole::kLoss) continue;
    const auto w = writers.find(t.id.value());
    if (w == writers.end()) return Error::at(t.name, "no op writes the loss '" + t.name + "'");
    for (const auto& [d, piece] : w->second) {
      int64_t replicas = 0;
      for (const auto& [d2, p2] : w->second) replicas += *p2 == *piece;
      want[static_cast<size_t>(d)] = 1.0 / static_cast<double>(replicas);
    }
  }
  for (size_t r = 0; r < l.programs.size(); ++r) {
    const double seed = l.programs[r].loss_seed;
    if (std::abs(seed - want[r]) > 1e-12 * std::max(1.0, want[r]))
      return rank_error(
          static_cast<int64_t>(r),
          "seeds the loss's backward with " + std::to_string(seed) +
              (want[r] == 0 ? ", but it holds no piece of the loss"
                            : " where its piece of the loss counts " + std::to_string(want[r]) +
                                  " (1 / the ranks holding it)"));
  }
  return Status::success();
}

// Recomputed regions: inside their segment, in order, disjoint, repeating no transfer between
// stages (a repeated send would deliver a stale value twice) and not making the loss. What a
// region reads from outside is kept by the executor whatever the region's bounds, so a region
// that leaves out an op changes memory, not values.
Status check_recompute(const graph::Graph& g, const Lowered& l) {
  for (const Program& p : l.programs)
    for (const Segment& seg : p.segments) {
      int64_t end = 0;
      for (const RecomputeRegion& region : seg.recompute) {
        if (region.begin < end || region.end <= region.begin ||
            region.end > static_cast<int64_t>(seg.items.size()))
          return rank_error(p.rank.value(),
                            "stage " + seg.stage.to_string() + " recomputes items " +
                                std::to_string(region.begin) + ".." + std::to_string(region.end) +
                                ", not a region of its " + std::to_string(seg.items.size()) +
                                " items after the last");
        end = region.end;
        for (int64_t i = region.begin; i < region.end; ++i) {
          const SegmentItem& it = seg.items[static_cast<size_t>(i)];
          if (it.kind == SegmentItem::Kind::kOp) {
            const graph::Op& op = g.ops()[static_cast<size_t>(it.index)];
            for (const SubTensor& o : op.outputs)
              if (g.tensor(o.tensor).role == graph::TensorRole::kLoss)
                return rank_error(p.rank.value(), "stage " + seg.stage.to_string() +
                                                      " recomputes op '" + op.name() +
                                                      "', which makes the loss: its backward "
                                                      "starts there and has nothing to recompute");
            continue;
          }
          const Adapter& a = l.adapters[static_cast<size_t>(it.index)];
          if (it.producer_side || a.disjoint || a.cross_stage())
            return rank_error(p.rank.value(), "stage " + seg.stage.to_string() + " recomputes " +
                                                  adapter_name(g, a) +
                                                  ", a transfer between stages");
        }
      }
    }
  return Status::success();
}

}  // namespace

Status prove_equivalent(const graph::Graph& single, const graph::Graph& planned,
                        const Lowered& lowered, int64_t micro_batches, ProofStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  ProofStats own;
  ProofStats& st = stats ? *stats : own;
  st = ProofStats{};
  LOOM_TRY(proof::check_structure(planned, lowered, micro_batches));
  LOOM_TRY(proof::check_ops(single, planned, st));

  LOOM_ASSIGN_OR_RETURN(const std::set<int64_t> sharded, check_sharded(planned, lowered));
  const Writers writers = writers_of(planned);
  std::unordered_map<std::string, std::vector<const graph::Op*>> by_name;
  for (const graph::Op& op : planned.ops()) by_name[op.def->name].push_back(&op);
  const ReadVia via = read_via(planned, lowered, by_name);
  std::vector<int32_t> op_seen(planned.ops().size(), 0);
  std::vector<std::set<int64_t>> adapter_ranks(lowered.adapters.size());
  std::vector<std::map<int64_t, std::vector<char>>> runs(lowered.programs.size());
  for (size_t r = 0; r < lowered.programs.size(); ++r) {
    std::set<LocalDependency> local;
    const int64_t rank = static_cast<int64_t>(r);
    LOOM_TRY(walk_program(planned, lowered, via, rank, op_seen, adapter_ranks, local));
    LOOM_TRY(check_blocks(lowered.programs[r], rank, micro_batches, local, runs[r]));
    st.blocks += static_cast<int64_t>(lowered.programs[r].blocks.size());
    ++st.ranks;
  }
  LOOM_TRY(check_micro_batches(planned, lowered, micro_batches, runs));
  for (size_t i = 0; i < op_seen.size(); ++i)
    if (op_seen[i] != 1) {
      const graph::Op& op = planned.ops()[i];
      return Error::at(
          op.name(), "op '" + op.name() + "' (placed on rank " + op.device.to_string() + ") runs " +
                         std::to_string(op_seen[i]) + " times over all ranks' programs, not once");
    }
  for (const Adapter& a : lowered.adapters) {
    std::set<int64_t> want;
    for (int64_t d : participants(a)) want.insert(d * 2);
    if (a.disjoint)
      for (DeviceId d : a.from.devices) want.insert(d.value() * 2 + 1);
    const auto& got = adapter_ranks[static_cast<size_t>(a.id)];
    for (int64_t x : want)
      if (!got.count(x))
        return rank_error(x / 2, std::string("takes part in ") + adapter_name(planned, a) +
                                     (x % 2 ? " as a sender" : "") +
                                     " but its program never runs it");
    for (int64_t x : got)
      if (!want.count(x))
        return rank_error(x / 2,
                          "runs " + adapter_name(planned, a) + ", in which it takes no part");
  }
  // Each op is where it should be and reads what is there: now what arrives through adapters.
  for (const Adapter& a : lowered.adapters) {
    LOOM_TRY(check_adapter(planned, lowered, a, writers, by_name));
    ++st.adapters;
  }
  LOOM_TRY(check_grad_syncs(planned, lowered, sharded, st));
  LOOM_TRY(check_zero1_split(planned, lowered));
  LOOM_TRY(check_loss(planned, lowered, writers));
  LOOM_TRY(check_recompute(planned, lowered));
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::success();
}

}  // namespace loom::lower
