#include "exec/comm/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
#error \
    "loom's nccl backend needs NCCL 2.7 or newer (ncclSend/ncclRecv); configure with LOOM_CUDA=OFF"
#endif

#include "exec/comm/backend.h"
#include "exec/comm/store.h"

namespace loom::comm {
namespace {

std::string cuda_error(cudaError_t e) { return cudaGetErrorString(e); }
std::string nccl_error(ncclResult_t r) { return ncclGetErrorString(r); }

Result<ncclDataType_t> nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case at::kBFloat16:
      return ncclBfloat16;
#endif
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
      return ncclUint8;
    default:
      return Error{std::string("the nccl backend cannot reduce ") + c10::toString(t) + " tensors",
                   {}};
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    default:
      return ncclSum;
  }
}

// One NCCL communicator with its stream. Abort (after a failure) and destroy are idempotent.
struct NcclHandle {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // one float on the device, for barrier()
  int device = 0;
  std::mutex mu;
  bool aborted = false;

  ~NcclHandle() {
    cudaSetDevice(device);
    if (comm != nullptr && !aborted) ncclCommDestroy(comm);
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted || comm == nullptr) return;
    aborted = true;
    ncclCommAbort(comm);
  }
};

// Completion of work enqueued on the communicator's stream: an event polled against the deadline,
// with NCCL's asynchronous errors (a peer gone) checked on the way.
class NcclOp : public PendingOp {
 public:
  NcclOp(std::shared_ptr<NcclHandle> h, cudaEvent_t done, std::vector<at::Tensor> keep)
      : h_(std::move(h)), done_(done), keep_(std::move(keep)) {}
  ~NcclOp() override {
    if (!finished_ && cudaEventQuery(done_) != cudaSuccess) {
      // Kernels of an unfinished call may still write into its tensors: keep them.
      new std::vector<at::Tensor>(std::move(keep_));
    }
    cudaEventDestroy(done_);
  }

  Outcome wait_until(Clock::time_point deadline) override {
    auto pause = std::chrono::microseconds(20);
    cudaSetDevice(h_->device);
    while (true) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) {
        finished_ = true;
        return Outcome::done();
      }
      if (q != cudaErrorNotReady) return Outcome::failed("nccl: CUDA: " + cuda_error(q));
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(h_->mu);
        if (!h_->aborted) ncclCommGetAsyncError(h_->comm, &async);
      }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      if (async == ncclInProgress) async = ncclSuccess;
#endif
      if (async != ncclSuccess) {
        return Outcome::failed("nccl: " + nccl_error(async));
      }
      if (Clock::now() >= deadline) return Outcome::timed_out();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  bool test() override { return cudaEventQuery(done_) != cudaErrorNotReady; }

 private:
  std::shared_ptr<NcclHandle> h_;
  cudaEvent_t done_;
  std::vector<at::Tensor> keep_;
  bool finished_ = false;
};

struct NcclWorld {
  std::shared_ptr<RendezvousStore> store;
  int device = 0;
};

// Members of group `uid` agree on an NCCL unique id through the store, wait until all of them
// are there (so that ncclCommInitRank cannot hang), then create the communicator.
Result<std::shared_ptr<NcclHandle>> connect(const NcclWorld& world, const GroupSpec& spec) {
  const int rank = static_cast<int>(spec.rank.value());
  const int size = static_cast<int>(spec.world_ranks.size());
  const std::string prefix = "loom/nccl/" + spec.uid + "/";
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return Error{"ncclGetUniqueId failed: " + nccl_error(r), {}};
    }
    LOOM_TRY(world.store->set(prefix + "id", std::string(id.internal, sizeof id.internal)));
  } else {
    LOOM_ASSIGN_OR_RETURN(std::string bytes, world.store->get(prefix + "id"));
    if (bytes.size() != sizeof id.internal) return Error{"malformed NCCL unique id in store", {}};
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  }
  LOOM_TRY(world.store->set(prefix + "ready/" + std::to_string(rank), "1"));
  for (int r = 0; r < size; ++r) {
    if (!world.store->get(prefix + "ready/" + std::to_string(r)).ok()) {
      return Error{"rank " + spec.world_ranks[r].to_string() + " did not join group " + spec.name +
                       " in time",
                   {}};
    }
  }
  auto h = std::make_shared<NcclHandle>();
  h->device = world.device;
  if (cudaError_t e = cudaSetDevice(world.device); e != cudaSuccess) {
    return Error{"cudaSetDevice(" + std::to_string(world.device) + "): " + cuda_error(e), {}};
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return Error{"cudaStreamCreate: " + cuda_error(e), {}};
  }
  if (cudaError_t e = cudaMalloc(&h->scratch, sizeof(float)); e != cudaSuccess) {
    return Error{"cudaMalloc: " + cuda_error(e), {}};
  }
  if (ncclResult_t r = ncclCommInitRank(&h->comm, size, id, rank); r != ncclSuccess) {
    h->comm = nullptr;
    return Error{"ncclCommInitRank failed: " + nccl_error(r), {}};
  }
  return h;
}

class NcclComm : public Comm {
 public:
  NcclComm(GroupSpec spec, std::shared_ptr<NcclWorld> world, std::shared_ptr<NcclHandle> h)
      : Comm(std::move(spec)), world_(std::move(world)), h_(std::move(h)) {}

  const char* backend_name() const override { return "nccl"; }

 protected:
  void on_broken() override { h_->abort(); }

  Status on_device(const at::Tensor& t) const {
    if (!t.is_cuda()) {
      return Error{std::string("the nccl backend needs CUDA tensors, got a ") +
                       c10::DeviceTypeName(t.device().type()) + " tensor",
                   {}};
    }
    if (t.device().index() != h_->device) {
      return Error{"the nccl backend of this rank uses cuda:" + std::to_string(h_->device) +
                       ", got a tensor on " + t.device().str(),
                   {}};
    }
    return Status::success();
  }

  // Orders the communicator's stream after work already queued on the default stream, enqueues,
  // and records the event that completion is polled on.
  template <class F>
  Started enqueue(const char* what, std::vector<at::Tensor> keep, F&& f) {
    for (const at::Tensor& t : keep) LOOM_TRY(on_device(t));
    cudaSetDevice(h_->device);
    cudaEvent_t ready = nullptr, done = nullptr;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaEventRecord(ready, cudaStreamLegacy);
    cudaStreamWaitEvent(h_->stream, ready, 0);
    cudaEventDestroy(ready);
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(h_->mu);
      r = h_->aborted ? ncclInvalidUsage : f();
    }
    if (r != ncclSuccess) {
      cudaEventDestroy(done);
      return Error{std::string("the nccl backend could not start ") + what + ": " + nccl_error(r),
                   {}};
    }
    if (cudaError_t e = cudaEventRecord(done, h_->stream); e != cudaSuccess) {
      cudaEventDestroy(done);
      return Error{"cudaEventRecord: " + cuda_error(e), {}};
    }
    return std::shared_ptr<PendingOp>(std::make_shared<NcclOp>(h_, done, std::move(keep)));
  }

  Started start_send(const at::Tensor& t, int dst, int) override {
    return enqueue("send", {t}, [&] {
      return ncclSend(t.data_ptr(), t.nbytes(), ncclInt8, dst, h_->comm, h_->stream);
    });
  }

  Started start_recv(const at::Tensor& t, int src, int) override {
    return enqueue("recv", {t}, [&] {
      return ncclRecv(t.data_ptr(), t.nbytes(), ncclInt8, src, h_->comm, h_->stream);
    });
  }

  Started start_all_reduce(const at::Tensor& t, ReduceOp op) override {
    LOOM_TRY(on_device(t));
    LOOM_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_type(t.scalar_type()));
    return enqueue("all_reduce", {t}, [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, nccl_op(op), h_->comm,
                           h_->stream);
    });
  }

  Started start_all_gather(const at::Tensor& out_flat, const at::Tensor& in) override {
    return enqueue("all_gather", {out_flat, in}, [&] {
      return ncclAllGather(in.data_ptr(), out_flat.data_ptr(), in.nbytes(), ncclInt8, h_->comm,
                           h_->stream);
    });
  }

  Started start_reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                               ReduceOp op) override {
    LOOM_TRY(on_device(out));
    LOOM_ASSIGN_OR_RETURN(ncclDataType_t type, nccl_type(out.scalar_type()));
    return enqueue("reduce_scatter", {out, in_flat}, [&] {
      return ncclReduceScatter(in_flat.data_ptr(), out.data_ptr(), out.numel(), type, nccl_op(op),
                               h_->comm, h_->stream);
    });
  }

  Started start_all_to_all(const std::vector<at::Tensor>& out,
                           const std::vector<at::Tensor>& in) override {
    std::vector<at::Tensor> keep(in);
    keep.insert(keep.end(), out.begin(), out.end());
    return enqueue("all_to_all", keep, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int j = 0; j < size() && r == ncclSuccess; ++j) {
        if (in[j].nbytes() > 0) {
          r = ncclSend(in[j].data_ptr(), in[j].nbytes(), ncclInt8, j, h_->comm, h_->stream);
        }
        if (r == ncclSuccess && out[j].nbytes() > 0) {
          r = ncclRecv(out[j].data_ptr(), out[j].nbytes(), ncclInt8, j, h_->comm, h_->stream);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  Started start_broadcast(const at::Tensor& t, int root) override {
    return enqueue("broadcast", {t}, [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclInt8, root, h_->comm,
                           h_->stream);
    });
  }

  Started start_barrier() override {
    return enqueue("barrier", {}, [&] {
      return ncclAllReduce(h_->scratch, h_->scratch, 1, ncclFloat32, ncclSum, h_->comm, h_->stream);
    });
  }

  Result<std::shared_ptr<Comm>> make_group(const std::vector<int>&, GroupSpec spec,
                                           Clock::time_point) override {
    if (!spec.rank.valid()) return std::shared_ptr<Comm>();
    LOOM_ASSIGN_OR_RETURN(auto h, connect(*world_, spec));
    return std::shared_ptr<Comm>(std::make_shared<NcclComm>(std::move(spec), world_, h));
  }

 private:
  std::shared_ptr<NcclWorld> world_;
  std::shared_ptr<NcclHandle> h_;
};

}  // namespace

Status nccl_usable() {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return Error{"no usable CUDA device in this process (" + cuda_error(e) + ")", {}};
  }
  if (devices == 0) return Error{"no CUDA device in this process", {}};
  return Status::success();
}

Result<std::shared_ptr<Comm>> make_nccl_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, int local_rank, double timeout_s) {
  LOOM_TRY(nccl_usable());
  int devices = 0;
  cudaGetDeviceCount(&devices);
  auto world = std::make_shared<NcclWorld>();
  world->store = std::move(store);
  world->device = local_rank >= 0 ? local_rank : rank % devices;
  if (world->device >= devices) {
    return Error{"LOCAL_RANK=" + std::to_string(local_rank) + " but this machine has " +
                     std::to_string(devices) + " CUDA devices",
                 {}};
  }
  GroupSpec spec;
  spec.name = "world";
  spec.uid = "w";
  for (int r = 0; r < size; ++r) spec.world_ranks.emplace_back(r);
  spec.rank = Rank(rank);
  spec.timeout_s = timeout_s;
  spec.arrivals = world->store->arrivals();
  LOOM_ASSIGN_OR_RETURN(auto h, connect(*world, spec));
  return std::shared_ptr<Comm>(std::make_shared<NcclComm>(std::move(spec), world, h));
}

}  // namespace loom::comm
