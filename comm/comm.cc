#include "comm/comm.h"

#include <ATen/ops/add.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "comm/arrivals.h"
#include "comm/backend.h"

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

// How long a failed call waits for slow peers to announce themselves before naming the missing
// ones: a peer that died fails the call at once, while live peers may still be on their way.
constexpr double kGraceS = 1.0;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes() << " " << t.scalar_type();
  return os.str();
}

using Hooks = std::vector<std::function<void()>>;

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

// ---------------------------------------------------------------------------------------------
// Backend helpers

Outcome ThenOp::wait_until(Clock::time_point deadline) {
  Outcome outcome = inner_->wait_until(deadline);
  if (!outcome.ok() || !then_) return outcome;
  auto then = std::move(then_);
  then_ = nullptr;
  try {
    then();
  } catch (const std::exception& e) {
    return Outcome::failed(exception_message(e));
  }
  return outcome;
}

Outcome AllOp::wait_until(Clock::time_point deadline) {
  for (auto& op : ops_) {
    Outcome outcome = op->wait_until(deadline);
    if (!outcome.ok()) return outcome;
  }
  return Outcome::done();
}

bool AllOp::test() {
  for (auto& op : ops_) {
    if (!op->test()) return false;
  }
  return true;
}

Clock::time_point deadline_after(Clock::time_point start, double timeout_s) {
  return start + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(std::max(0.0, timeout_s)));
}

void reduce_into(const at::Tensor& out, const std::vector<at::Tensor>& parts, ReduceOp op) {
  LOOM_CHECK(!parts.empty()) << "reduce_into without parts";
  at::Tensor dst = out;  // the *_out kernels take a non-const handle
  const at::Tensor first = parts[0].reshape(out.sizes());
  if (parts.size() == 1 && first.data_ptr() != out.data_ptr()) dst.copy_(first);
  // ((p0 op p1) op p2) ...: the order is the parts' order, whoever computes it.
  for (size_t i = 1; i < parts.size(); ++i) {
    const at::Tensor& acc = i == 1 ? first : dst;
    const at::Tensor p = parts[i].reshape(out.sizes());
    switch (op) {
      case ReduceOp::kMax:
        at::maximum_out(dst, acc, p);
        break;
      case ReduceOp::kMin:
        at::minimum_out(dst, acc, p);
        break;
      default:
        at::add_out(dst, acc, p);
    }
  }
  if (op == ReduceOp::kAvg) dst.div_(static_cast<double>(parts.size()));
}

at::Tensor flat_view(const at::Tensor& t) { return t.view({t.numel()}); }

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s >= 1 || s == 0 ? "%.1f" : "%.2f", s);
  return buf;
}

std::string exception_message(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// ---------------------------------------------------------------------------------------------
// Work

// A peer's arrival that a call waits for: its arrival key must reach `count`.
struct Awaited {
  Rank rank;  // world rank
  std::string key;
  uint64_t count = 0;
  std::string role;  // " at the matching send", for p2p; empty for collectives
};

struct Comm::Call {
  std::string what;  // "all_reduce #17", "recv #3 from rank 2 (tag 0)"
  Clock::time_point start;
  Clock::time_point deadline;
  double timeout_s = 0;
  std::vector<Awaited> awaited;
  bool p2p = false;
};

struct WorkState : std::enable_shared_from_this<WorkState> {
  std::shared_ptr<Comm> comm;  // null when failed before starting
  Comm::Call call;
  std::shared_ptr<PendingOp> op;  // kept after a device-side wait: the device may still run it
  Hooks on_success;
  std::mutex mu;
  bool done = false;
  bool on_device = false;  // done by ordering the caller's stream after the operation
  Status status;

  Status run_hooks() {
    try {
      for (auto& hook : on_success) hook();
    } catch (const std::exception& e) {
      on_success.clear();
      return comm->fail_call(call, Outcome::failed(exception_message(e)));
    }
    on_success.clear();
    return Status::success();
  }

  // Device-side wait where the backend has one (the hooks then queue their tensor work behind
  // it on the same stream), else the host waits.
  Status run(bool host) {
    if (!host) {
      std::weak_ptr<Comm> weak = comm;
      Comm::Call watched = call;
      std::optional<Outcome> queued =
          op->wait_on_device(call.deadline, [weak, watched](const Outcome& outcome) {
            if (auto c = weak.lock()) (void)c->fail_call(watched, outcome);
          });
      if (queued) {
        if (!queued->ok()) {
          op.reset();
          return comm->fail_call(call, *queued);
        }
        on_device = true;
        return run_hooks();
      }
    }
    Outcome outcome = op->wait_until(call.deadline);
    op.reset();
    if (!outcome.ok()) {
      on_success.clear();
      return comm->fail_call(call, outcome);
    }
    return run_hooks();
  }

  // After a device-side wait: the host waits for the operation itself.
  Status finish_on_host() {
    Outcome outcome = op->wait_until(call.deadline);
    op.reset();
    on_device = false;
    if (outcome.ok()) return status;
    // The watchdog may have reported it first, with what it knew then.
    Status known = comm->status();
    return known.ok() ? Status(comm->fail_call(call, outcome)) : known;
  }
};

Error Comm::fail_call(const Call& call, const Outcome& outcome) {
  std::string head = call.what + " on group " + group_name();
  std::string message;
  if (outcome.kind == Outcome::Kind::kTimedOut) {
    message = head + " timed out after " + format_seconds(call.timeout_s) +
              " s: " + who_is_missing(call, /*grace=*/false);
    if (!outcome.detail.empty()) message += " (" + outcome.detail + ")";
  } else {
    const std::string elapsed = format_seconds(since(call.start));
    message = head + " failed after " + elapsed + " s: " + outcome.detail + "; " +
              who_is_missing(call, /*grace=*/true);
  }
  mark_broken(message);
  return Error{message, {}};
}

Status Work::wait() {
  if (!state_) return Error{"wait() on an empty Work", {}};
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) {
    state_->status = state_->run(/*host=*/false);
    state_->done = true;
  }
  return state_->status;
}

Status Work::synchronize() {
  if (!state_) return Error{"synchronize() on an empty Work", {}};
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) {
    state_->status = state_->run(/*host=*/true);
    state_->done = true;
  } else if (state_->on_device && state_->status.ok()) {
    state_->status = state_->finish_on_host();
  }
  return state_->status;
}

bool Work::is_completed() {
  if (!state_) return true;
  std::unique_lock<std::mutex> lock(state_->mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // another thread is waiting on it
  if (state_->op) return state_->op->test();
  return state_->done;
}

std::string Work::description() const {
  if (!state_ || !state_->comm) return "failed call";
  return state_->call.what + " on group " + state_->comm->group_name();
}

Work Work::failed(Error error) {
  auto state = std::make_shared<WorkState>();
  state->done = true;
  state->status = Status(std::move(error));
  return Work(std::move(state));
}

// ---------------------------------------------------------------------------------------------
// Comm

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

Result<Comm::Call> Comm::begin_collective(const char* name) {
  Call call;
  std::string key;
  uint64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_reason_.empty()) {
      return Error{
          std::string(name) + " on group " + group_name() +
              " refused: the group is unusable after an earlier failure: " + broken_reason_,
          {}};
    }
    count = ++collectives_;
    call.timeout_s = spec_.timeout_s;
  }
  call.what = std::string(name) + " #" + std::to_string(count);
  for (int m = 0; m < size(); ++m) {
    std::string k = spec_.uid + "/c/" + std::to_string(m);
    if (m == spec_.rank.value()) {
      key = k;
    } else {
      call.awaited.push_back({spec_.world_ranks[m], std::move(k), count, ""});
    }
  }
  call.start = Clock::now();
  call.deadline = deadline_after(call.start, call.timeout_s);
  if (Status s = spec_.arrivals->mark(key, count); !s.ok()) {
    std::string message = call.what + " on group " + group_name() +
                          " failed: could not announce arrival: " + s.error().message;
    mark_broken(message);
    return Error{message, {}};
  }
  return call;
}

Result<Comm::Call> Comm::begin_p2p(const char* name, int peer, int tag) {
  const bool is_send = std::string(name) == "send";
  return begin_p2p_ops({is_send ? P2POp::send(at::Tensor(), Rank(peer), tag)
                                : P2POp::recv(at::Tensor(), Rank(peer), tag)},
                       /*batch=*/false);
}

Result<Comm::Call> Comm::begin_p2p_ops(const std::vector<P2POp>& ops, bool batch) {
  const int me = static_cast<int>(spec_.rank.value());
  const char* refused_name = batch                               ? "batch_isend_irecv"
                             : ops[0].kind == P2POp::Kind::kSend ? "send"
                                                                 : "recv";
  Call call;
  call.p2p = true;
  std::vector<uint64_t> counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_reason_.empty()) {
      return Error{
          std::string(refused_name) + " on group " + group_name() +
              " refused: the group is unusable after an earlier failure: " + broken_reason_,
          {}};
    }
    for (const P2POp& op : ops) {
      const int peer = static_cast<int>(op.peer.value());
      const bool is_send = op.kind == P2POp::Kind::kSend;
      counts.push_back(peer == me ? 0 : ++p2p_counts_[{peer, op.tag, is_send}]);
    }
    call.timeout_s = spec_.timeout_s;
  }
  std::vector<std::string> parts, marks;
  for (size_t i = 0; i < ops.size(); ++i) {
    const int peer = static_cast<int>(ops[i].peer.value());
    const bool is_send = ops[i].kind == P2POp::Kind::kSend;
    const std::string tag = "(tag " + std::to_string(ops[i].tag) + ")";
    if (peer == me) {
      parts.push_back(std::string(is_send ? "send to" : "recv from") + " itself " + tag);
      marks.emplace_back();
      continue;
    }
    parts.push_back(std::string(is_send ? "send #" : "recv #") + std::to_string(counts[i]) +
                    (is_send ? " to" : " from") + " rank " + spec_.world_ranks[peer].to_string() +
                    " " + tag);
    const std::string pair = std::to_string(is_send ? me : peer) + ">" +
                             std::to_string(is_send ? peer : me) + "/" + std::to_string(ops[i].tag);
    call.awaited.push_back({spec_.world_ranks[peer], spec_.uid + (is_send ? "/r/" : "/s/") + pair,
                            counts[i],
                            is_send ? " at the matching recv" : " at the matching send"});
    marks.push_back(spec_.uid + (is_send ? "/s/" : "/r/") + pair);
  }
  if (batch) {
    call.what = "batch_isend_irecv of " + std::to_string(ops.size()) +
                (ops.size() == 1 ? " op (" : " ops (");
    for (size_t i = 0; i < parts.size(); ++i) call.what += (i ? ", " : "") + parts[i];
    call.what += ")";
  } else {
    call.what = parts[0];
  }
  call.start = Clock::now();
  call.deadline = deadline_after(call.start, call.timeout_s);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (marks[i].empty()) continue;
    if (Status s = spec_.arrivals->mark(marks[i], counts[i]); !s.ok()) {
      std::string message = call.what + " on group " + group_name() +
                            " failed: could not announce arrival: " + s.error().message;
      mark_broken(message);
      return Error{message, {}};
    }
  }
  return call;
}

std::string Comm::who_is_missing(const Call& call, bool grace) {
  std::vector<std::string> keys;
  for (const Awaited& a : call.awaited) keys.push_back(a.key);
  const Clock::time_point grace_end =
      std::min(call.deadline,
               Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(kGraceS * 1000)));
  std::vector<const Awaited*> missing;
  while (true) {
    Result<std::vector<uint64_t>> counts = spec_.arrivals->read(keys);
    if (!counts.ok()) return counts.error().message;
    missing.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      if ((*counts)[i] < call.awaited[i].count) missing.push_back(&call.awaited[i]);
    }
    if (missing.empty() || !grace || Clock::now() >= grace_end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (missing.empty()) {
    if (!call.p2p) return "every rank arrived";
    if (call.awaited.size() == 1) {
      return "rank " + call.awaited[0].rank.to_string() + " arrived" + call.awaited[0].role;
    }
    return "every peer arrived";
  }
  if (!call.p2p) {
    std::string out = missing.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < missing.size(); ++i) {
      if (i) out += ", ";
      out += missing[i]->rank.to_string();
    }
    return out + " did not arrive";
  }
  // Point to point: each missing peer with the side it did not reach, once.
  std::string out;
  std::set<std::pair<int64_t, std::string>> said;
  for (const Awaited* a : missing) {
    if (!said.insert({a->rank.value(), a->role}).second) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + a->rank.to_string() + " did not arrive" + a->role;
  }
  return out;
}

Work Comm::finish(Call call, Started started, Hooks on_success) {
  if (!started.ok()) {
    std::string message =
        call.what + " on group " + group_name() + " failed: " + started.error().message;
    mark_broken(message);
    return Work::failed(Error{message, {}});
  }
  auto state = std::make_shared<WorkState>();
  state->comm = shared_from_this();
  state->call = std::move(call);
  state->op = std::move(started).value();
  state->on_success = std::move(on_success);
  return Work(std::move(state));
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
