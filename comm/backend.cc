// The helpers backend.h declares: operations composed of others, deadlines, reductions and
// messages shared by the backends.
#include "comm/backend.h"

#include <ATen/ops/add.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <algorithm>
#include <cstdio>

namespace loom::comm {

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

}  // namespace loom::comm
