#include "comm/nccl_watchdog.h"

#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

namespace loom::comm {

struct Watchdog::State {
  State(int d, std::shared_ptr<NcclRegistry> r) : device(d), registry(std::move(r)) {}
  const int device;
  std::shared_ptr<NcclRegistry> registry;
  std::mutex mu;
  std::condition_variable cv;
  std::list<Entry> entries;
  bool stop = false;
  bool running = false;

  void loop() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !entries.empty(); });
      if (entries.empty()) {
        running = false;
        return;  // stopped, nothing left
      }
      std::list<Entry> polled;
      polled.swap(entries);
      lock.unlock();
      for (auto it = polled.begin(); it != polled.end();) {
        it = check(*it) ? polled.erase(it) : std::next(it);
      }
      lock.lock();
      entries.splice(entries.begin(), polled);
      if (!entries.empty()) cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  }

  // True when the entry can go: finished (or failed and reported, with its kernels gone).
  bool check(Entry& e) {
    const cudaError_t q = cudaEventQuery(e.done->event);
    if (q == cudaErrorCudartUnloading) return true;  // the process is exiting
    if (q == cudaSuccess) {
      if (!e.reported && e.h->aborted && e.on_failure) {
        // It ran on an aborted communicator: its outputs are not what was sent.
        report(e, aborted_outcome(registry->aborted()));
      }
      return true;
    }
    if (e.reported) return false;
    if (q != cudaErrorNotReady) {
      report(e, Outcome::failed("nccl: CUDA: " + cuda_error(q)));
      return false;
    }
    const ncclResult_t s = e.h->state();
    if (s != ncclSuccess && !in_progress(s)) {
      report(e, Outcome::failed("nccl: " + nccl_error(s)));
    } else if (e.h->aborted) {
      report(e, aborted_outcome(registry->aborted()));
    } else if (Clock::now() >= e.deadline) {
      report(e, Outcome::timed_out());
    }
    return false;
  }

  void report(Entry& e, const Outcome& outcome) {
    e.reported = true;
    // The callback marks the group unusable, which aborts every communicator; an abandoned
    // operation aborts them directly.
    if (e.on_failure) e.on_failure(outcome);
    registry->abort_all(outcome.detail.empty() ? "an operation passed its deadline"
                                               : outcome.detail);
  }
};

Watchdog::Watchdog(int device, std::shared_ptr<NcclRegistry> registry)
    : state_(std::make_shared<State>(device, std::move(registry))) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
}

void Watchdog::watch(Entry entry) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->entries.push_back(std::move(entry));
    if (!state_->running) {
      state_->running = true;
      std::thread([state = state_] { state->loop(); }).detach();
    }
  }
  state_->cv.notify_all();
}

}  // namespace loom::comm
