// Gradient synchronisation overlapped with backward, as DDP's reducer does it. The gradients of
// parameter pieces held by several ranks live in flat buckets (one buffer per bucket, each
// gradient a view of it), so a bucket is all-reduced in place with no copy in or out. Buckets
// are filled in reverse order of first use (the order backward finishes them), at most
// comm.bucket_mb each, over a communicator of their own. A hook after each parameter's gradient
// accumulation counts down what the step still owes it; when a bucket's parameters are final
// (the last micro-batch's backward of every stage reading them on this rank), its all-reduce
// starts asynchronously while backward goes on. Buckets of one group start in their fixed order,
// so every member issues the same collectives in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "core/ids.h"
#include "core/result.h"
#include "observe/trace.h"

namespace loom::runtime {

class GradBuckets {
 public:
  // A parameter piece whose gradient is summed over `group` (world ranks, >= 2, this rank among
  // them); its gradient accumulates `accumulations` times per step (once per backward block of
  // each stage that reads it on this rank).
  struct Param {
    at::Tensor param;
    std::vector<DeviceId> group;
    int64_t accumulations = 1;
  };

  // Buckets over `params`, given in the forward's order of use and in the same order on every
  // member of a group (buckets are filled from the end), each group's on its communicator from
  // `groups` (keyed by member list).
  // With `zero1` (parallel.zero 1), each bucket is split into equal segments over the members
  // of its group (lower/grad_bucketing.h): buckets are reduce-scattered, so each member
  // has the summed gradients of its segment only and updates exactly those elements;
  // gather_parameters() then hands every member the updated values.
  GradBuckets(std::vector<Param> params,
              std::map<std::vector<int64_t>, std::shared_ptr<comm::Comm>> groups,
              int64_t bucket_bytes, bool zero1 = false);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Starts a step whose parameters have no gradient yet (the executor drops them first): every
  // bucketed parameter's first gradient of the step is copied into its view of the bucket (and
  // the gradient becomes that view), later ones accumulate into it.
  void begin_step();
  // Starts the buckets not started during backward (parameters that got no gradient, or fewer
  // accumulations than expected), in order, and waits for every all-reduce. After it, every
  // bucketed gradient is the sum over its group.
  Status finish();

  // Whether `param` is one of the bucketed parameters.
  bool holds(const at::Tensor& param) const;
  // Adds `grad` (the parameter's dtype and shape) to bucketed `param`'s gradient outside
  // autograd (a split backward's weight-gradient block) and counts it as one of the step's
  // accumulations, as the hook counts autograd's.
  void accumulate(const at::Tensor& param, const at::Tensor& grad);

  // The elements [begin, end) of `param` (flattened) this rank updates: all of them without
  // zero1 or for a piece it does not share; under zero1 its segment's share (maybe empty).
  std::pair<int64_t, int64_t> owned(const at::Tensor& param) const;
  bool zero1() const { return zero1_; }
  // ZeRO-1: after the owners' optimizer step, every member receives the updated pieces of each
  // bucket (an all-gather of the owners' segments). Nothing to do without zero1.
  Status gather_parameters();

  // Records each bucket's reduction (its start and the wait for it) and gather on `tracer`
  // (null: nothing; step_trace.h).
  void set_tracer(observe::Tracer* tracer) { tracer_ = tracer; }

  int64_t bucket_count() const;
  // How many buckets backward started (the rest started in finish()): for tests and benches.
  int64_t started_during_backward() const { return started_early_; }

 private:
  struct Bucket;
  struct Hook;
  void accumulated(size_t param);       // called by the hook
  at::Tensor view(size_t param) const;  // its gradient's place in its bucket
  // Starts the group's next buckets in order: those whose parameters are final (during
  // backward), or all that remain.
  void start_ready(size_t group, bool during_backward);

  std::vector<Param> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<int64_t> offset_of_;          // per param: where its gradient starts in its bucket
  std::vector<size_t> bucket_of_;           // per param
  std::map<const void*, size_t> index_of_;  // the parameter's TensorImpl -> its index
  std::vector<int64_t> remaining_;          // per param: accumulations still due
  std::vector<std::vector<size_t>> group_buckets_;  // per group: its buckets, in order
  std::vector<size_t> next_;                        // per group: the next bucket to start
  std::vector<size_t> group_of_bucket_;
  bool zero1_ = false;
  std::vector<std::pair<int64_t, int64_t>> owned_;   // per param: the elements it updates
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps the hooked autograd nodes alive
  std::shared_ptr<GradBuckets*> self_;               // what the hooks call; null once destroyed
  int64_t started_early_ = 0;
  bool in_step_ = false;
  observe::Tracer* tracer_ = nullptr;
};

}  // namespace loom::runtime
