#include "lower/program.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/strings.h"
#include "lower/param_shards.h"

namespace loom::lower {

Layout grad_layout(const Layout& l) {
  Layout g = l;
  g.r = l.v;
  g.v = l.r;
  // Coordinates (r, v, d) become (v, r, d): keep each device's piece by reordering positions.
  for (int64_t p = 0; p < l.size(); ++p) {
    std::vector<int64_t> c = l.coords(p);
    std::swap(c[0], c[1]);
    g.devices[static_cast<size_t>(g.position_of(c))] = l.devices[static_cast<size_t>(p)];
  }
  return g;
}

namespace {

using graph::SubTensor;

std::set<DeviceId> device_set(const Layout& l) { return {l.devices.begin(), l.devices.end()}; }

bool same_piece(const SubTensor& a, const SubTensor& b) {
  return a.ranges == b.ranges && a.value_chunk == b.value_chunk && a.value_chunks == b.value_chunks;
}

// Producers of every activation: (device, piece) and the producing stage.
struct Produced {
  std::vector<std::pair<DeviceId, SubTensor>> pieces;
  StageId stage;
};
using ProducedMap = std::map<int64_t, Produced>;

// Pass 0: the inputs lower() can work with.
Status check_placement(const graph::Graph& g, int64_t world_size, int64_t micro_batches) {
  if (micro_batches < 1 || micro_batches > kMaxMicroBatches)
    return Error::at("batch.global",
                     "a step of " + std::to_string(micro_batches) +
                         " micro-batches per data-parallel replica; loom runs 1 to " +
                         std::to_string(kMaxMicroBatches) +
                         " (batch.global / (batch.micro x parallel.dp))");
  for (const auto& op : g.ops())
    if (op.device.value() < 0 || op.device.value() >= world_size)
      return Error::at(op.name(), "op '" + op.name() + "' is placed on device " +
                                      op.device.to_string() + " outside the world of " +
                                      std::to_string(world_size));

  return Status::success();
}

// Pass 1: which device holds which piece of every tensor an op writes.
ProducedMap producers_of(const graph::Graph& g) {
  ProducedMap produced;
  for (const auto& op : g.ops())
    for (const auto& o : op.outputs) {
      auto& p = produced[o.tensor.value()];
      p.stage = op.stage;
      bool seen = false;
      for (auto& [d, s] : p.pieces) seen |= d == op.device && same_piece(s, o);
      if (!seen) p.pieces.push_back({op.device, o});
    }
  return produced;
}

// What a tensor is read as: (tensor, consumer op).
using ReadKey = std::pair<int64_t, std::string>;
using Pieces = std::vector<std::pair<DeviceId, SubTensor>>;

// The activations (and losses) ops read: the pieces each consumer wants on each device, its
// stage, and the reads in the order they first occur.
struct Reads {
  std::map<ReadKey, Pieces> wants;
  std::map<ReadKey, StageId> consumer_stage;
  std::vector<ReadKey> keys;
};

Reads reads_of(const graph::Graph& g) {
  Reads r;
  for (const auto& op : g.ops())
    for (const auto& in : op.inputs) {
      const graph::TensorRole role = g.tensor(in.tensor).role;
      if (role != graph::TensorRole::kActivation && role != graph::TensorRole::kLoss) continue;
      auto key = std::make_pair(in.tensor.value(), op.def->name);
      if (!r.wants.count(key)) r.keys.push_back(key);
      auto& w = r.wants[key];
      bool seen = false;
      for (auto& [d, s] : w) seen |= d == op.device && same_piece(s, in);
      if (!seen) w.push_back({op.device, in});
      r.consumer_stage[key] = op.stage;
    }
  return r;
}

// Whether each consumer device already holds exactly its piece, so the read needs nothing.
bool held_in_place(const Layout& from, const Layout& to, const Pieces& produced,
                   const Pieces& wanted) {
  bool local = device_set(from) == device_set(to);
  if (local)
    for (const auto& [d, want] : wanted) {
      bool has = false;
      for (const auto& [pd, piece] : produced) has |= pd == d && same_piece(piece, want);
      local &= has;
    }
  return local;
}

// The adapter `key` reads its tensor through: an existing one of the same stage and layout
// (shared), a new one with its forward and gradient paths, or -1 when the read is local.
Result<int64_t> adapter_for(const graph::Graph& g, const ReadKey& key, const Reads& reads,
                            const ProducedMap& produced, PathFinder& paths, Lowered& out,
                            std::map<int64_t, std::vector<int64_t>>& adapters_of_tensor) {
  const graph::FullTensor& t = g.tensor(TensorId(key.first));
  auto fail = [&](const Error& e) {
    return Error::at(t.name, "tensor '" + t.name + "' read by '" + key.second + "': " + e.message);
  };
  auto it = produced.find(key.first);
  if (it == produced.end()) return Error::at(t.name, "no op writes tensor '" + t.name + "'");
  const Pieces& wanted = reads.wants.at(key);
  auto from = layout_of(it->second.pieces, t.shape);
  if (!from.ok()) return fail(from.error());
  auto to = layout_of(wanted, t.shape);
  if (!to.ok()) return fail(to.error());
  const StageId cs = reads.consumer_stage.at(key);
  if (held_in_place(*from, *to, it->second.pieces, wanted)) return -1;
  // Another consumer already reads this layout of the tensor in this stage: share it.
  for (int64_t id : adapters_of_tensor[key.first]) {
    Adapter& other = out.adapters[static_cast<size_t>(id)];
    if (other.consumer_stage == cs && other.to == *to) {
      other.consumers.push_back(key.second);
      return other.id;
    }
  }
  Adapter a;
  a.id = static_cast<int64_t>(out.adapters.size());
  a.consumers = {key.second};
  a.tensor = TensorId(key.first);
  a.consumer = key.second;
  a.producer_stage = it->second.stage;
  a.consumer_stage = cs;
  a.from = *from;
  a.to = *to;
  const int64_t elem = size_bytes(t.dtype);
  auto fwd = paths.find(t.shape, elem, a.from, a.to);
  if (!fwd.ok()) return fail(fwd.error());
  auto bwd = paths.find(t.shape, elem, grad_layout(a.to), grad_layout(a.from), /*gradient=*/true);
  if (!bwd.ok()) return fail(bwd.error());
  a.forward = *fwd;
  a.backward = *bwd;
  adapters_of_tensor[key.first].push_back(a.id);
  out.adapters.push_back(std::move(a));
  return out.adapters.back().id;
}

// Pass 2: an adapter wherever a consumer's layout of an activation differs from its producers'
// (shared by the consumers of one stage that read the same layout), with its forward and
// gradient paths from the path search. Returns, per op, the adapters it reads through.
Result<std::vector<std::vector<int64_t>>> insert_adapters(const graph::Graph& g,
                                                          const ProducedMap& produced,
                                                          PathFinder& paths, Lowered& out) {
  const auto& ops = g.ops();
  const Reads reads = reads_of(g);
  std::map<ReadKey, int64_t> adapter_of;
  std::map<int64_t, std::vector<int64_t>> adapters_of_tensor;
  for (const auto& key : reads.keys) {
    LOOM_ASSIGN_OR_RETURN(const int64_t id,
                          adapter_for(g, key, reads, produced, paths, out, adapters_of_tensor));
    if (id >= 0) adapter_of[key] = id;
  }
  std::vector<std::vector<int64_t>> op_adapters(ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    for (const auto& in : ops[i].inputs) {
      auto it = adapter_of.find({in.tensor.value(), ops[i].def->name});
      if (it != adapter_of.end() && std::find(op_adapters[i].begin(), op_adapters[i].end(),
                                              it->second) == op_adapters[i].end())
        op_adapters[i].push_back(it->second);
    }
  return op_adapters;
}

// Pass 3: each rank's program: its ops in segments per stage with the adapters they read
// through (and the adapter steps it takes part in without consuming), each micro-batch's
// forward and backward in turn, as gradient accumulation runs them: one micro-batch's
// activations at a time (pass 6 replaces the order with a pipeline schedule's).
void build_programs(const graph::Graph& g, const std::vector<std::vector<int64_t>>& op_adapters,
                    int64_t world_size, int64_t micro_batches, Lowered& out) {
  const auto& ops = g.ops();
  out.programs.resize(static_cast<size_t>(world_size));
  std::vector<std::map<int64_t, Segment>> segments(static_cast<size_t>(world_size));
  std::vector<std::set<int64_t>> placed(
      static_cast<size_t>(world_size));  // adapters placed (consumer side)
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    Segment& seg = segments[op.device.value()][op.stage.value()];
    seg.stage = op.stage;
    // A bias_add's parameter gather goes before the weight product it follows, so the two stay
    // next to each other and run as one (lower/fusion.h).
    const bool after_linear = op.type() == "bias_add" && !seg.items.empty() &&
                              seg.items.back().kind == SegmentItem::Kind::kOp &&
                              ops[static_cast<size_t>(seg.items.back().index)].def->weight_product;
    for (int64_t a : op_adapters[i])
      if (placed[op.device.value()].insert(a).second) {
        const SegmentItem item{SegmentItem::Kind::kAdapter, a, false};
        if (after_linear && out.adapters[static_cast<size_t>(a)].parameter)
          seg.items.insert(seg.items.end() - 1, item);
        else
          seg.items.push_back(item);
      }
    seg.items.push_back({SegmentItem::Kind::kOp, static_cast<int64_t>(i), false});
  }
  // Devices of an adapter that do not consume through it still take part in its steps: the
  // producers of a cross-group adapter (at the end of their stage), and any member of an
  // intra-group collective that holds no consumer (placed before its stage's first op).
  for (Adapter& a : out.adapters) {
    const std::set<DeviceId> producers = device_set(a.from);
    a.disjoint = std::none_of(a.to.devices.begin(), a.to.devices.end(),
                              [&](DeviceId d) { return producers.count(d) > 0; });
    if (a.disjoint) {
      for (DeviceId d : a.from.devices) {
        Segment& seg = segments[d.value()][a.producer_stage.value()];
        seg.stage = a.producer_stage;
        seg.items.push_back({SegmentItem::Kind::kAdapter, a.id, true});
      }
    }
    for (DeviceId d : a.to.devices)
      if (!placed[d.value()].count(a.id)) {
        placed[d.value()].insert(a.id);
        Segment& seg = segments[d.value()][a.consumer_stage.value()];
        seg.stage = a.consumer_stage;
        seg.items.insert(seg.items.begin(), {SegmentItem::Kind::kAdapter, a.id, false});
      }
  }

  for (int64_t r = 0; r < world_size; ++r) {
    Program& prog = out.programs[static_cast<size_t>(r)];
    prog.rank = Rank(r);
    for (auto& [s, seg] : segments[static_cast<size_t>(r)]) prog.segments.push_back(seg);
    for (int64_t m = 0; m < micro_batches; ++m) {
      for (const Segment& seg : prog.segments)
        prog.blocks.push_back({BlockKind::kF, seg.stage, MicroBatch(m)});
      for (auto it = prog.segments.rbegin(); it != prog.segments.rend(); ++it)
        prog.blocks.push_back({BlockKind::kB, it->stage, MicroBatch(m)});
    }
  }
}

// Pass 4: gradient synchronisation of parameter pieces held by several devices (but those
// stored split, whose gradient path reduce-scatters them).
void add_grad_syncs(const graph::Graph& g, const std::set<int64_t>& sharded, Lowered& out) {
  const auto& ops = g.ops();
  std::map<int64_t, std::vector<std::pair<SubTensor, std::set<DeviceId>>>> holders;
  for (const auto& op : ops)
    for (const auto& in : op.inputs) {
      if (g.tensor(in.tensor).role != graph::TensorRole::kParameter) continue;
      if (sharded.count(in.tensor.value())) continue;
      auto& list = holders[in.tensor.value()];
      auto it = std::find_if(list.begin(), list.end(),
                             [&](const auto& e) { return same_piece(e.first, in); });
      if (it == list.end())
        list.push_back({in, {op.device}});
      else
        it->second.insert(op.device);
    }
  for (auto& [tensor, list] : holders)
    for (auto& [piece, devices] : list) {
      if (devices.size() < 2) continue;
      GradSync sync{TensorId(tensor), piece, {devices.begin(), devices.end()}};
      const int64_t id = static_cast<int64_t>(out.grad_syncs.size());
      for (DeviceId d : sync.devices) out.programs[d.value()].grad_syncs.push_back(id);
      out.grad_syncs.push_back(std::move(sync));
    }
}

// Pass 5: the loss: each piece counts once, so replicas seed 1 / replicas. Pipelines that are
// whole replicas of the model (Chimera's) each have their own loss over their own micro-batches.
Status seed_losses(const graph::Graph& g, const ProducedMap& produced, Lowered& out) {
  if (!produced.count(g.loss().value())) return Error::at(g.name(), "no op writes the loss");
  for (const auto& t : g.tensors()) {
    if (t.role != graph::TensorRole::kLoss) continue;
    auto loss = produced.find(t.id.value());
    if (loss == produced.end()) return Error::at(t.name, "no op writes the loss '" + t.name + "'");
    for (const auto& [d, piece] : loss->second.pieces) {
      int64_t replicas = 0;
      for (const auto& [d2, p2] : loss->second.pieces) replicas += same_piece(piece, p2);
      double& seed = out.programs[d.value()].loss_seed;
      const double mine = 1.0 / static_cast<double>(replicas);
      LOOM_CHECK(seed == 0 || seed == mine)
          << "rank " << d.value() << " holds losses seeded " << seed << " and " << mine;
      seed = mine;
    }
  }

  return Status::success();
}

}  // namespace

Result<Lowered> lower(const graph::Graph& g, int64_t world_size, int64_t micro_batches,
                      PathFinder& paths, const std::vector<std::vector<ProgramBlock>>* order) {
  if (!order) return lower(g, world_size, micro_batches, paths, BlockOrderFn{});
  return lower(
      g, world_size, micro_batches, paths,
      [order](const Lowered&) -> Result<std::vector<std::vector<ProgramBlock>>> { return *order; });
}

Result<Lowered> lower(const graph::Graph& g, int64_t world_size, int64_t micro_batches,
                      PathFinder& paths, const BlockOrderFn& order, const LowerOptions& options) {
  LOOM_TRY(check_placement(g, world_size, micro_batches));
  Lowered out;
  const ProducedMap produced = producers_of(g);
  LOOM_ASSIGN_OR_RETURN(auto op_adapters, insert_adapters(g, produced, paths, out));
  std::set<int64_t> sharded;
  if (options.shard_parameters) {
    LOOM_ASSIGN_OR_RETURN(sharded, shard_parameters(g, paths, out, op_adapters));
  }
  build_programs(g, op_adapters, world_size, micro_batches, out);
  add_grad_syncs(g, sharded, out);
  LOOM_TRY(seed_losses(g, produced, out));
  if (order) {  // pass 6: the schedule's block order
    LOOM_ASSIGN_OR_RETURN(auto blocks, order(out));
    if (!blocks.empty()) {
      LOOM_CHECK(blocks.size() == out.programs.size())
          << "an order for " << blocks.size() << " ranks, " << out.programs.size() << " lowered";
      for (size_t r = 0; r < blocks.size(); ++r) out.programs[r].blocks = std::move(blocks[r]);
    }
  }
  if (options.check_deadlock) LOOM_TRY(check_deadlock_free(g, out));
  return out;
}

namespace {

// Appends the steps of `path` this rank takes part in: "all_reduce with [0,1]; send to 2; recv
// from 3". Text is appended, not joined from parts: a 1024-rank dump lists millions of steps.
void append_my_steps(std::string& out, const CommPath& path, Rank rank) {
  const size_t start = out.size();
  auto part = [&] {
    if (out.size() > start) out += "; ";
  };
  for (const CommStep& st : path.steps) {
    if (st.primitive == Primitive::kSendRecv) {
      for (const auto& pair : st.groups) {
        if (pair[0] == pair[1]) continue;
        if (pair[0].value() == rank.value()) {
          part();
          out += "send to ";
          out += pair[1].to_string();
        }
        if (pair[1].value() == rank.value()) {
          part();
          out += "recv from ";
          out += pair[0].to_string();
        }
      }
      continue;
    }
    for (const auto& group : st.groups) {
      if (std::find(group.begin(), group.end(), DeviceId(rank.value())) == group.end()) continue;
      part();
      out += to_string(st.primitive);
      if (group.size() < 2) continue;
      out += " with [";
      for (size_t i = 0; i < group.size(); ++i) {
        if (i > 0) out += ',';
        out += group[i].to_string();
      }
      out += ']';
    }
  }
  if (out.size() == start) out += "(nothing on this rank)";
}

}  // namespace

std::string listing(const graph::Graph& g, const Lowered& lowered, Rank rank) {
  const Program& prog = lowered.programs[rank.value()];
  std::ostringstream head;
  head << "rank " << rank << ": " << prog.segments.size() << " stage segment(s), "
       << prog.blocks.size() << " blocks, loss seed " << prog.loss_seed << "\n";
  std::string out = head.str();
  for (const Segment& seg : prog.segments) {
    out += "  stage " + seg.stage.to_string() + ":\n";
    for (size_t i = 0; i < seg.items.size(); ++i) {
      const SegmentItem& it = seg.items[i];
      for (const RecomputeRegion& r : seg.recompute)
        if (r.begin == static_cast<int64_t>(i))
          out += "    recompute in backward: the next " + std::to_string(r.end - r.begin) +
                 " item(s)\n";
      if (it.kind == SegmentItem::Kind::kOp) {
        const auto& op = g.ops()[static_cast<size_t>(it.index)];
        out += "    run  ";
        out += op.def->name;
        for (const graph::Part& p : op.parts)
          out += "[" + std::to_string(p.index) + "/" + std::to_string(p.count) + "]";
        out += " (";
        out += op.type();
        out += ")\n";
      } else {
        const Adapter& a = lowered.adapters[static_cast<size_t>(it.index)];
        out += "    comm ";
        out += g.tensor(a.tensor).name;
        out += " for ";
        for (size_t c = 0; c < a.consumers.size(); ++c) {
          if (c > 0) out += ", ";
          out += a.consumers[c];
        }
        if (it.producer_side) out += " [send side]";
        if (a.parameter) out += " [stored " + a.from.to_string() + "]";
        out += ": ";
        append_my_steps(out, a.forward, rank);
        out += " | backward: ";
        if (a.regather) {
          out += "again ";
          append_my_steps(out, a.forward, rank);
          out += "; ";
        }
        append_my_steps(out, a.backward, rank);
        out += "\n";
      }
    }
  }
  out += "  order:";
  for (const ProgramBlock& b : prog.blocks) {
    out += ' ';
    out += sched::to_char(b.kind);
    out += b.stage.to_string() + "." + b.micro_batch.to_string();
  }
  out += "\n";
  for (int64_t s : prog.grad_syncs) {
    const GradSync& gs = lowered.grad_syncs[static_cast<size_t>(s)];
    out += "  grad all_reduce " + g.tensor(gs.tensor).name + gs.piece.ranges_string() + " over [";
    for (size_t i = 0; i < gs.devices.size(); ++i) {
      if (i > 0) out += ',';
      out += gs.devices[i].to_string();
    }
    out += "]\n";
  }
  return out;
}

}  // namespace loom::lower
