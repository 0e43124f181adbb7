// Work: the handle on a started call, awaited on the host or, where the backend can, on the
// device.
#include <optional>

#include "comm/call.h"

namespace loom::comm {

Status WorkState::run_hooks() {
  try {
    for (auto& hook : on_success) hook();
  } catch (const std::exception& e) {
    on_success.clear();
    return comm->fail_call(call, Outcome::failed(exception_message(e)));
  }
  on_success.clear();
  return Status::success();
}

Status WorkState::run(bool host) {
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

Status WorkState::finish_on_host() {
  Outcome outcome = op->wait_until(call.deadline);
  op.reset();
  on_device = false;
  if (outcome.ok()) return status;
  // The watchdog may have reported it first, with what it knew then.
  Status known = comm->status();
  return known.ok() ? Status(comm->fail_call(call, outcome)) : known;
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

}  // namespace loom::comm
