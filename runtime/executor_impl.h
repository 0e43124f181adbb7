// The executor's state and the parts of a forward block that recomputation (recompute.cc)
// shares with the executor (executor.cc). Internal to runtime.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/deferred_linear.h"
#include "runtime/executor.h"
#include "runtime/grad_buckets.h"
#include "runtime/path_runner.h"

namespace loom::runtime {

// Thrown inside autograd functions, caught by Executor::run.
struct CommFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check(const Status& s) {
  if (!s.ok()) throw CommFailure(s.error().message);
}

struct Executor::Impl {
  graph::Graph graph;
  lower::Lowered lowered;
  std::shared_ptr<comm::Comm> world;
  RunDevice device;
  int64_t rank = 0;
  std::unique_ptr<PathRunner> runner;
  std::unique_ptr<GradBuckets> buckets;  // null when no parameter piece is shared
  observe::Tracer* tracer = nullptr;     // a traced step's (logging.trace_steps); else null
  std::vector<at::Tensor> params;        // float32 masters
  // What ops read during a step: the masters, or their copies in the compute dtype (made once
  // per step; their gradients flow back to the masters in float32).
  std::vector<at::Tensor> compute_params;
  std::vector<at::ScalarType> dtype;  // by tensor id: the planned graph's dtype
  // By tensor id: the dimension whose trailing all-zero rows an all-to-all leaves out (the slots
  // of a mixture of experts' buffers, graph/ops_moe.h), or -1.
  std::vector<int64_t> ragged_dim;
  std::vector<graph::SubTensor> pieces;
  std::vector<int64_t> replicas;
  std::map<std::pair<int64_t, std::string>, size_t> param_index;  // (tensor, ranges) -> index
  std::vector<int64_t> producer_stage;  // by tensor id: the stage that makes it here, or -1
  std::map<int64_t, std::set<int64_t>> consumed;  // stage -> tensors its ops read
  // parallel.zero 3 (param_gather.cc): per parameter adapter, the slot of the shard this rank
  // stores; the next parameter adapter of the same segment, whose gather starts one ahead in a
  // forward; the gather started so; whether a forward block runs (backward blocks replaying a
  // recomputed region gather where they are).
  std::unordered_map<int64_t, int64_t> shard_slot;
  std::unordered_map<int64_t, int64_t> next_gather;
  // The previous regathered weight (Adapter::regather) of the same segment, gathered ahead in a
  // backward.
  std::unordered_map<int64_t, int64_t> previous_regather;
  struct Prefetch {
    int64_t adapter = -1;
    int64_t mb = -1;
    PathRunner::Started started;
  };
  Prefetch prefetch;
  Executor::GatherCounts gather_counts;
  bool forwarding = false;
  // The step's auxiliary losses (ForwardStep::metric_weight), summed in forward blocks.
  at::Tensor aux_total;
  // Per layer and micro-batch, the most tokens an expert was chosen by over the mean: summed
  // with the metric weights (load_sum) and the weights summed (load_count), so the step's one
  // all-reduce gives their mean.
  at::Tensor load_sum;
  double load_count = 0;

  // Where an op reads one input from, resolved once when the executor is made.
  struct Source {
    enum class Kind {
      kInput,      // a graph input: the piece is cut from the micro-batch's full value
      kParameter,  // index: parameter slot
      kAdapter,    // index: adapter id (the value its consumers read)
      kSameStage,  // index: tensor id, made earlier in the same forward block
      kStageLeaf,  // index: tensor id, made by another stage on this rank (a leaf here)
    } kind;
    int64_t index;
  };
  // One unit of a forward block: an adapter item, or an op (a linear whose only reader is the
  // bias_add that follows it runs with it as one at::linear; the IR keeps them apart so
  // row-parallel splits stay partial sums; a loss chain that sees the whole vocabulary runs as
  // one cross-entropy, lower/fusion.h).
  struct ForwardStep {
    int64_t item = 0;  // its (first) item in the segment
    const lower::SegmentItem* adapter = nullptr;
    size_t op = 0;  // a fused loss chain's: its nll (attributes and output)
    const Kernel* kernel = nullptr;
    std::vector<Source> sources;
    // Per source, the piece it reads: the op's inputs; a fused loss chain's logits and targets.
    std::vector<graph::SubTensor> reads;
    int64_t fused_bias = -1;  // op index of the fused bias_add
    // A linear reading a parameter in a stage whose backward is split (I and W blocks): its
    // weight gradient waits in the micro-batch's stash for the W block (deferred_linear.h).
    bool deferred = false;
    // A linear whose weight is a sharded parameter gathered again for its backward
    // (Adapter::regather): the adapter id; sources[1] is then the shard (param_gather.cc).
    int64_t gathered = -1;
    // A linear op: its products follow the run's linear math (device.linear: float8 under fp8).
    bool linear = false;
    Source bias{Source::Kind::kParameter, -1};
    bool makes_loss = false;
    // An auxiliary loss reported on its own (moe_aux_loss): 1 / the ranks that hold its piece,
    // so the step's sum counts it once; 0 for every other op.
    double metric_weight = 0;
    // The planned dtype of each output: a kernel computing in float32 (layer norm, softmax)
    // hands on the graph's dtype.
    std::vector<at::ScalarType> out_dtypes;
  };
  std::map<int64_t, size_t> segment_of_stage;           // stage -> index in the program's segments
  std::vector<std::vector<ForwardStep>> forward_steps;  // per segment

  // A recomputed region of a segment (lower::RecomputeRegion) as forward steps, with what it
  // reads from outside (the checkpoint its backward recomputes from) and what outside reads
  // of what it makes.
  struct Value {
    enum class Kind { kEnv, kAdapted, kLeaf, kParameter } kind;
    int64_t index;  // tensor id, adapter id, tensor id, parameter slot
    friend bool operator<(const Value& a, const Value& b) {
      return std::tie(a.kind, a.index) < std::tie(b.kind, b.index);
    }
  };
  struct Region {
    size_t begin = 0, end = 0;  // forward steps
    std::vector<Value> inputs;
    std::vector<Value> outputs;  // kEnv or kAdapted only
  };
  std::vector<std::vector<Region>> regions;        // per segment, in step order
  std::vector<std::vector<int64_t>> region_start;  // per segment, per step: region index or -1

  // Per micro-batch values.
  struct Micro {
    std::vector<at::Tensor> env;                      // by tensor id: outputs of this rank's ops
    std::unordered_map<int64_t, at::Tensor> adapted;  // adapter id -> value consumers read
    std::unordered_map<int64_t, at::Tensor> sent;     // adapter id -> what the producers sent
    std::unordered_map<int64_t, at::Tensor> leaves;   // tensor id -> same-rank stage boundary
    std::map<int64_t, std::map<int64_t, std::pair<at::Tensor, at::Tensor>>>
        pending;                                  // stage -> tensor -> (value, grad)
    std::map<int64_t, WeightGradStash> deferred;  // stage -> weight gradients left for W
    at::Tensor loss;
    TensorId loss_tensor;  // which loss (Chimera's pipelines each have their own)
    // A recomputed region's parameter inputs by slot (read instead of compute_params).
    std::unordered_map<int64_t, at::Tensor> params;
    // What each recomputed region of this micro-batch keeps for its backward (recompute.cc).
    std::vector<std::shared_ptr<void>> checkpoints;
  };
  std::vector<Micro> micro;

  // Runs a path of tensor `t`; a failure inside autograd functions travels as CommFailure.
  at::Tensor run_path(const lower::CommPath& path, TensorId t, at::Tensor x, PathPart part,
                      int64_t tag_base) {
    auto r = runner->run(path, graph.tensor(t).shape, std::move(x), part, tag_base,
                         dtype[static_cast<size_t>(t.value())],
                         ragged_dim[static_cast<size_t>(t.value())]);
    if (!r.ok()) throw CommFailure(r.error().message);
    return *r;
  }

  int64_t tag(const lower::Adapter& a, int direction, int64_t mb) const {
    LOOM_CHECK(mb < lower::kMaxMicroBatches)
        << "micro-batch " << mb << " past the lowering's limit";
    return lower::message_tag(a.id, direction == 0, mb);
  }

  // The value of tensor `id` made on this rank for micro-batch `m`.
  const at::Tensor& value(const Micro& m, int64_t id) const {
    const at::Tensor& t = m.env[static_cast<size_t>(id)];
    LOOM_CHECK(t.defined()) << "rank " << rank << ": '"
                            << graph.tensors()[static_cast<size_t>(id)].name
                            << "' has no value yet";
    return t;
  }
  int64_t stage_of(int64_t tensor) const {
    const int64_t s = producer_stage[static_cast<size_t>(tensor)];
    LOOM_CHECK(s >= 0) << "rank " << rank << " makes no '"
                       << graph.tensors()[static_cast<size_t>(tensor)].name << "'";
    return s;
  }
};

// The micro-batches' graph inputs by tensor id (Executor::run).
using Inputs = std::vector<std::unordered_map<int64_t, at::Tensor>>;

// The value op input `in` reads from `src` for micro-batch `mb` (executor.cc).
at::Tensor read(Executor::Impl& s, Executor::Impl::Micro& m, const Executor::Impl::Source& src,
                const graph::SubTensor& in, int64_t mb, const Inputs& inputs);
// Forward steps [begin, end) of `segment` for micro-batch `mb`, into `m` (executor.cc).
void run_steps(Executor::Impl& s, Executor::Impl::Micro& m, size_t segment, size_t begin,
               size_t end, int64_t mb, const Inputs& inputs);

// parallel.zero 3 (param_gather.cc). Runs a parameter adapter's item: gathers this rank's shard
// (the gather started ahead, or now) into m.adapted, and starts the segment's next gather.
void run_parameter_adapter(Executor::Impl& s, Executor::Impl::Micro& m,
                           const lower::SegmentItem& item, int64_t mb);
// Waits for a gather started ahead and not taken (the end of a forward block).
void finish_prefetch(Executor::Impl& s);
// x·Wᵀ (+ bias) for the weight `adapter` gathered into m.adapted (taken from there) from
// `shard`: the backward gathers it again rather than keeping it.
at::Tensor gathered_linear(Executor::Impl& s, Executor::Impl::Micro& m, const at::Tensor& x,
                           const at::Tensor& shard, const at::Tensor& bias, int64_t adapter,
                           int64_t mb);

// The program's recomputed regions (lower/recompute.h) as ranges of forward steps, with what
// each reads from outside and hands on (recompute.cc).
void plan_regions(Executor::Impl& s);
// Runs region `region` of `segment` for micro-batch `mb` as one autograd function: its forward
// keeps only its inputs, its backward runs it again (recompute.cc).
void run_region(Executor::Impl& s, Executor::Impl::Micro& m, size_t segment, size_t region,
                int64_t mb, const Inputs& inputs);

}  // namespace loom::runtime
