#include "exec/runtime/rank_executor.h"

#include <map>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "exec/runtime/init.h"
#include "exec/runtime/oracle.h"

namespace loom::runtime {
namespace {

using lower::Adapter;
using lower::CommPath;
using lower::CommStep;
using lower::Primitive;

// Which part of a path this rank runs: all of it, the producers' part (up to and including the
// sends to another group), or the consumers' part (the receives and what follows).
enum class Part { kAll, kProducer, kConsumer };

std::vector<int64_t> key_of(const std::vector<DeviceId>& devices) {
  std::vector<int64_t> k;
  for (DeviceId d : devices) k.push_back(d.value());
  return k;
}

// Thrown inside autograd functions, caught by RankExecutor::run.
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

struct RankExecutor::Impl {
  graph::Graph graph;
  lower::Lowered lowered;
  std::shared_ptr<comm::Comm> world;
  const KernelRegistry* kernels = nullptr;
  int64_t rank = 0;
  std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups;
  std::vector<at::Tensor> params;
  std::vector<graph::SubTensor> pieces;
  std::vector<int64_t> replicas;
  std::map<std::pair<int64_t, std::string>, size_t> param_index;  // (tensor, ranges) -> index
  std::map<std::pair<int64_t, std::string>, int64_t> adapter_of;  // (tensor, consumer) -> adapter
  std::map<int64_t, StageId> producer_stage;                       // tensors made on this rank

  // Per micro-batch values.
  struct Micro {
    std::unordered_map<int64_t, at::Tensor> env;         // outputs of this rank's ops
    std::unordered_map<int64_t, at::Tensor> adapted;     // adapter id -> value consumers read
    std::unordered_map<int64_t, at::Tensor> sent;        // adapter id -> what the producers sent
    std::unordered_map<int64_t, at::Tensor> leaves;      // tensor id -> same-rank stage boundary
    std::map<int64_t, std::map<int64_t, std::pair<at::Tensor, at::Tensor>>> pending;  // stage -> tensor -> (value, grad)
    at::Tensor loss;
  };
  std::vector<Micro> micro;

  comm::Comm& group(const std::vector<DeviceId>& members) {
    auto it = groups.find(key_of(members));
    LOOM_CHECK(it != groups.end() && it->second) << "no communicator for a group of rank " << rank;
    return *it->second;
  }

  int64_t position(const lower::Layout& l) const {
    for (size_t p = 0; p < l.devices.size(); ++p)
      if (l.devices[p].value() == rank) return static_cast<int64_t>(p);
    return -1;
  }

  Shape piece_shape(const lower::Layout& l, const Shape& full) const {
    return l.piece(position(l), TensorId(0), full).shape();
  }

  static void check(const Status& s) {
    if (!s.ok()) throw CommFailure(s.error().message);
  }

  // Runs the steps of `path` that involve this rank, starting from its piece `x`.
  at::Tensor run_path(const CommPath& path, const Shape& full, at::Tensor x, Part part, int64_t tag_base) {
    at::NoGradGuard no_grad;
    at::Tensor cur = x.defined() ? x.contiguous() : x;
    bool crossed = false;  // past the first send/recv step
    for (size_t i = 0; i < path.steps.size(); ++i) {
      const CommStep& st = path.steps[i];
      if (st.primitive == Primitive::kSendRecv) {
        const bool first_transfer = !crossed;
        crossed = true;
        const bool do_send = part != Part::kConsumer || !first_transfer;
        const bool do_recv = part != Part::kProducer || !first_transfer;
        const int tag = static_cast<int>(tag_base + static_cast<int64_t>(i));
        at::Tensor received;
        std::vector<comm::Work> sends;
        for (const auto& pair : st.groups) {
          const int64_t src = pair[0].value(), dst = pair[1].value();
          if (src == rank && dst == rank) {
            if (do_recv) received = cur;
            continue;
          }
          if (src == rank && do_send) sends.push_back(world->send_async(cur, Rank(src == rank ? dst : src), tag));
        }
        for (const auto& pair : st.groups) {
          const int64_t src = pair[0].value(), dst = pair[1].value();
          if (dst == rank && src != rank && do_recv) {
            // Activations and their gradients are float32 (the graph's activation dtype).
            received = at::empty(piece_shape(st.after, full), at::TensorOptions().dtype(at::kFloat));
            check(world->recv(received, Rank(src), tag));
          }
        }
        for (auto& w : sends) check(w.wait());
        if (part == Part::kProducer && first_transfer) return at::Tensor();
        // Devices that keep their piece (same position in both layouts) carry it over.
        if (!received.defined() && position(st.after) >= 0 && position(st.before) >= 0 &&
            st.before.devices[static_cast<size_t>(position(st.before))] == st.after.devices[static_cast<size_t>(position(st.before))])
          received = cur;
        cur = received;
        continue;
      }
      if (part == Part::kProducer && crossed) break;
      if (part == Part::kConsumer && !crossed) continue;
      const int64_t pos = position(st.before);
      if (pos < 0) continue;
      const int64_t sub = st.before.coords(pos)[static_cast<size_t>(st.from_factor)] % st.k;
      const int64_t k = st.k;
      auto dim_of = [](int factor) { return static_cast<int64_t>(factor - 2); };
      switch (st.primitive) {
        case Primitive::kAllReduce: {
          at::Tensor out = cur.clone();
          check(group(members_of(st)).all_reduce(out));
          cur = out;
          break;
        }
        case Primitive::kAllGather: {
          std::vector<at::Tensor> parts;
          for (int64_t j = 0; j < k; ++j) parts.push_back(at::empty_like(cur));
          check(group(members_of(st)).all_gather(parts, cur));
          cur = at::cat(parts, dim_of(st.from_factor));
          break;
        }
        case Primitive::kReduceScatter: {
          std::vector<at::Tensor> in;
          for (auto& c : cur.chunk(k, dim_of(st.to_factor))) in.push_back(c.contiguous());
          at::Tensor out = at::empty_like(in[0]);
          check(group(members_of(st)).reduce_scatter(out, in));
          cur = out;
          break;
        }
        case Primitive::kAllToAll: {
          std::vector<at::Tensor> in, out;
          for (auto& c : cur.chunk(k, dim_of(st.to_factor))) in.push_back(c.contiguous());
          for (int64_t j = 0; j < k; ++j) out.push_back(at::empty_like(in[0]));
          check(group(members_of(st)).all_to_all(out, in));
          cur = at::cat(out, dim_of(st.from_factor));
          break;
        }
        case Primitive::kChunk:
          cur = cur.chunk(k, dim_of(st.to_factor))[static_cast<size_t>(sub)].contiguous();
          break;
        case Primitive::kValueChunk:
          cur = cur / static_cast<double>(k);
          break;
        case Primitive::kPad: {
          const int64_t dim = dim_of(st.from_factor);
          std::vector<int64_t> shape = cur.sizes().vec();
          const int64_t width = shape[static_cast<size_t>(dim)];
          shape[static_cast<size_t>(dim)] = width * k;
          at::Tensor out = at::zeros(shape, cur.options());
          out.narrow(dim, sub * width, width).copy_(cur);
          cur = out;
          break;
        }
        case Primitive::kSendRecv: break;
      }
    }
    return cur;
  }

  std::vector<DeviceId> members_of(const CommStep& st) const {
    for (const auto& g : st.groups)
      for (DeviceId d : g)
        if (d.value() == rank) return g;
    LOOM_CHECK(false) << "rank " << rank << " is in no group of a step";
    return {};
  }

  int64_t tag(const Adapter& a, int direction, int64_t mb) const {
    LOOM_CHECK(mb < 1024) << "more than 1024 micro-batches";
    return ((a.id * 2 + direction) * 1024 + mb) * 64;
  }

  const Shape& shape_of(TensorId t) const { return graph.tensor(t).shape; }
};

namespace {

// An adapter within a stage: forward path as the function, gradient path as its backward.
struct AdapterFn : public torch::autograd::Function<AdapterFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                                                int64_t impl, int64_t adapter, int64_t mb) {
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["adapter"] = adapter;
    ctx->saved_data["mb"] = mb;
    auto* self = reinterpret_cast<RankExecutor::Impl*>(impl);
    const Adapter& a = self->lowered.adapters[static_cast<size_t>(adapter)];
    return {self->run_path(a.forward, self->shape_of(a.tensor), x, Part::kAll, self->tag(a, 0, mb))};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<RankExecutor::Impl*>(ctx->saved_data["impl"].toInt());
    const Adapter& a = self->lowered.adapters[static_cast<size_t>(ctx->saved_data["adapter"].toInt())];
    at::Tensor g = self->run_path(a.backward, self->shape_of(a.tensor), grads[0], Part::kAll,
                                  self->tag(a, 1, ctx->saved_data["mb"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

RankExecutor::RankExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankExecutor::~RankExecutor() = default;

Result<std::unique_ptr<RankExecutor>> RankExecutor::create(const graph::Graph& planned,
                                                           const lower::Lowered& lowered,
                                                           std::shared_ptr<comm::Comm> world,
                                                           const KernelRegistry& kernels,
                                                           uint64_t seed) {
  auto impl = std::make_unique<Impl>();
  impl->graph = planned;
  impl->lowered = lowered;
  impl->world = world;
  impl->kernels = &kernels;
  impl->rank = world->world_rank().value();
  if (static_cast<int64_t>(lowered.programs.size()) != world->size())
    return Error::at("comm", "the plan is for " + std::to_string(lowered.programs.size()) +
                                 " ranks but the world has " + std::to_string(world->size()));
  // Every group any step or gradient sync uses, created in the same order on every rank.
  std::vector<std::vector<int64_t>> wanted;
  auto want = [&](const std::vector<DeviceId>& members) {
    if (members.size() < 2) return;
    auto k = key_of(members);
    if (std::find(wanted.begin(), wanted.end(), k) == wanted.end()) wanted.push_back(k);
  };
  for (const Adapter& a : lowered.adapters)
    for (const CommPath* p : {&a.forward, &a.backward})
      for (const CommStep& st : p->steps)
        if (st.primitive != Primitive::kSendRecv)
          for (const auto& g : st.groups) want(g);
  for (const auto& s : lowered.grad_syncs) want(s.devices);
  for (const auto& k : wanted) {
    std::vector<Rank> ranks;
    for (int64_t r : k) ranks.push_back(Rank(r));
    LOOM_ASSIGN_OR_RETURN(auto g, world->new_group(ranks));
    if (g) impl->groups[k] = g;
  }
  for (const Adapter& a : lowered.adapters) impl->adapter_of[{a.tensor.value(), a.consumer}] = a.id;
  std::map<std::pair<int64_t, std::string>, int64_t> holders;
  for (const auto& s : lowered.grad_syncs)
    holders[{s.tensor.value(), s.piece.ranges_string()}] = static_cast<int64_t>(s.devices.size());
  for (const auto& op : planned.ops()) {
    if (op.device.value() != impl->rank) continue;
    for (const auto& o : op.outputs) impl->producer_stage[o.tensor.value()] = op.stage;
    for (const auto& in : op.inputs) {
      const graph::FullTensor& t = planned.tensor(in.tensor);
      if (t.role != graph::TensorRole::kParameter) continue;
      auto key = std::make_pair(t.id.value(), in.ranges_string());
      if (impl->param_index.count(key)) continue;
      at::Tensor p = init_parameter_piece(t, in, seed);
      p.set_requires_grad(true);
      impl->param_index[key] = impl->params.size();
      impl->params.push_back(p);
      impl->pieces.push_back(in);
      auto h = holders.find(key);
      impl->replicas.push_back(h == holders.end() ? 1 : h->second);
    }
  }
  return std::unique_ptr<RankExecutor>(new RankExecutor(std::move(impl)));
}

Result<double> RankExecutor::run(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs,
                                 double grad_scale) {
  Impl& s = *impl_;
  const lower::Program& prog = s.lowered.programs[static_cast<size_t>(s.rank)];
  const auto& ops = s.graph.ops();
  s.micro.assign(inputs.size(), Impl::Micro{});
  for (auto& p : s.params) p.mutable_grad() = at::Tensor();
  try {
    for (const lower::ProgramBlock& block : prog.blocks) {
      const int64_t mb = block.micro_batch.value();
      Impl::Micro& m = s.micro[static_cast<size_t>(mb)];
      const lower::Segment* seg = nullptr;
      for (const auto& sg : prog.segments)
        if (sg.stage == block.stage) seg = &sg;
      LOOM_CHECK(seg) << "rank " << s.rank << " has no segment for stage " << block.stage;
      auto disjoint = [](const Adapter& a) {
        for (DeviceId d : a.to.devices)
          if (std::find(a.from.devices.begin(), a.from.devices.end(), d) != a.from.devices.end()) return false;
        return true;
      };

      if (block.kind == lower::BlockKind::kForward) {
        for (const lower::SegmentItem& item : seg->items) {
          if (item.kind == lower::SegmentItem::Kind::kAdapter) {
            const Adapter& a = s.lowered.adapters[static_cast<size_t>(item.index)];
            const Shape& full = s.shape_of(a.tensor);
            if (item.producer_side) {
              at::Tensor x = m.env.at(a.tensor.value());
              s.run_path(a.forward, full, x.detach(), Part::kProducer, s.tag(a, 0, mb));
              m.sent[a.id] = x;
            } else if (disjoint(a)) {
              at::Tensor z = s.run_path(a.forward, full, at::Tensor(), Part::kConsumer, s.tag(a, 0, mb));
              m.adapted[a.id] = z.detach().requires_grad_(true);
            } else if (a.cross_stage()) {
              auto it = m.env.find(a.tensor.value());
              at::Tensor x = it == m.env.end() ? at::Tensor() : it->second.detach();
              at::Tensor z = s.run_path(a.forward, full, x, Part::kAll, s.tag(a, 0, mb));
              m.adapted[a.id] = z.detach().requires_grad_(true);
            } else {
              at::Tensor x = m.env.at(a.tensor.value());
              m.adapted[a.id] = AdapterFn::apply(x, reinterpret_cast<int64_t>(&s), a.id, mb)[0];
            }
            continue;
          }
          const graph::Op& op = ops[static_cast<size_t>(item.index)];
          std::vector<at::Tensor> args;
          for (const auto& in : op.inputs) {
            const graph::FullTensor& t = s.graph.tensor(in.tensor);
            if (t.role == graph::TensorRole::kInput) {
              args.push_back(cut_piece(inputs[static_cast<size_t>(mb)].at(t.id.value()), in).contiguous());
            } else if (t.role == graph::TensorRole::kParameter) {
              args.push_back(s.params[s.param_index.at({t.id.value(), in.ranges_string()})]);
            } else if (auto a = s.adapter_of.find({t.id.value(), op.def->name}); a != s.adapter_of.end()) {
              args.push_back(m.adapted.at(a->second));
            } else if (s.producer_stage.at(t.id.value()) == op.stage) {
              args.push_back(m.env.at(t.id.value()));
            } else {
              auto& leaf = m.leaves[t.id.value()];
              if (!leaf.defined()) leaf = m.env.at(t.id.value()).detach().requires_grad_(true);
              args.push_back(leaf);
            }
          }
          std::vector<at::Tensor> outs = (*s.kernels->find(op.type()))(KernelContext{s.graph, op}, args);
          for (size_t o = 0; o < outs.size(); ++o) m.env[op.outputs[o].tensor.value()] = outs[o];
          if (op.outputs[0].tensor == s.graph.loss()) m.loss = outs[0];
        }
        continue;
      }

      // Backward of this stage for this micro-batch.
      std::map<int64_t, std::pair<at::Tensor, at::Tensor>> roots = m.pending[block.stage.value()];
      auto add_root = [&](int64_t tensor, const at::Tensor& value, const at::Tensor& grad) {
        auto it = roots.find(tensor);
        if (it == roots.end()) roots[tensor] = {value, grad};
        else it->second.second = it->second.second + grad;
      };
      if (m.loss.defined() && s.producer_stage.at(s.graph.loss().value()) == block.stage)
        add_root(s.graph.loss().value(), m.loss, at::full_like(m.loss, prog.loss_seed * grad_scale));
      for (auto it = seg->items.rbegin(); it != seg->items.rend(); ++it)
        if (it->kind == lower::SegmentItem::Kind::kAdapter && it->producer_side) {
          const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
          at::Tensor g = s.run_path(a.backward, s.shape_of(a.tensor), at::Tensor(), Part::kConsumer, s.tag(a, 1, mb));
          add_root(a.tensor.value(), m.sent.at(a.id), g);
        }
      std::vector<at::Tensor> tensors, grads;
      for (auto& [id, tg] : roots)
        if (tg.first.requires_grad()) {
          tensors.push_back(tg.first);
          grads.push_back(tg.second);
        }
      if (!tensors.empty()) torch::autograd::backward(tensors, grads);
      for (auto it = seg->items.rbegin(); it != seg->items.rend(); ++it) {
        if (it->kind != lower::SegmentItem::Kind::kAdapter || it->producer_side) continue;
        const Adapter& a = s.lowered.adapters[static_cast<size_t>(it->index)];
        if (!disjoint(a) && !a.cross_stage()) continue;  // ran inside autograd
        at::Tensor z = m.adapted.at(a.id);
        at::Tensor g = z.grad().defined() ? z.grad() : at::zeros_like(z);
        if (disjoint(a)) {
          s.run_path(a.backward, s.shape_of(a.tensor), g, Part::kProducer, s.tag(a, 1, mb));
        } else {
          at::Tensor gx = s.run_path(a.backward, s.shape_of(a.tensor), g, Part::kAll, s.tag(a, 1, mb));
          auto x = m.env.find(a.tensor.value());
          if (x != m.env.end() && gx.defined())
            m.pending[s.producer_stage.at(a.tensor.value()).value()][a.tensor.value()] = {x->second, gx};
        }
      }
      for (auto& [tensor, leaf] : m.leaves) {
        if (s.producer_stage.at(tensor) == block.stage || !leaf.grad().defined()) continue;
        bool consumed_here = false;
        for (const auto& item : seg->items)
          if (item.kind == lower::SegmentItem::Kind::kOp)
            for (const auto& in : ops[static_cast<size_t>(item.index)].inputs) consumed_here |= in.tensor.value() == tensor;
        if (!consumed_here) continue;
        auto& slot = m.pending[s.producer_stage.at(tensor).value()][tensor];
        slot = {m.env.at(tensor), slot.second.defined() ? slot.second + leaf.grad() : leaf.grad()};
      }
    }
    // Gradients of parameter pieces held by several ranks are summed over those ranks.
    for (int64_t id : prog.grad_syncs) {
      const auto& sync = s.lowered.grad_syncs[static_cast<size_t>(id)];
      at::Tensor& p = s.params[s.param_index.at({sync.tensor.value(), sync.piece.ranges_string()})];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      Impl::check(s.group(sync.devices).all_reduce(p.mutable_grad()));
    }
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (auto& m : s.micro)
      if (m.loss.defined()) loss += m.loss.detach().to(at::kDouble) * prog.loss_seed;
    Impl::check(s.world->all_reduce(loss));
    return loss.item<double>();
  } catch (const CommFailure& e) {
    return Error::at("comm", e.what());
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    return Error::at("comm", what);
  }
}

const std::vector<at::Tensor>& RankExecutor::parameters() const { return impl_->params; }
const std::vector<graph::SubTensor>& RankExecutor::parameter_pieces() const { return impl_->pieces; }
const std::vector<int64_t>& RankExecutor::parameter_replicas() const { return impl_->replicas; }
comm::Comm& RankExecutor::world() { return *impl_->world; }

}  // namespace loom::runtime
