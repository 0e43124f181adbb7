// What the nccl backend's files share (internal to comm/): NCCL's version gates, a
// communicator with its stream (NcclHandle), a CUDA event, and the registry of a world's
// communicators that one failure aborts together.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
#error \
    "loom's nccl backend needs NCCL 2.7 or newer (ncclSend/ncclRecv); configure with LOOM_CUDA=OFF"
#endif
// Non-blocking communicators (ncclCommInitRankConfig, ncclInProgress) and ncclCommSplit.
#define LOOM_NCCL_NONBLOCKING (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))
#define LOOM_NCCL_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

#include "comm/backend.h"

namespace loom::comm {

inline std::string cuda_error(cudaError_t e) { return cudaGetErrorString(e); }
inline std::string nccl_error(ncclResult_t r) { return ncclGetErrorString(r); }

inline bool in_progress(ncclResult_t r) {
#if LOOM_NCCL_NONBLOCKING
  return r == ncclInProgress;
#else
  (void)r;
  return false;
#endif
}

// One NCCL communicator with its stream. Every NCCL call on it holds `mu`, so that an abort from
// the watchdog never overlaps one.
struct NcclHandle {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // one float on the device, for barrier()
  int device = 0;
  std::mutex mu;
  std::atomic<bool> aborted{false};

  ~NcclHandle() {
    cudaSetDevice(device);
    if (comm != nullptr && !aborted) close();
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted || comm == nullptr) return;
    aborted = true;
    ncclCommAbort(comm);
  }

  // NCCL's state of the communicator: ncclSuccess, ncclInProgress (non-blocking work under
  // way) or the asynchronous error that broke it.
  ncclResult_t state() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted || comm == nullptr) return ncclSuccess;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
    return r != ncclSuccess ? r : async;
  }

 private:
  // Flushes and frees the communicator; aborts it if the flush does not end in time (a peer
  // gone), so that exiting never hangs.
  void close() {
#if LOOM_NCCL_NONBLOCKING
    ncclResult_t state = ncclCommFinalize(comm);
    const Clock::time_point until = Clock::now() + std::chrono::seconds(10);
    while (in_progress(state) && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    if (state != ncclSuccess) {
      ncclCommAbort(comm);
      return;
    }
#endif
    ncclCommDestroy(comm);
  }
};

struct CudaEvent {
  cudaEvent_t event = nullptr;
  CudaEvent() { cudaEventCreateWithFlags(&event, cudaEventDisableTiming); }
  ~CudaEvent() {
    if (event != nullptr) cudaEventDestroy(event);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
};

// What a failed or aborted communicator tells a call that was on it.
inline Outcome aborted_outcome(const std::string& reason) {
  return Outcome::failed("nccl: the communicators of this process were aborted" +
                         (reason.empty() ? std::string() : " after: " + reason));
}

// Every communicator of one world (the process's NCCL communicators): one failure aborts them
// all, since a rank that lost one peer cannot finish the others' collectives either.
class NcclRegistry {
 public:
  void add(const std::shared_ptr<NcclHandle>& h) {
    std::lock_guard<std::mutex> lock(mu_);
    handles_.push_back(h);
  }

  void abort_all(const std::string& reason) {
    std::vector<std::shared_ptr<NcclHandle>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reason_.empty()) reason_ = reason.empty() ? "a failed call" : reason;
      for (auto& w : handles_) {
        if (auto h = w.lock()) live.push_back(std::move(h));
      }
    }
    for (auto& h : live) h->abort();
  }

  // Why the communicators were aborted; empty while they were not.
  std::string aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<NcclHandle>> handles_;
  std::string reason_;
};

}  // namespace loom::comm
