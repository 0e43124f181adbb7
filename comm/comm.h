// Comm: the only way loom's ranks talk. A small, c10d-like interface over a group of ranks with
// a timeout on every call, a sequence number per collective and errors that name the collective,
// its sequence number, the group and the ranks that did not arrive.
//
// Backends (gloo, mpi, nccl, local) implement the protected start_* hooks; everything users see
// (argument checks, staging of non-contiguous tensors, kAvg, deadlines, diagnostics, failure
// after a broken call) lives here once.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/ids.h"
#include "core/result.h"

namespace loom::comm {

using Clock = std::chrono::steady_clock;

enum class ReduceOp { kSum, kMax, kMin, kAvg };
const char* to_string(ReduceOp op);

class Arrivals;
class PendingOp;
struct Outcome;
struct WorkState;

// Handle on a started operation. Copyable; every copy refers to the same operation. Outputs are
// valid only after wait() succeeded.
class Work {
 public:
  Work() = default;
  // CPU backends: blocks until the operation finished or its deadline (start + the Comm's
  // timeout) passed. nccl: makes the caller's current CUDA stream wait for the operation and
  // returns without blocking the host (outputs are valid in that stream's order); a watchdog
  // then holds the operation to its deadline, and a failure or timeout makes the group unusable,
  // aborts the process's communicators and is reported by status() and by every later call.
  // Idempotent: later calls return the first result.
  Status wait();
  // Blocks the host until the operation finished or its deadline passed, on every backend (after
  // wait() too). For results the host must see at once; costs a host round trip on nccl.
  Status synchronize();
  // True once the operation finished, successfully or not; never blocks.
  bool is_completed();
  // "all_reduce #17 on group dp[0,2]".
  std::string description() const;

  static Work failed(Error error);

 private:
  friend class Comm;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  std::shared_ptr<WorkState> state_;
};

// One send or receive of a batch_isend_irecv; `peer` is a rank of the group.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor tensor;
  Rank peer;
  int tag = 0;

  static P2POp send(at::Tensor tensor, Rank dst, int tag = 0) {
    return {Kind::kSend, std::move(tensor), dst, tag};
  }
  static P2POp recv(at::Tensor tensor, Rank src, int tag = 0) {
    return {Kind::kRecv, std::move(tensor), src, tag};
  }
};

// What every Comm of one group knows about the group.
struct GroupSpec {
  std::string name;               // shown in messages: "world", "dp", ...
  std::string uid;                // the same on every member; scopes store keys
  std::vector<Rank> world_ranks;  // members' world ranks; index = rank in this group
  Rank rank;                      // this process's rank in the group
  double timeout_s = 300;         // deadline of every call, from its start
  std::shared_ptr<Arrivals> arrivals;
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  virtual ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  Rank rank() const { return spec_.rank; }  // in this group
  int size() const { return static_cast<int>(spec_.world_ranks.size()); }
  virtual const char* backend_name() const = 0;
  // Members' world ranks, in group order.
  const std::vector<Rank>& world_ranks() const { return spec_.world_ranks; }
  // This process's rank in the world.
  Rank world_rank() const { return spec_.world_ranks[spec_.rank.value()]; }
  // "dp[0,2]": the group's name and its members' world ranks.
  std::string group_name() const;

  double timeout_s() const;
  void set_timeout(double seconds);  // applies to calls started afterwards

  // Point to point. `tag` >= 0 tells apart messages between the same pair; messages with the same
  // (peer, tag) arrive in the order they were sent. recv writes into a preallocated tensor of the
  // sent tensor's dtype and element count.
  Status send(const at::Tensor& tensor, Rank dst, int tag = 0);
  Status recv(const at::Tensor& tensor, Rank src, int tag = 0);
  Work send_async(const at::Tensor& tensor, Rank dst, int tag = 0);
  Work recv_async(const at::Tensor& tensor, Rank src, int tag = 0);
  // Starts `ops` together, as torch.distributed.batch_isend_irecv: one handle for all of them,
  // and no order between ranks' batches can deadlock (a pipeline block where one rank sends
  // activations while its peer sends gradients). The nccl backend issues the batch as one NCCL
  // group; the others start the ops in order. Each op counts as a send_async / recv_async for
  // message order. A send to this rank needs a recv from this rank with the same tag in the
  // same batch (matched in order).
  Work batch_isend_irecv(const std::vector<P2POp>& ops);

  // In place on every rank. kAvg needs a floating-point tensor.
  Status all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  Work all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // out[j] receives rank j's `in`; every piece has in's element count.
  Status all_gather(const std::vector<at::Tensor>& out, const at::Tensor& in);
  Work all_gather_async(const std::vector<at::Tensor>& out, const at::Tensor& in);
  // Flat form: `out` holds size() * in.numel() elements, rank j's piece at [j * n, (j + 1) * n) in
  // row-major order (for out of shape [size * d0, ...] that is concatenation along dim 0).
  Status all_gather_flat(const at::Tensor& out, const at::Tensor& in);
  Work all_gather_flat_async(const at::Tensor& out, const at::Tensor& in);

  // out = reduction over ranks of their in[rank()]; every in[j] has out's element count.
  Status reduce_scatter(const at::Tensor& out, const std::vector<at::Tensor>& in,
                        ReduceOp op = ReduceOp::kSum);
  Work reduce_scatter_async(const at::Tensor& out, const std::vector<at::Tensor>& in,
                            ReduceOp op = ReduceOp::kSum);
  // Flat form: `in` holds size() * out.numel() elements; rank j's piece is [j * n, (j + 1) * n).
  Status reduce_scatter_flat(const at::Tensor& out, const at::Tensor& in,
                             ReduceOp op = ReduceOp::kSum);
  Work reduce_scatter_flat_async(const at::Tensor& out, const at::Tensor& in,
                                 ReduceOp op = ReduceOp::kSum);

  // in[j] goes to rank j, out[j] comes from rank j. Pieces may differ in size; out[j] on rank i
  // must have the element count of in[i] on rank j.
  Status all_to_all(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in);
  Work all_to_all_async(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in);

  // Copies root's tensor into every rank's tensor.
  Status broadcast(const at::Tensor& tensor, Rank root);
  Work broadcast_async(const at::Tensor& tensor, Rank root);

  Status barrier();

  // A sub-group of this group's ranks (ranks of *this* group, in the order given: position i
  // becomes rank i of the new group). Collective over this group: every rank calls it with the
  // same arguments, in the same order relative to other collectives. Non-members get nullptr.
  // `name` is shown in messages ("tp", "dp", "pp"); empty: the group's uid.
  Result<std::shared_ptr<Comm>> new_group(const std::vector<Rank>& ranks, std::string name = "");

  // An error naming the failed or timed-out call once the group is unusable (on nccl also when
  // a watchdog found the failure after wait() returned), else success. Never blocks.
  Status status() const;

  // Number of collectives started on this group so far (the next one gets number + 1). Inside a
  // backend's start_* hook: the number of the call being started.
  uint64_t collective_count() const;

 protected:
  explicit Comm(GroupSpec spec);

  // Backend hooks. Tensors are contiguous and checked; ReduceOp is never kAvg. Each returns an
  // operation that the caller awaits against the deadline, or an error saying which backend
  // cannot do what.
  using Started = Result<std::shared_ptr<PendingOp>>;
  virtual Started start_send(const at::Tensor& tensor, int dst, int tag) = 0;
  virtual Started start_recv(const at::Tensor& tensor, int src, int tag) = 0;
  virtual Started start_all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // out_flat holds size() pieces of in.numel() elements.
  virtual Started start_all_gather(const at::Tensor& out_flat, const at::Tensor& in) = 0;
  // in_flat holds size() pieces of out.numel() elements.
  virtual Started start_reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                                       ReduceOp op) = 0;
  virtual Started start_all_to_all(const std::vector<at::Tensor>& out,
                                   const std::vector<at::Tensor>& in) = 0;
  virtual Started start_broadcast(const at::Tensor& tensor, int root) = 0;
  virtual Started start_barrier() = 0;
  // The ops of a batch_isend_irecv (peers are ranks of this group; a send to this rank has a
  // matching recv in the batch). The default starts them in order through start_send and
  // start_recv, and copies what this rank sends itself.
  virtual Started start_batch(const std::vector<P2POp>& ops);
  // Builds the sub-group on members (spec.rank valid) and returns nullptr on non-members
  // (spec.rank invalid). `members` are ranks of this group. Must finish by `deadline`.
  virtual Result<std::shared_ptr<Comm>> make_group(const std::vector<int>& members, GroupSpec spec,
                                                   Clock::time_point deadline) = 0;

  const GroupSpec& spec() const { return spec_; }
  // Called once when the group becomes unusable (after a failed or timed-out call).
  virtual void on_broken() {}
  bool broken() const;

 private:
  friend struct WorkState;
  struct Call;

  Result<Call> begin_collective(const char* name);
  Result<Call> begin_p2p(const char* name, int peer, int tag);
  // Numbers the ops (each as a send or recv of its own) and announces this rank's arrival at
  // them; `batch` names the call "batch_isend_irecv of N ops (...)".
  Result<Call> begin_p2p_ops(const std::vector<P2POp>& ops, bool batch);
  Work finish(Call call, Started started, std::vector<std::function<void()>> on_success);
  Status check_peer(const char* what, Rank peer) const;
  void mark_broken(const std::string& reason);
  // The message of a call that failed or timed out ("all_reduce #17 on group dp[0,2] timed out
  // after 5.0 s: rank 2 did not arrive"); makes the group unusable.
  Error fail_call(const Call& call, const Outcome& outcome);
  // "rank 2 did not arrive" / "ranks 1, 3 did not arrive" / "every rank arrived".
  std::string who_is_missing(const Call& call, bool grace);

  GroupSpec spec_;
  std::mutex issue_mu_;  // held while a call is numbered and started
  mutable std::mutex mu_;
  uint64_t collectives_ = 0;
  uint64_t groups_made_ = 0;
  std::map<std::tuple<int, int, bool>, uint64_t> p2p_counts_;  // (peer, tag, is_send) -> calls
  std::string broken_reason_;
};

}  // namespace loom::comm
