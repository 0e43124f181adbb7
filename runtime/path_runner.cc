#include "runtime/path_runner.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <string>

#include "comm/comm_traits.h"
#include "runtime/step_trace.h"

namespace loom::runtime {
namespace {

using lower::CommStep;
using lower::Primitive;

std::vector<int64_t> key_of(const std::vector<DeviceId>& devices) {
  std::vector<int64_t> k;
  for (DeviceId d : devices) k.push_back(d.value());
  return k;
}

// Whether k pieces of `x` side by side along `dim` are their row-major concatenation: no
// dimension before `dim` has more than one element (a flat collective then needs no copies).
bool stacks_flat(const at::Tensor& x, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d)
    if (x.size(d) != 1) return false;
  return x.is_contiguous();
}

// The tensor dimension of layout factor `factor` (2 + k = D_k).
int64_t dim_of(int factor) { return static_cast<int64_t>(factor - 2); }

int64_t position(const lower::Layout& l, int64_t rank) {
  for (size_t p = 0; p < l.devices.size(); ++p)
    if (l.devices[p].value() == rank) return static_cast<int64_t>(p);
  return -1;
}

}  // namespace

PathRunner::PathRunner(std::shared_ptr<comm::Comm> world, at::Device device)
    : world_(std::move(world)),
      device_(device),
      rank_(world_->world_rank().value()),
      defer_sends_(comm::comm_traits(*world_).defers_sends) {
  for (const lower::PrimitiveRule& rule : lower::primitive_rules())
    LOOM_CHECK(can_run(rule.primitive)) << "the path runner cannot run " << rule.name;
}

Status PathRunner::add_groups(const std::vector<const lower::CommPath*>& paths,
                              const std::vector<std::vector<DeviceId>>& extra) {
  std::vector<std::vector<int64_t>> wanted;
  auto want = [&](const std::vector<DeviceId>& members) {
    if (members.size() < 2) return;
    auto k = key_of(members);
    if (groups_.count(k) || std::find(wanted.begin(), wanted.end(), k) != wanted.end()) return;
    wanted.push_back(k);
  };
  for (const lower::CommPath* p : paths)
    for (const CommStep& st : p->steps)
      if (lower::rule_of(st.primitive).kind != lower::PrimitiveKind::kTransfer)
        for (const auto& g : st.groups) want(g);
  for (const auto& g : extra) want(g);
  for (const auto& k : wanted) {
    std::vector<Rank> ranks;
    for (int64_t r : k) ranks.push_back(Rank(r));
    LOOM_ASSIGN_OR_RETURN(auto g, world_->new_group(ranks));
    groups_[k] = g;  // null where this rank is not a member
  }
  return Status::success();
}

void PathRunner::start_waiting_sends() {
  if (waiting_sends_.empty()) return;
  const int64_t start_us = tracer_ ? (tracer_->sync(), tracer_->now_us()) : 0;
  sends_.push_back(world_->batch_isend_irecv(waiting_sends_));
  if (tracer_) trace_ops(waiting_sends_, start_us);
  waiting_sends_.clear();
}

void PathRunner::trace_ops(const std::vector<comm::P2POp>& ops, int64_t start_us) {
  tracer_->sync();
  const int64_t end_us = tracer_->now_us();
  for (const comm::P2POp& op : ops) {
    const bool send = op.kind == comm::P2POp::Kind::kSend;
    observe::TraceEvent e =
        comm_event(send ? "send" : "recv", op.tensor, op.peer.value(), op.tag, nullptr);
    e.start_us = start_us;
    e.end_us = end_us;
    tracer_->add(std::move(e));
  }
}

void PathRunner::prepost(const lower::CommPath& path, const Shape& full, PathPart part,
                         int64_t tag_base, at::ScalarType dtype) {
  if (defer_sends_ || part == PathPart::kProducer) return;
  for (size_t i = 0; i < path.steps.size(); ++i) {
    const CommStep& st = path.steps[i];
    if (lower::rule_of(st.primitive).kind != lower::PrimitiveKind::kTransfer) continue;
    const int tag = static_cast<int>(tag_base + static_cast<int64_t>(i));
    for (const auto& pair : st.groups) {
      const int64_t src = pair[0].value(), dst = pair[1].value();
      if (dst != rank_ || src == rank_ || posted_.count({src, tag})) continue;
      Posted p;
      p.buffer = at::empty(st.after.piece(position(st.after, rank_), TensorId(0), full).shape(),
                           at::TensorOptions().dtype(dtype).device(device_));
      p.work = world_->recv_async(p.buffer, Rank(src), tag);
      posted_[{src, tag}] = std::move(p);
    }
    return;  // only the first transfer: later ones depend on what this rank does in between
  }
}

Status PathRunner::flush() {
  LOOM_CHECK(posted_.empty()) << "rank " << rank_ << ": " << posted_.size()
                              << " posted receives were never taken";
  start_waiting_sends();
  observe::TraceSpan span(tracer_, [] { return comm_event("wait sends", {}, -1, -1, nullptr); });
  for (auto& w : sends_) LOOM_TRY(w.wait());
  sends_.clear();
  return Status::success();
}

comm::Comm& PathRunner::group(const std::vector<DeviceId>& members) {
  auto it = groups_.find(key_of(members));
  LOOM_CHECK(it != groups_.end() && it->second)
      << "rank " << rank_ << " has no communicator for a group";
  return *it->second;
}

Result<at::Tensor> PathRunner::run(const lower::CommPath& path, const Shape& full, at::Tensor x,
                                   PathPart part, int64_t tag_base, at::ScalarType dtype,
                                   int64_t ragged_dim) {
  at::NoGradGuard no_grad;
  ragged_dim_ = ragged_dim;
  at::Tensor cur = x.defined() ? x.contiguous() : x;
  bool crossed = false;  // past the first send/recv step
  for (size_t i = 0; i < path.steps.size(); ++i) {
    const CommStep& st = path.steps[i];
    if (lower::rule_of(st.primitive).kind == lower::PrimitiveKind::kTransfer) {
      const bool first_transfer = !crossed;
      crossed = true;
      const bool do_send = part != PathPart::kConsumer || !first_transfer;
      const bool do_recv = part != PathPart::kProducer || !first_transfer;
      const int tag = static_cast<int>(tag_base + static_cast<int64_t>(i));
      LOOM_ASSIGN_OR_RETURN(at::Tensor received,
                            send_recv(st, full, cur, do_send, do_recv, tag, dtype));
      if (part == PathPart::kProducer && first_transfer) return at::Tensor();
      // A device whose piece stays where it is (same position in both layouts) keeps it.
      const int64_t before = position(st.before, rank_);
      if (!received.defined() && before >= 0 && position(st.after, rank_) == before) received = cur;
      cur = received;
      continue;
    }
    if (part == PathPart::kProducer && crossed) break;
    if (part == PathPart::kConsumer && !crossed) continue;
    if (position(st.before, rank_) < 0) continue;
    LOOM_ASSIGN_OR_RETURN(cur, apply(st, std::move(cur)));
  }
  return cur;
}

Result<at::Tensor> PathRunner::send_recv(const CommStep& st, const Shape& full,
                                         const at::Tensor& cur, bool send, bool recv, int tag,
                                         at::ScalarType dtype) {
  at::Tensor received;
  for (const auto& pair : st.groups) {
    const int64_t src = pair[0].value(), dst = pair[1].value();
    if (src != rank_ || !send) continue;
    if (dst == rank_) {
      received = cur;
      continue;
    }
    waiting_sends_.push_back(comm::P2POp::send(cur, Rank(dst), tag));
  }
  if (!defer_sends_) start_waiting_sends();
  std::vector<comm::P2POp> batch;
  std::vector<std::pair<comm::Work, comm::P2POp>> taken;  // receives posted ahead (prepost)
  for (const auto& pair : st.groups) {
    const int64_t src = pair[0].value(), dst = pair[1].value();
    if (dst != rank_ || src == rank_ || !recv) continue;
    if (auto it = posted_.find({src, tag}); it != posted_.end()) {
      received = it->second.buffer;
      taken.emplace_back(it->second.work, comm::P2POp::recv(received, Rank(src), tag));
      posted_.erase(it);
      continue;
    }
    received = at::empty(st.after.piece(position(st.after, rank_), TensorId(0), full).shape(),
                         at::TensorOptions().dtype(dtype).device(device_));
    batch.push_back(comm::P2POp::recv(received, Rank(src), tag));
  }
  if (!batch.empty()) {
    // The sends waiting so far go with these receives: one batch, one wait.
    batch.insert(batch.begin(), waiting_sends_.begin(), waiting_sends_.end());
    waiting_sends_.clear();
    const int64_t start_us = tracer_ ? (tracer_->sync(), tracer_->now_us()) : 0;
    Status done = world_->batch_isend_irecv(batch).wait();
    if (tracer_) trace_ops(batch, start_us);
    LOOM_TRY(done);
  }
  for (auto& [work, recv_op] : taken) {
    const comm::P2POp& op = recv_op;
    observe::TraceSpan span(
        tracer_, [&] { return comm_event("recv", op.tensor, op.peer.value(), op.tag, nullptr); });
    LOOM_TRY(work.wait());
  }
  return received;
}

const std::map<Primitive, PathRunner::StepRunner>& PathRunner::step_runners() {
  static const std::map<Primitive, StepRunner> kRunners = {
      {Primitive::kAllReduce, &PathRunner::all_reduce},
      {Primitive::kAllGather, &PathRunner::all_gather},
      {Primitive::kReduceScatter, &PathRunner::reduce_scatter},
      {Primitive::kAllToAll, &PathRunner::all_to_all},
      {Primitive::kChunk, &PathRunner::chunk},
      {Primitive::kValueChunk, &PathRunner::value_chunk},
      {Primitive::kPad, &PathRunner::pad},
  };
  return kRunners;
}

bool PathRunner::can_run(Primitive p) {
  return lower::rule_of(p).kind == lower::PrimitiveKind::kTransfer || step_runners().count(p) > 0;
}

Result<at::Tensor> PathRunner::apply(const CommStep& st, at::Tensor cur) {
  if (lower::rule_of(st.primitive).kind == lower::PrimitiveKind::kCollective) start_waiting_sends();
  const auto it = step_runners().find(st.primitive);
  LOOM_CHECK(it != step_runners().end())
      << "rank " << rank_ << ": no runner for " << lower::to_string(st.primitive);
  return (this->*it->second)(st, std::move(cur));
}

comm::Comm& PathRunner::group_of(const CommStep& st) {
  for (const auto& g : st.groups)
    for (DeviceId d : g)
      if (d.value() == rank_) return group(g);
  LOOM_CHECK(false) << "rank " << rank_ << " is in no group of a "
                    << lower::to_string(st.primitive);
  return *world_;
}

int64_t PathRunner::sub_of(const CommStep& st) const {
  const int64_t pos = position(st.before, rank_);
  return st.before.coords(pos)[static_cast<size_t>(st.from_factor)] % st.k;
}

Result<at::Tensor> PathRunner::all_reduce(const CommStep& st, at::Tensor cur) {
  at::Tensor out = cur.clone();
  comm::Comm& g = group_of(st);
  observe::TraceSpan span(tracer_, [&] { return comm_event("all_reduce", out, -1, -1, &g); });
  LOOM_TRY(g.all_reduce(out));
  return out;
}

Result<at::Tensor> PathRunner::all_gather(const CommStep& st, at::Tensor cur) {
  const int64_t dim = dim_of(st.from_factor), k = st.k;
  comm::Comm& g = group_of(st);
  if (stacks_flat(cur, dim)) {  // straight into the result, no copy
    std::vector<int64_t> sizes = cur.sizes().vec();
    sizes[static_cast<size_t>(dim)] *= k;
    at::Tensor out = at::empty(sizes, cur.options());
    observe::TraceSpan span(tracer_, [&] { return comm_event("all_gather", cur, -1, -1, &g); });
    LOOM_TRY(g.all_gather_flat(out, cur));
    return out;
  }
  std::vector<at::Tensor> parts;
  for (int64_t j = 0; j < k; ++j) parts.push_back(at::empty_like(cur));
  observe::TraceSpan span(tracer_, [&] { return comm_event("all_gather", cur, -1, -1, &g); });
  LOOM_TRY(g.all_gather(parts, cur));
  return at::cat(parts, dim);
}

Result<at::Tensor> PathRunner::reduce_scatter(const CommStep& st, at::Tensor cur) {
  const int64_t dim = dim_of(st.to_factor), k = st.k;
  comm::Comm& g = group_of(st);
  if (stacks_flat(cur, dim)) {  // from the tensor itself, no copy
    std::vector<int64_t> sizes = cur.sizes().vec();
    sizes[static_cast<size_t>(dim)] /= k;
    at::Tensor out = at::empty(sizes, cur.options());
    observe::TraceSpan span(tracer_, [&] { return comm_event("reduce_scatter", cur, -1, -1, &g); });
    LOOM_TRY(g.reduce_scatter_flat(out, cur));
    return out;
  }
  std::vector<at::Tensor> in;
  for (auto& c : cur.chunk(k, dim)) in.push_back(c.contiguous());
  at::Tensor out = at::empty_like(in[0]);
  observe::TraceSpan span(tracer_, [&] { return comm_event("reduce_scatter", cur, -1, -1, &g); });
  LOOM_TRY(g.reduce_scatter(out, in));
  return out;
}

Result<at::Tensor> PathRunner::all_to_all(const CommStep& st, at::Tensor cur) {
  const int64_t from = dim_of(st.from_factor), to = dim_of(st.to_factor);
  std::vector<at::Tensor> in, out;
  for (auto& c : cur.chunk(st.k, to)) in.push_back(c.contiguous());
  comm::Comm& g = group_of(st);
  if (ragged_dim_ >= 0 && ragged_dim_ != to && ragged_dim_ != from)
    return ragged_all_to_all(g, in, from);
  for (int64_t j = 0; j < st.k; ++j) out.push_back(at::empty_like(in[0]));
  observe::TraceSpan span(tracer_, [&] { return comm_event("all_to_all", cur, -1, -1, &g); });
  LOOM_TRY(g.all_to_all(out, in));
  return at::cat(out, from);
}

Result<at::Tensor> PathRunner::chunk(const CommStep& st, at::Tensor cur) {
  return cur.chunk(st.k, dim_of(st.to_factor))[static_cast<size_t>(sub_of(st))].contiguous();
}

Result<at::Tensor> PathRunner::value_chunk(const CommStep& st, at::Tensor cur) {
  return cur / static_cast<double>(st.k);
}

Result<at::Tensor> PathRunner::pad(const CommStep& st, at::Tensor cur) {
  const int64_t dim = dim_of(st.from_factor);
  std::vector<int64_t> shape = cur.sizes().vec();
  const int64_t width = shape[static_cast<size_t>(dim)];
  shape[static_cast<size_t>(dim)] = width * st.k;
  at::Tensor out = at::zeros(shape, cur.options());
  out.narrow(dim, sub_of(st) * width, width).copy_(cur);
  return out;
}

Result<at::Tensor> PathRunner::ragged_all_to_all(comm::Comm& g, const std::vector<at::Tensor>& in,
                                                 int64_t cat_dim) {
  const int64_t d = ragged_dim_, k = static_cast<int64_t>(in.size()), rows = in[0].size(d);
  // Each piece's rows up to its last non-zero one, found on the device in one pass.
  const at::Tensor nonzero = at::stack(in).ne(0).movedim(d + 1, 1).reshape({k, rows, -1}).any(2);
  const at::Tensor counts =
      (nonzero.to(at::kLong) * at::arange(1, rows + 1, nonzero.options().dtype(at::kLong))).amax(1);
  std::vector<at::Tensor> send_counts, recv_counts;
  for (int64_t j = 0; j < k; ++j) {
    send_counts.push_back(counts.narrow(0, j, 1).contiguous());
    recv_counts.push_back(at::empty_like(send_counts.back()));
  }
  {
    observe::TraceSpan span(tracer_, [&] { return comm_event("all_to_all", counts, -1, -1, &g); });
    LOOM_TRY(g.all_to_all(recv_counts, send_counts));
  }
  // The sizes must reach the host to make the receive buffers: one read per exchange.
  const at::Tensor sent = counts.cpu(), received = at::cat(recv_counts).cpu();
  std::vector<at::Tensor> payload, arrived;
  for (int64_t j = 0; j < k; ++j) {
    payload.push_back(
        in[static_cast<size_t>(j)].narrow(d, 0, sent[j].item<int64_t>()).contiguous());
    std::vector<int64_t> shape = in[0].sizes().vec();
    shape[static_cast<size_t>(d)] = received[j].item<int64_t>();
    arrived.push_back(at::empty(shape, in[0].options()));
  }
  {
    observe::TraceSpan span(
        tracer_, [&] { return comm_event("all_to_all", at::cat(payload, d), -1, -1, &g); });
    LOOM_TRY(g.all_to_all(arrived, payload));
  }
  std::vector<at::Tensor> out;
  for (int64_t j = 0; j < k; ++j) {
    at::Tensor full = at::zeros_like(in[0]);
    full.narrow(d, 0, arrived[static_cast<size_t>(j)].size(d))
        .copy_(arrived[static_cast<size_t>(j)]);
    out.push_back(std::move(full));
  }
  return at::cat(out, cat_dim);
}

bool PathRunner::is_one_all_gather(const lower::CommPath& path) const {
  return path.steps.size() == 1 && path.steps[0].primitive == Primitive::kAllGather &&
         position(path.steps[0].before, rank_) >= 0;
}

Result<PathRunner::Started> PathRunner::start_all_gather(const lower::CommPath& path,
                                                         const at::Tensor& x) {
  LOOM_CHECK(is_one_all_gather(path))
      << "not one all-gather of rank " << rank_ << ": " << path.to_string();
  at::NoGradGuard no_grad;
  start_waiting_sends();  // a collective must not wait on a peer that waits for them
  const CommStep& st = path.steps[0];
  Started out;
  out.dim = dim_of(st.from_factor);
  const at::Tensor in = x.contiguous();
  const bool flat = stacks_flat(in, out.dim);
  if (flat) {
    std::vector<int64_t> sizes = in.sizes().vec();
    sizes[static_cast<size_t>(out.dim)] *= st.k;
    out.out = at::empty(sizes, in.options());
  } else {
    for (int64_t j = 0; j < st.k; ++j) out.parts.push_back(at::empty_like(in));
  }
  for (const auto& g : st.groups)
    for (DeviceId d : g)
      if (d.value() == rank_) {
        out.group = &group(g);
        observe::TraceSpan span(
            tracer_, [&] { return comm_event("start all_gather", in, -1, -1, out.group); });
        out.work = flat ? out.group->all_gather_flat_async(out.out, in)
                        : out.group->all_gather_async(out.parts, in);
        return out;
      }
  return Error::at("comm",
                   "rank " + std::to_string(rank_) + " is in no group of " + path.to_string());
}

Result<at::Tensor> PathRunner::finish(Started& started) {
  {
    observe::TraceSpan span(tracer_, [&] {
      return comm_event("wait all_gather", started.out.defined() ? started.out : started.parts[0],
                        -1, -1, started.group);
    });
    LOOM_TRY(started.work.wait());
  }
  if (started.parts.empty()) return started.out;
  return at::cat(started.parts, started.dim);
}

}  // namespace loom::runtime
