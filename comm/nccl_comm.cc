#include "comm/nccl_comm.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#if LOOM_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "comm/backend.h"
#include "comm/nccl_handle.h"
#include "comm/nccl_watchdog.h"
#include "comm/store.h"

namespace loom::comm {
namespace {

// The stream the caller's tensor work runs on: LibTorch's current stream of `device` where
// LibTorch has CUDA; else the legacy default stream (such a LibTorch makes no CUDA tensors).
cudaStream_t compute_stream(int device) {
#if LOOM_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

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

// Waits until non-blocking work on `h` (initialisation, a split, connection set-up of a call)
// is done or `deadline` passed; returns NCCL's state then (ncclInProgress: out of time).
ncclResult_t settle(NcclHandle& h, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(20);
  while (true) {
    const ncclResult_t s = h.state();
    if (!in_progress(s) || Clock::now() >= deadline) return s;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

struct NcclWorld {
  std::shared_ptr<RendezvousStore> store;
  int device = 0;
  std::shared_ptr<NcclRegistry> registry = std::make_shared<NcclRegistry>();
  std::shared_ptr<Watchdog> watchdog;
};

// Completion of work enqueued on a communicator's stream.
class NcclOp : public PendingOp {
 public:
  NcclOp(std::shared_ptr<NcclHandle> h, std::shared_ptr<NcclWorld> world,
         std::shared_ptr<CudaEvent> done, std::vector<at::Tensor> keep, Clock::time_point deadline)
      : h_(std::move(h)),
        world_(std::move(world)),
        done_(std::move(done)),
        keep_(std::move(keep)),
        deadline_(deadline) {}

  ~NcclOp() override {
    // Kernels of an unfinished call may still use its tensors: the watchdog keeps them until
    // the call ends (or aborts everything at its deadline).
    if (!finished_ && !watched_ && cudaEventQuery(done_->event) == cudaErrorNotReady) {
      world_->watchdog->watch({h_, done_, std::move(keep_), deadline_, nullptr});
    }
  }

  Outcome wait_until(Clock::time_point deadline) override {
    auto pause = std::chrono::microseconds(20);
    cudaSetDevice(h_->device);
    while (true) {
      if (h_->aborted) return aborted_outcome(world_->registry->aborted());
      const cudaError_t q = cudaEventQuery(done_->event);
      if (q == cudaSuccess) {
        // An abort lets the kernels end early: the outputs are then not what was sent.
        if (h_->aborted) return aborted_outcome(world_->registry->aborted());
        finished_ = true;
        keep_.clear();
        return Outcome::done();
      }
      if (q != cudaErrorNotReady) return Outcome::failed("nccl: CUDA: " + cuda_error(q));
      const ncclResult_t s = h_->state();
      if (s != ncclSuccess && !in_progress(s)) return Outcome::failed("nccl: " + nccl_error(s));
      if (Clock::now() >= deadline) return Outcome::timed_out();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  bool test() override { return cudaEventQuery(done_->event) != cudaErrorNotReady; }

  std::optional<Outcome> wait_on_device(Clock::time_point deadline,
                                        std::function<void(Outcome)> on_failure) override {
    if (h_->aborted) return aborted_outcome(world_->registry->aborted());
    cudaSetDevice(h_->device);
    if (cudaError_t e = cudaStreamWaitEvent(compute_stream(h_->device), done_->event, 0);
        e != cudaSuccess) {
      return Outcome::failed("nccl: cudaStreamWaitEvent: " + cuda_error(e));
    }
    watched_ = true;
    world_->watchdog->watch({h_, done_, std::move(keep_), deadline, std::move(on_failure)});
    return Outcome::done();
  }

 private:
  std::shared_ptr<NcclHandle> h_;
  std::shared_ptr<NcclWorld> world_;
  std::shared_ptr<CudaEvent> done_;
  std::vector<at::Tensor> keep_;
  Clock::time_point deadline_;
  bool finished_ = false;
  bool watched_ = false;
};

// A handle with its stream and scratch memory, before NCCL's communicator is made.
Result<std::shared_ptr<NcclHandle>> new_handle(int device) {
  auto h = std::make_shared<NcclHandle>();
  h->device = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return Error{"cudaSetDevice(" + std::to_string(device) + "): " + cuda_error(e), {}};
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return Error{"cudaStreamCreate: " + cuda_error(e), {}};
  }
  if (cudaError_t e = cudaMalloc(&h->scratch, sizeof(float)); e != cudaSuccess) {
    return Error{"cudaMalloc: " + cuda_error(e), {}};
  }
  return h;
}

std::string seconds_until(Clock::time_point start, Clock::time_point deadline) {
  return format_seconds(std::chrono::duration<double>(deadline - start).count());
}

// Members of group `uid` agree on an NCCL unique id through the store and create the
// communicator, non-blocking where NCCL can, bounded by `deadline`. Also the sub-group path of
// NCCL older than 2.18.
Result<std::shared_ptr<NcclHandle>> connect(const NcclWorld& world, const GroupSpec& spec,
                                            Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
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
  // Who has not joined, for the message of a communicator that never became ready.
  auto missing = [&]() -> std::string {
    std::string out;
    for (int r = 0; r < size; ++r) {
      Result<bool> there = world.store->has(prefix + "ready/" + std::to_string(r));
      if (there.ok() && *there) continue;
      out += (out.empty() ? "" : ", ") + spec.world_ranks[r].to_string();
    }
    return out.empty() ? "every rank joined" : "rank(s) " + out + " did not join";
  };
  LOOM_ASSIGN_OR_RETURN(auto h, new_handle(world.device));
#if LOOM_NCCL_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&h->comm, size, id, rank, &config);
  if (r == ncclSuccess || in_progress(r)) r = settle(*h, deadline);
#else
  // Blocking initialisation cannot be bounded: start it only once every member is there.
  for (int q = 0; q < size; ++q) {
    if (!world.store->get(prefix + "ready/" + std::to_string(q)).ok()) {
      return Error{"the NCCL communicator of group " + spec.name + " was not ready within " +
                       seconds_until(start, deadline) + " s: " + missing(),
                   {}};
    }
  }
  ncclResult_t r = ncclCommInitRank(&h->comm, size, id, rank);
#endif
  if (in_progress(r)) {
    h->abort();
    return Error{"the NCCL communicator of group " + spec.name + " was not ready within " +
                     seconds_until(start, deadline) + " s: " + missing(),
                 {}};
  }
  if (r != ncclSuccess) {
    if (h->comm != nullptr) h->abort();
    return Error{"creating the NCCL communicator of group " + spec.name +
                     " failed: " + nccl_error(r) + " (" + missing() + ")",
                 {}};
  }
  return h;
}

#if LOOM_NCCL_SPLIT
// The sub-group of `parent` with this rank at `key` (color 0), or none for a non-member
// (NCCL_SPLIT_NOCOLOR): a collective over the parent, non-blocking and bounded by `deadline`.
Result<std::shared_ptr<NcclHandle>> split(NcclHandle& parent, bool member, int key,
                                          const GroupSpec& spec, Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
  std::shared_ptr<NcclHandle> h;
  if (member) {
    LOOM_ASSIGN_OR_RETURN(h, new_handle(parent.device));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // Non-blocking, NCCL writes the child's handle when the parent's part of the split is done,
  // which may be after this returns on a timeout: the slot outlives the call then.
  auto* child = new ncclComm_t(nullptr);
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> lock(parent.mu);
    if (parent.aborted) {
      delete child;
      return Error{"the parent communicator was aborted", {}};
    }
    cudaSetDevice(parent.device);
    r = ncclCommSplit(parent.comm, member ? 0 : NCCL_SPLIT_NOCOLOR, key, child, &config);
  }
  // The parent reports the split's progress, then the child its own initialisation.
  if (r == ncclSuccess || in_progress(r)) r = settle(parent, deadline);
  if (in_progress(r)) {
    (void)child;  // NCCL may still write it: left allocated
  } else {
    if (h) h->comm = *child;
    delete child;
  }
  if ((r == ncclSuccess) && h && h->comm != nullptr) r = settle(*h, deadline);
  if (r != ncclSuccess) {
    if (h && h->comm != nullptr) h->abort();
    if (in_progress(r)) {
      return Error{"ncclCommSplit for group " + spec.name + " did not finish within " +
                       seconds_until(start, deadline) + " s",
                   {}};
    }
    return Error{"ncclCommSplit for group " + spec.name + " failed: " + nccl_error(r), {}};
  }
  if (member && (!h || h->comm == nullptr)) {
    return Error{"ncclCommSplit gave no communicator to a member of group " + spec.name, {}};
  }
  return h;
}
#endif

class NcclComm : public Comm {
 public:
  NcclComm(GroupSpec spec, std::shared_ptr<NcclWorld> world, std::shared_ptr<NcclHandle> h)
      : Comm(std::move(spec)), world_(std::move(world)), h_(std::move(h)) {
    world_->registry->add(h_);
  }

  const char* backend_name() const override { return "nccl"; }

 protected:
  void on_broken() override {
    Status why = status();
    world_->registry->abort_all(why.ok() ? "" : why.error().message);
  }

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

  // Orders the communicator's stream after the work already queued on the caller's stream,
  // enqueues, and records the event that completion is awaited on.
  template <class F>
  Started enqueue(const char* what, std::vector<at::Tensor> keep, F&& f) {
    for (const at::Tensor& t : keep) LOOM_TRY(on_device(t));
    if (std::string why = world_->registry->aborted(); !why.empty() || h_->aborted) {
      return Error{
          "the nccl communicators of this process were aborted after an earlier "
          "failure: " +
              why,
          {}};
    }
    const Clock::time_point deadline =
        Clock::now() +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s()));
    cudaSetDevice(h_->device);
    {
      CudaEvent ready;
      if (cudaError_t e = cudaEventRecord(ready.event, compute_stream(h_->device));
          e != cudaSuccess) {
        return Error{"cudaEventRecord: " + cuda_error(e), {}};
      }
      if (cudaError_t e = cudaStreamWaitEvent(h_->stream, ready.event, 0); e != cudaSuccess) {
        return Error{"cudaStreamWaitEvent: " + cuda_error(e), {}};
      }
    }  // destroying an event that a stream waits on is allowed: the wait stays
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(h_->mu);
      r = h_->aborted ? ncclInvalidUsage : f();
    }
    // A non-blocking communicator may still be setting up connections: its work reaches the
    // stream only once NCCL's state leaves ncclInProgress.
    if (in_progress(r)) r = settle(*h_, deadline);
    if (in_progress(r)) {
      return Error{std::string("NCCL did not finish starting ") + what + " within " +
                       format_seconds(timeout_s()) + " s (connecting to its peers)",
                   {}};
    }
    if (r != ncclSuccess) {
      return Error{std::string("the nccl backend could not start ") + what + ": " + nccl_error(r),
                   {}};
    }
    auto done = std::make_shared<CudaEvent>();
    if (cudaError_t e = cudaEventRecord(done->event, h_->stream); e != cudaSuccess) {
      return Error{"cudaEventRecord: " + cuda_error(e), {}};
    }
    return std::shared_ptr<PendingOp>(
        std::make_shared<NcclOp>(h_, world_, std::move(done), std::move(keep), deadline));
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

  // One NCCL group: whatever order the peers' batches list their sends and receives in, NCCL
  // progresses them together. NCCL has no tags: it pairs a peer's sends with that peer's receives
  // in the order they are issued. Issued by tag (stable), both sides list the messages between
  // them in the same order, which keeps (peer, tag) matching and each tag's message order.
  Started start_batch(const std::vector<P2POp>& given) override {
    std::vector<P2POp> ops(given);
    std::stable_sort(ops.begin(), ops.end(),
                     [](const P2POp& a, const P2POp& b) { return a.tag < b.tag; });
    std::vector<at::Tensor> keep;
    for (const P2POp& op : ops) keep.push_back(op.tensor);
    return enqueue("batch_isend_irecv", keep, [&] {
      ncclResult_t r = ncclGroupStart();
      for (const P2POp& op : ops) {
        if (r != ncclSuccess) break;
        const at::Tensor& t = op.tensor;
        if (t.nbytes() == 0) continue;  // the peer's matching op is empty too
        const int peer = static_cast<int>(op.peer.value());
        r = op.kind == P2POp::Kind::kSend
                ? ncclSend(t.data_ptr(), t.nbytes(), ncclInt8, peer, h_->comm, h_->stream)
                : ncclRecv(t.data_ptr(), t.nbytes(), ncclInt8, peer, h_->comm, h_->stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
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

  Result<std::shared_ptr<Comm>> make_group(const std::vector<int>& members, GroupSpec spec,
                                           Clock::time_point deadline) override {
    if (std::string why = world_->registry->aborted(); !why.empty()) {
      return Error{"the nccl communicators of this process were aborted after: " + why, {}};
    }
#if LOOM_NCCL_SPLIT
    (void)members;
    const bool member = spec.rank.valid();
    LOOM_ASSIGN_OR_RETURN(
        auto h,
        split(*h_, member, member ? static_cast<int>(spec.rank.value()) : 0, spec, deadline));
    if (!member) return std::shared_ptr<Comm>();
#else
    (void)members;
    if (!spec.rank.valid()) return std::shared_ptr<Comm>();
    LOOM_ASSIGN_OR_RETURN(auto h, connect(*world_, spec, deadline));
#endif
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

std::string nccl_versions() {
  auto text = [](int code) {
    // Codes are MAJOR * 10000 + MINOR * 100 + PATCH since NCCL 2.9 (2.8: MAJOR * 1000 + ...).
    const int major = code >= 10000 ? code / 10000 : code / 1000;
    const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
  };
  int runtime = 0;
  ncclGetVersion(&runtime);
  return text(runtime) + " (runtime), " + text(NCCL_VERSION_CODE) + " (headers)";
}

Result<std::shared_ptr<Comm>> make_nccl_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, int local_rank, double timeout_s) {
  LOOM_TRY(nccl_usable());
  int devices = 0;
  cudaGetDeviceCount(&devices);
  auto world = std::make_shared<NcclWorld>();
  world->store = std::move(store);
  if (devices < 1) return Error{"this machine has no usable CUDA device", {}};
  // As the runtime picks its device (runtime/device.h): more ranks than GPUs share them.
  world->device = (local_rank >= 0 ? local_rank : rank) % devices;
  world->watchdog = std::make_shared<Watchdog>(world->device, world->registry);
  GroupSpec spec;
  spec.name = "world";
  spec.uid = "w";
  for (int r = 0; r < size; ++r) spec.world_ranks.emplace_back(r);
  spec.rank = Rank(rank);
  spec.timeout_s = timeout_s;
  spec.arrivals = world->store->arrivals();
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  LOOM_ASSIGN_OR_RETURN(auto h, connect(*world, spec, deadline));
  return std::shared_ptr<Comm>(std::make_shared<NcclComm>(std::move(spec), world, h));
}

}  // namespace loom::comm
