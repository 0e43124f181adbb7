// Executes communication paths (lower/path.h) on this rank's piece of a tensor with the
// injected Comm: each collective over its group's sub-communicator, send/recv point to point,
// local chunks and pads in place. Sends are asynchronous and waited for at flush(), before the
// tensors they read may change. On nccl a path's sends wait to start with this rank's next
// receives, as one batch_isend_irecv (one NCCL group): in a pipeline one rank sends activations
// while its peer sends gradients, and two NCCL sends facing each other would wait forever. The
// CPU backends' sends never block, so they start at once and the peer's data is on its way
// while this rank computes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "lower/path.h"
#include "observe/trace.h"

namespace loom::runtime {

// Which part of a path this rank runs: all of it, the producers' part (up to and including the
// sends to another group), or the consumers' part (the receives and what follows).
enum class PathPart { kAll, kProducer, kConsumer };

class PathRunner {
 public:
  // Receive buffers are made on `device`.
  explicit PathRunner(std::shared_ptr<comm::Comm> world, at::Device device = at::Device(at::kCPU));

  // Creates the sub-communicators of every collective group in `paths` and of `extra` groups.
  // A collective over the world: every rank calls it with the same arguments, in the same order.
  Status add_groups(const std::vector<const lower::CommPath*>& paths,
                    const std::vector<std::vector<DeviceId>>& extra = {});
  // The communicator of a group this rank belongs to.
  comm::Comm& group(const std::vector<DeviceId>& members);

  // Runs the steps of `path` that involve this rank, from its piece `x` of a tensor of shape
  // `full` (undefined when it holds none at the start). Returns its piece at the end (undefined
  // when it holds none). Messages use tags from `tag_base` up (one per step); what it receives
  // has dtype `dtype` (the tensor's, graph/precision.h). With `ragged_dim` >= 0 an all-to-all
  // sends of each piece only the rows along that dimension up to its last non-zero one, after
  // exchanging those counts (a mixture of experts' slots: most are empty), and the receiver
  // fills the rest with zeros: the same result in fewer bytes.
  Result<at::Tensor> run(const lower::CommPath& path, const Shape& full, at::Tensor x,
                         PathPart part, int64_t tag_base, at::ScalarType dtype = at::kFloat,
                         int64_t ragged_dim = -1);

  // Posts now the receives this rank's `part` of `path` starts with (its first send/recv step),
  // so their data arrives while this rank computes; the run() of the same path, part and
  // tag_base takes them. Only where sends do not wait for receives (the CPU backends); on nccl
  // it does nothing (a receive posted alone would hold the stream its sends need).
  void prepost(const lower::CommPath& path, const Shape& full, PathPart part, int64_t tag_base,
               at::ScalarType dtype = at::kFloat);

  // A path of one all-gather started now and finished later, so that it runs while this rank
  // computes (a parameter's gather, parallel.zero 3, started one gather ahead).
  struct Started {
    at::Tensor out;                 // gathered in place (along the leading dimension)
    std::vector<at::Tensor> parts;  // or gathered per rank, concatenated by finish()
    comm::Work work;
    comm::Comm* group = nullptr;
    int64_t dim = 0;
  };
  // Whether `path` is one all-gather this rank takes part in (what start_all_gather runs).
  bool is_one_all_gather(const lower::CommPath& path) const;
  Result<Started> start_all_gather(const lower::CommPath& path, const at::Tensor& x);
  // Waits for it and returns what run() would have.
  Result<at::Tensor> finish(Started& started);

  // Starts the sends still waiting for a receive and waits for every send in flight; call this
  // before the tensors sent may change. Every posted receive must have been taken by then.
  Status flush();

  // Whether this runner runs `p`: every entry of lower::primitive_rules() (checked when a
  // PathRunner is made), send/recv by run() itself, each other primitive by its own function.
  static bool can_run(lower::Primitive p);

  comm::Comm& world() { return *world_; }
  int64_t rank() const { return rank_; }
  // Records every send, receive and collective on `tracer` (null: nothing; step_trace.h).
  void set_tracer(observe::Tracer* tracer) { tracer_ = tracer; }

 private:
  // Starts the sends waiting for a receive, alone (before a collective, which must not wait on
  // a peer that waits for them).
  void start_waiting_sends();
  // One event per op of `ops`, from `start_us` to now (a traced step only).
  void trace_ops(const std::vector<comm::P2POp>& ops, int64_t start_us);
  // A send/recv step: this rank's sends of `cur` (when `send`) and receives (when `recv`, taking
  // a posted one where there is one); the piece it received, undefined if none.
  Result<at::Tensor> send_recv(const lower::CommStep& st, const Shape& full, const at::Tensor& cur,
                               bool send, bool recv, int tag, at::ScalarType dtype);
  // A collective or local step applied to this rank's piece `cur`: the runner of its primitive.
  Result<at::Tensor> apply(const lower::CommStep& st, at::Tensor cur);
  // One function per collective and local primitive of lower's registry (lower/path.h), keyed
  // by the entry's primitive: what the step does to this rank's piece `cur`.
  using StepRunner = Result<at::Tensor> (PathRunner::*)(const lower::CommStep&, at::Tensor);
  static const std::map<lower::Primitive, StepRunner>& step_runners();
  Result<at::Tensor> all_reduce(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> all_gather(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> reduce_scatter(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> all_to_all(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> chunk(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> value_chunk(const lower::CommStep& st, at::Tensor cur);
  Result<at::Tensor> pad(const lower::CommStep& st, at::Tensor cur);
  // The communicator of the group of `st` this rank is in.
  comm::Comm& group_of(const lower::CommStep& st);
  // This rank's part (0 .. k-1) of the factor `st` moves.
  int64_t sub_of(const lower::CommStep& st) const;
  // All-to-all of `in` (piece j to rank j of `g`) sending only each piece's rows along
  // ragged_dim_ up to its last non-zero one; the pieces received, zero-filled, concatenated
  // along `cat_dim`.
  Result<at::Tensor> ragged_all_to_all(comm::Comm& g, const std::vector<at::Tensor>& in,
                                       int64_t cat_dim);

  std::shared_ptr<comm::Comm> world_;
  at::Device device_;
  int64_t rank_;
  int64_t ragged_dim_ = -1;                 // of the run() in progress
  bool defer_sends_;                        // nccl: sends start with the next receives
  std::vector<comm::P2POp> waiting_sends_;  // not started: they go with the next receives
  std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups_;
  std::vector<comm::Work> sends_;  // in flight; each keeps its tensor alive
  struct Posted {
    at::Tensor buffer;
    comm::Work work;
  };
  std::map<std::pair<int64_t, int>, Posted> posted_;  // (source rank, tag) -> posted receive
  observe::Tracer* tracer_ = nullptr;
};

}  // namespace loom::runtime
