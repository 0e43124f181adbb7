// What backends implement and share: a started operation awaited against a deadline, and tensor
// helpers used by more than one backend. Not for users of Comm.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace loom::comm {

struct Outcome {
  enum class Kind { kDone, kTimedOut, kFailed };
  Kind kind = Kind::kDone;
  std::string detail;  // what the backend said, for kFailed (and kTimedOut when it knows more)
  // kFailed because a peer's process is gone (the detail names it): the failure need not wait
  // for slow peers to announce themselves before naming the missing ones.
  bool peer_lost = false;

  static Outcome done() { return {}; }
  static Outcome timed_out(std::string detail = "") { return {Kind::kTimedOut, std::move(detail)}; }
  static Outcome failed(std::string detail) { return {Kind::kFailed, std::move(detail)}; }
  static Outcome lost(std::string detail) { return {Kind::kFailed, std::move(detail), true}; }
  bool ok() const { return kind == Kind::kDone; }
};

// A started backend operation. wait_until and test are called from one thread at a time.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Blocks until the operation finished or `deadline` passed; never throws.
  virtual Outcome wait_until(Clock::time_point deadline) = 0;
  // True when wait_until would return at once.
  virtual bool test() = 0;
  // Device-side completion (nccl): makes the caller's current CUDA stream wait for the operation
  // instead of blocking the host, and has a watchdog call `on_failure` once, from another
  // thread, if the operation fails or is still running at `deadline`. The outcome says whether
  // the wait could be queued; nullopt: this operation can only be awaited on the host.
  virtual std::optional<Outcome> wait_on_device(Clock::time_point deadline,
                                                std::function<void(Outcome)> on_failure) {
    return std::nullopt;
  }
};

// An operation that finished when it was started (or failed to).
class FinishedOp : public PendingOp {
 public:
  explicit FinishedOp(Outcome outcome = Outcome::done()) : outcome_(std::move(outcome)) {}
  Outcome wait_until(Clock::time_point) override { return outcome_; }
  bool test() override { return true; }

 private:
  Outcome outcome_;
};

// Runs `then` once after the inner operation succeeded (copying out of staging buffers, local
// reductions); an exception from it turns into a failure.
class ThenOp : public PendingOp {
 public:
  ThenOp(std::shared_ptr<PendingOp> inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  Outcome wait_until(Clock::time_point deadline) override;
  bool test() override { return inner_->test(); }

 private:
  std::shared_ptr<PendingOp> inner_;
  std::function<void()> then_;
};

// Several operations started together (the default batch_isend_irecv): done when all are,
// failed with the first failure.
class AllOp : public PendingOp {
 public:
  explicit AllOp(std::vector<std::shared_ptr<PendingOp>> ops) : ops_(std::move(ops)) {}
  Outcome wait_until(Clock::time_point deadline) override;
  bool test() override;

 private:
  std::vector<std::shared_ptr<PendingOp>> ops_;
};

// `out` = op over `parts` in order, ((p0 op p1) op p2) ... (every part has out's element count),
// with no temporary: out may be parts[0] itself and must not overlap any other part.
void reduce_into(const at::Tensor& out, const std::vector<at::Tensor>& parts, ReduceOp op);

// `start` plus `timeout_s` seconds (a negative timeout counts as none): a call's deadline.
Clock::time_point deadline_after(Clock::time_point start, double timeout_s);

// 1-D view of a contiguous tensor.
at::Tensor flat_view(const at::Tensor& t);

// "5.0", "0.25": seconds as messages show them.
std::string format_seconds(double s);

// The message of a LibTorch or standard exception, without LibTorch's backtrace.
std::string exception_message(const std::exception& e);

}  // namespace loom::comm
