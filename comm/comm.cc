#include "comm/comm.h"

#include <optional>
#include <set>
#include <sstream>

#include "comm/arrivals.h"
#include "comm/call.h"

namespace loom::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes() << " " << t.scalar_type();
  return os.str();
}

// Backends see contiguous tensors only; a non-contiguous output is staged and copied back.
at::Tensor stage_out(const at::Tensor& t, Hooks& copy_back) {
  if (t.is_contiguous()) return t;
  at::Tensor buf = t.contiguous();
  copy_back.push_back([t, buf] { t.copy_(buf); });
  return buf;
}

at::Tensor stage_in(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

Hooks concat(Hooks a, Hooks b) {
  for (auto& h : b) a.push_back(std::move(h));
  return a;
}

}  // namespace

Comm::Comm(GroupSpec spec) : spec_(std::move(spec)) {
  if (!spec_.arrivals) spec_.arrivals = std::make_shared<NoArrivals>("no arrival board");
}

Comm::~Comm() = default;

std::string Comm::group_name() const {
  std::string out = spec_.name + "[";
  for (size_t i = 0; i < spec_.world_ranks.size(); ++i) {
    if (i) out += ",";
    out += spec_.world_ranks[i].to_string();
  }
  return out + "]";
}

double Comm::timeout_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_.timeout_s;
}

void Comm::set_timeout(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  spec_.timeout_s = seconds;
}

uint64_t Comm::collective_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return collectives_;
}

bool Comm::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !broken_reason_.empty();
}

Status Comm::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_reason_.empty()) return Status::success();
  return Error{broken_reason_, {}};
}

void Comm::mark_broken(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_reason_.empty()) return;
    broken_reason_ = reason;
  }
  on_broken();
}

Status Comm::check_peer(const char* what, Rank peer) const {
  if (peer.value() < 0 || peer.value() >= size()) {
    return Error{std::string(what) + " on group " + group_name() + ": rank " + peer.to_string() +
                     " is not in the group (ranks 0.." + std::to_string(size() - 1) + ")",
                 {}};
  }
  return Status::success();
}

namespace {

Status check_tensor(const std::string& where, const char* role, const at::Tensor& t) {
  if (!t.defined()) return Error{where + ": " + role + " is an undefined tensor", {}};
  if (t.layout() != at::kStrided) return Error{where + ": " + role + " must be a dense tensor", {}};
  return Status::success();
}

Status check_same_dtype(const std::string& where, const char* role, const at::Tensor& t,
                        at::ScalarType dtype) {
  if (t.scalar_type() != dtype) {
    return Error{where + ": " + role + " is " + std::string(c10::toString(t.scalar_type())) +
                     ", expected " + c10::toString(dtype),
                 {}};
  }
  return Status::success();
}

Status check_reduce_op(const std::string& where, const at::Tensor& t, ReduceOp op) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type())) {
    return Error{where + ": avg needs a floating-point tensor, got " +
                     std::string(c10::toString(t.scalar_type())),
                 {}};
  }
  return Status::success();
}

ReduceOp backend_op(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace

#define LOOM_COMM_CHECK(expr)                                                    \
  do {                                                                           \
    Status loom_comm_status_ = (expr);                                           \
    if (!loom_comm_status_.ok()) return Work::failed(loom_comm_status_.error()); \
  } while (0)

// Holds issue_mu_ from numbering the call to handing it to the backend, so that calls issued
// from several threads reach the backend in the order of their numbers.
#define LOOM_COMM_BEGIN(call, expr)                                    \
  std::unique_lock<std::mutex> call##_issue(issue_mu_);                \
  Result<Call> call##_result = (expr);                                 \
  if (!call##_result.ok()) return Work::failed(call##_result.error()); \
  Call call = std::move(call##_result).value()

Work Comm::send_async(const at::Tensor& tensor, Rank dst, int tag) {
  const std::string where = "send on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "tensor", tensor));
  LOOM_COMM_CHECK(check_peer("send", dst));
  if (dst == rank()) return Work::failed(Error{where + ": cannot send to itself", {}});
  if (tag < 0) return Work::failed(Error{where + ": tag must be >= 0", {}});
  LOOM_COMM_BEGIN(call, begin_p2p("send", static_cast<int>(dst.value()), tag));
  return finish(std::move(call), start_send(stage_in(tensor), static_cast<int>(dst.value()), tag),
                {});
}

Work Comm::recv_async(const at::Tensor& tensor, Rank src, int tag) {
  const std::string where = "recv on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "tensor", tensor));
  LOOM_COMM_CHECK(check_peer("recv", src));
  if (src == rank()) return Work::failed(Error{where + ": cannot receive from itself", {}});
  if (tag < 0) return Work::failed(Error{where + ": tag must be >= 0", {}});
  LOOM_COMM_BEGIN(call, begin_p2p("recv", static_cast<int>(src.value()), tag));
  Hooks copy_back;
  at::Tensor buf = stage_out(tensor, copy_back);
  return finish(std::move(call), start_recv(buf, static_cast<int>(src.value()), tag),
                std::move(copy_back));
}

Work Comm::batch_isend_irecv(const std::vector<P2POp>& ops) {
  const std::string where = "batch_isend_irecv on group " + group_name();
  if (ops.empty()) return Work::failed(Error{where + ": no ops given", {}});
  // Sends to this rank, by tag, in order: each is matched by a recv from this rank.
  std::map<int, std::vector<size_t>> self_sends, self_recvs;
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string role = "ops[" + std::to_string(i) + "]";
    LOOM_COMM_CHECK(check_tensor(where, role.c_str(), ops[i].tensor));
    LOOM_COMM_CHECK(check_peer("batch_isend_irecv", ops[i].peer));
    if (ops[i].tag < 0) return Work::failed(Error{where + ": " + role + ": tag must be >= 0", {}});
    if (ops[i].peer == rank()) {
      (ops[i].kind == P2POp::Kind::kSend ? self_sends : self_recvs)[ops[i].tag].push_back(i);
    }
  }
  for (const auto& [tag, sends] : self_sends) {
    const std::vector<size_t>& recvs = self_recvs[tag];
    if (recvs.size() != sends.size()) {
      return Work::failed(Error{where + ": " + std::to_string(sends.size()) +
                                    " send(s) to this rank with tag " + std::to_string(tag) +
                                    " but " + std::to_string(recvs.size()) +
                                    " recv(s) from it; each needs its match in the batch",
                                {}});
    }
    for (size_t k = 0; k < sends.size(); ++k) {
      const at::Tensor& from = ops[sends[k]].tensor;
      const at::Tensor& into = ops[recvs[k]].tensor;
      if (from.numel() != into.numel() || from.scalar_type() != into.scalar_type()) {
        return Work::failed(Error{where + ": ops[" + std::to_string(recvs[k]) + "] receives " +
                                      shape_of(into) + " from this rank, but the matching send " +
                                      "ops[" + std::to_string(sends[k]) + "] is " + shape_of(from),
                                  {}});
      }
    }
  }
  for (const auto& [tag, recvs] : self_recvs) {
    if (self_sends[tag].size() != recvs.size()) {
      return Work::failed(Error{where + ": " + std::to_string(recvs.size()) +
                                    " recv(s) from this rank with tag " + std::to_string(tag) +
                                    " but " + std::to_string(self_sends[tag].size()) +
                                    " send(s) to it; each needs its match in the batch",
                                {}});
    }
  }
  LOOM_COMM_BEGIN(call, begin_p2p_ops(ops, /*batch=*/true));
  Hooks copy_back;
  std::vector<P2POp> staged = ops;
  for (P2POp& op : staged) {
    op.tensor =
        op.kind == P2POp::Kind::kSend ? stage_in(op.tensor) : stage_out(op.tensor, copy_back);
  }
  return finish(std::move(call), start_batch(staged), std::move(copy_back));
}

Comm::Started Comm::start_batch(const std::vector<P2POp>& ops) {
  const int me = static_cast<int>(rank().value());
  std::map<int, std::vector<at::Tensor>> to_self;  // by tag, in order
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Kind::kSend && op.peer == rank()) to_self[op.tag].push_back(op.tensor);
  }
  std::map<int, size_t> taken;
  std::vector<std::shared_ptr<PendingOp>> started;
  for (const P2POp& op : ops) {
    const int peer = static_cast<int>(op.peer.value());
    if (peer == me) {
      if (op.kind == P2POp::Kind::kRecv) {
        flat_view(op.tensor).copy_(flat_view(to_self[op.tag][taken[op.tag]++]));
      }
      continue;
    }
    // Ops already started are abandoned if a later one cannot start: finish() then makes the
    // group unusable.
    LOOM_ASSIGN_OR_RETURN(std::shared_ptr<PendingOp> one,
                          op.kind == P2POp::Kind::kSend ? start_send(op.tensor, peer, op.tag)
                                                        : start_recv(op.tensor, peer, op.tag));
    started.push_back(std::move(one));
  }
  return std::shared_ptr<PendingOp>(std::make_shared<AllOp>(std::move(started)));
}

Work Comm::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  const std::string where = "all_reduce on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "tensor", tensor));
  LOOM_COMM_CHECK(check_reduce_op(where, tensor, op));
  LOOM_COMM_BEGIN(call, begin_collective("all_reduce"));
  Hooks copy_back, post;
  at::Tensor buf = stage_out(tensor, copy_back);
  if (op == ReduceOp::kAvg) {
    const double n = size();
    post.push_back([buf, n] { buf.div_(n); });
  }
  return finish(std::move(call), start_all_reduce(buf, backend_op(op)),
                concat(std::move(post), std::move(copy_back)));
}

Work Comm::all_gather_async(const std::vector<at::Tensor>& out, const at::Tensor& in) {
  const std::string where = "all_gather on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "in", in));
  if (static_cast<int>(out.size()) != size()) {
    return Work::failed(Error{where + ": out has " + std::to_string(out.size()) +
                                  " tensors, expected " + std::to_string(size()) +
                                  " (one per rank)",
                              {}});
  }
  for (const at::Tensor& o : out) {
    LOOM_COMM_CHECK(check_tensor(where, "out[j]", o));
    LOOM_COMM_CHECK(check_same_dtype(where, "out[j]", o, in.scalar_type()));
    if (o.numel() != in.numel()) {
      return Work::failed(Error{where + ": out[j] is " + shape_of(o) + " but in is " +
                                    shape_of(in) + "; every piece needs in's element count",
                                {}});
    }
  }
  LOOM_COMM_BEGIN(call, begin_collective("all_gather"));
  at::Tensor flat = in.new_empty({size() * in.numel()});
  const int64_t n = in.numel();
  Hooks unpack{[out, flat, n] {
    for (size_t j = 0; j < out.size(); ++j) {
      out[j].copy_(flat.narrow(0, static_cast<int64_t>(j) * n, n).view(out[j].sizes()));
    }
  }};
  return finish(std::move(call), start_all_gather(flat, stage_in(in)), std::move(unpack));
}

Work Comm::all_gather_flat_async(const at::Tensor& out, const at::Tensor& in) {
  const std::string where = "all_gather on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "in", in));
  LOOM_COMM_CHECK(check_tensor(where, "out", out));
  LOOM_COMM_CHECK(check_same_dtype(where, "out", out, in.scalar_type()));
  if (out.numel() != size() * in.numel()) {
    return Work::failed(Error{where + ": out is " + shape_of(out) + " but in is " + shape_of(in) +
                                  "; out needs " + std::to_string(size()) + " x " +
                                  std::to_string(in.numel()) + " elements",
                              {}});
  }
  LOOM_COMM_BEGIN(call, begin_collective("all_gather"));
  Hooks copy_back;
  at::Tensor buf = stage_out(out, copy_back);
  return finish(std::move(call), start_all_gather(buf, stage_in(in)), std::move(copy_back));
}

Work Comm::reduce_scatter_async(const at::Tensor& out, const std::vector<at::Tensor>& in,
                                ReduceOp op) {
  const std::string where = "reduce_scatter on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "out", out));
  LOOM_COMM_CHECK(check_reduce_op(where, out, op));
  if (static_cast<int>(in.size()) != size()) {
    return Work::failed(Error{where + ": in has " + std::to_string(in.size()) +
                                  " tensors, expected " + std::to_string(size()) +
                                  " (one per rank)",
                              {}});
  }
  for (const at::Tensor& i : in) {
    LOOM_COMM_CHECK(check_tensor(where, "in[j]", i));
    LOOM_COMM_CHECK(check_same_dtype(where, "in[j]", i, out.scalar_type()));
    if (i.numel() != out.numel()) {
      return Work::failed(Error{where + ": in[j] is " + shape_of(i) + " but out is " +
                                    shape_of(out) + "; every piece needs out's element count",
                                {}});
    }
  }
  LOOM_COMM_BEGIN(call, begin_collective("reduce_scatter"));
  const int64_t n = out.numel();
  at::Tensor flat = out.new_empty({size() * n});
  for (int j = 0; j < size(); ++j) flat.narrow(0, j * n, n).copy_(in[j].reshape({n}));
  Hooks copy_back, post;
  at::Tensor buf = stage_out(out, copy_back);
  if (op == ReduceOp::kAvg) {
    const double ranks = size();
    post.push_back([buf, ranks] { buf.div_(ranks); });
  }
  return finish(std::move(call), start_reduce_scatter(buf, flat, backend_op(op)),
                concat(std::move(post), std::move(copy_back)));
}

Work Comm::reduce_scatter_flat_async(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  const std::string where = "reduce_scatter on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "out", out));
  LOOM_COMM_CHECK(check_tensor(where, "in", in));
  LOOM_COMM_CHECK(check_same_dtype(where, "in", in, out.scalar_type()));
  LOOM_COMM_CHECK(check_reduce_op(where, out, op));
  if (in.numel() != size() * out.numel()) {
    return Work::failed(Error{where + ": in is " + shape_of(in) + " but out is " + shape_of(out) +
                                  "; in needs " + std::to_string(size()) + " x " +
                                  std::to_string(out.numel()) + " elements",
                              {}});
  }
  LOOM_COMM_BEGIN(call, begin_collective("reduce_scatter"));
  Hooks copy_back, post;
  at::Tensor buf = stage_out(out, copy_back);
  if (op == ReduceOp::kAvg) {
    const double ranks = size();
    post.push_back([buf, ranks] { buf.div_(ranks); });
  }
  return finish(std::move(call), start_reduce_scatter(buf, stage_in(in), backend_op(op)),
                concat(std::move(post), std::move(copy_back)));
}

Work Comm::all_to_all_async(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in) {
  const std::string where = "all_to_all on group " + group_name();
  if (static_cast<int>(out.size()) != size() || static_cast<int>(in.size()) != size()) {
    return Work::failed(Error{where + ": out has " + std::to_string(out.size()) + " and in has " +
                                  std::to_string(in.size()) + " tensors, expected " +
                                  std::to_string(size()) + " each (one per rank)",
                              {}});
  }
  LOOM_COMM_CHECK(check_tensor(where, "in[0]", in[0]));
  const at::ScalarType dtype = in[0].scalar_type();
  for (int j = 0; j < size(); ++j) {
    LOOM_COMM_CHECK(check_tensor(where, "in[j]", in[j]));
    LOOM_COMM_CHECK(check_tensor(where, "out[j]", out[j]));
    LOOM_COMM_CHECK(check_same_dtype(where, "in[j]", in[j], dtype));
    LOOM_COMM_CHECK(check_same_dtype(where, "out[j]", out[j], dtype));
  }
  LOOM_COMM_BEGIN(call, begin_collective("all_to_all"));
  Hooks copy_back;
  std::vector<at::Tensor> outs, ins;
  for (int j = 0; j < size(); ++j) {
    outs.push_back(stage_out(out[j], copy_back));
    ins.push_back(stage_in(in[j]));
  }
  return finish(std::move(call), start_all_to_all(outs, ins), std::move(copy_back));
}

Work Comm::broadcast_async(const at::Tensor& tensor, Rank root) {
  const std::string where = "broadcast on group " + group_name();
  LOOM_COMM_CHECK(check_tensor(where, "tensor", tensor));
  LOOM_COMM_CHECK(check_peer("broadcast", root));
  LOOM_COMM_BEGIN(call, begin_collective("broadcast"));
  Hooks copy_back;
  at::Tensor buf = stage_out(tensor, copy_back);
  return finish(std::move(call), start_broadcast(buf, static_cast<int>(root.value())),
                std::move(copy_back));
}

Status Comm::send(const at::Tensor& t, Rank dst, int tag) { return send_async(t, dst, tag).wait(); }
Status Comm::recv(const at::Tensor& t, Rank src, int tag) { return recv_async(t, src, tag).wait(); }
Status Comm::all_reduce(const at::Tensor& t, ReduceOp op) { return all_reduce_async(t, op).wait(); }
Status Comm::all_gather(const std::vector<at::Tensor>& out, const at::Tensor& in) {
  return all_gather_async(out, in).wait();
}
Status Comm::all_gather_flat(const at::Tensor& out, const at::Tensor& in) {
  return all_gather_flat_async(out, in).wait();
}
Status Comm::reduce_scatter(const at::Tensor& out, const std::vector<at::Tensor>& in, ReduceOp op) {
  return reduce_scatter_async(out, in, op).wait();
}
Status Comm::reduce_scatter_flat(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  return reduce_scatter_flat_async(out, in, op).wait();
}
Status Comm::all_to_all(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in) {
  return all_to_all_async(out, in).wait();
}
Status Comm::broadcast(const at::Tensor& t, Rank root) { return broadcast_async(t, root).wait(); }

Status Comm::barrier() {
  std::unique_lock<std::mutex> issue(issue_mu_);
  Result<Call> call = begin_collective("barrier");
  if (!call.ok()) return call.error();
  Work work = finish(std::move(call).value(), start_barrier(), {});
  issue.unlock();
  return work.synchronize();  // a barrier's result is that the host got past it
}

Result<std::shared_ptr<Comm>> Comm::new_group(const std::vector<Rank>& ranks, std::string name) {
  const std::string where = "new_group on group " + group_name();
  if (ranks.empty()) return Error{where + ": no ranks given", {}};
  std::set<int64_t> seen;
  std::vector<int> members;
  int my_position = -1;
  for (Rank r : ranks) {
    LOOM_TRY(check_peer("new_group", r));
    if (!seen.insert(r.value()).second) {
      return Error{where + ": rank " + r.to_string() + " is listed twice", {}};
    }
    if (r == rank()) my_position = static_cast<int>(members.size());
    members.push_back(static_cast<int>(r.value()));
  }
  std::unique_lock<std::mutex> issue(issue_mu_);
  LOOM_ASSIGN_OR_RETURN(Call call, begin_collective("new_group"));
  GroupSpec sub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sub.uid = spec_.uid + "." + std::to_string(++groups_made_);
    sub.timeout_s = spec_.timeout_s;
  }
  sub.name = name.empty() ? sub.uid : std::move(name);
  for (int m : members) sub.world_ranks.push_back(spec_.world_ranks[m]);
  sub.rank = Rank(my_position);
  sub.arrivals = spec_.arrivals;
  Result<std::shared_ptr<Comm>> group = make_group(members, std::move(sub), call.deadline);
  if (!group.ok()) {
    const std::string elapsed = format_seconds(since(call.start));
    std::string message = call.what + " on group " + group_name() + " failed after " + elapsed +
                          " s: " + group.error().message + "; " +
                          who_is_missing(call, /*grace=*/true);
    mark_broken(message);
    return Error{message, {}};
  }
  return group;
}

}  // namespace loom::comm
