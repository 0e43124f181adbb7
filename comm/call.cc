// A call's bookkeeping: numbering it, announcing this rank's arrival on the arrival board, and
// when it fails, the message naming the ranks that did not arrive.
#include "comm/call.h"

#include <algorithm>
#include <set>
#include <thread>

#include "comm/arrivals.h"

namespace loom::comm {

namespace {

// How long a failed call waits for slow peers to announce themselves before naming the missing
// ones: a peer that died fails the call at once, while live peers may still be on their way.
constexpr double kGraceS = 1.0;

}  // namespace

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
              who_is_missing(call, /*grace=*/!outcome.peer_lost);
  }
  mark_broken(message);
  return Error{message, {}};
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

}  // namespace loom::comm
