// The executor: runs one rank's lowered program, for every world size (one process alone is a
// plan of one rank over a one-rank Comm). Forward segments run the rank's ops with adapters as
// autograd functions (their backward runs the gradient path); stage boundaries are explicit
// sends and receives of activations and gradients; then gradient synchronisation of replicated
// parameter pieces and the step's global loss and gradient norm.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/comm.h"
#include "graph/graph.h"
#include "lower/program.h"
#include "runtime/device.h"
#include "runtime/kernels.h"

namespace loom::observe {
class Tracer;
}  // namespace loom::observe
namespace loom::runtime {

// What a step's forward and backward leave for the optimizer step, summed over every rank.
struct StepSums {
  double loss = 0;               // the loss summed over the micro-batches
  double grad_norm_squared = 0;  // of the scaled gradients, each element counted once
  double aux_loss = 0;           // the auxiliary losses (moe_aux_loss) summed likewise
  // A mixture of experts' busiest expert: its tokens over the mean (1: balanced), averaged over
  // layers and micro-batches; 0 without experts.
  double max_expert_load = 0;
  bool stop_requested = false;  // some rank asked the run to stop (run()'s `stop_requested`)
};

// How the executor runs: the parameters' seed, the device and precision, the gradient bucket
// size (comm.bucket_mb).
class GradBuckets;

struct ExecutorOptions {
  uint64_t seed = 0;
  RunDevice device;
  int64_t bucket_bytes = int64_t{25} << 20;
  // parallel.zero 1: each shared piece's gradient is summed onto one owner, which alone keeps
  // optimizer state for it and updates it (grad_buckets.h).
  bool zero1 = false;
  // false: parameter pieces start as zeros, for a loader that fills every one next
  // (checkpoint.init_from), so that no full tensor is drawn only to be overwritten.
  bool seeded_init = true;
};

class Executor {
 public:
  // Creates the sub-groups every adapter and gradient sync needs (a collective over `world`:
  // every rank constructs its executor at the same point) and materialises this rank's
  // parameter pieces (seeded per FullTensor on the CPU, then moved to `device`: every device
  // starts from the same weights). Fails naming the op whose kernel is missing.
  static Result<std::unique_ptr<Executor>> create(const graph::Graph& planned,
                                                  const lower::Lowered& lowered,
                                                  std::shared_ptr<comm::Comm> world,
                                                  const KernelRegistry& kernels,
                                                  const ExecutorOptions& options);
  ~Executor();

  // Forward and backward of every micro-batch in program order; `inputs[m]` holds the full
  // values of the graph inputs of micro-batch m by tensor id, on the host (copied to the device
  // here, asynchronously from pinned memory) or on the device. Gradients are scaled by
  // `grad_scale` and synchronised (in buckets started during backward: grad_buckets.h). One
  // all-reduce and one host read for the returned sums; `stop_requested` rides that all-reduce,
  // so every rank learns whether any rank asked to stop.
  Result<StepSums> run(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs,
                       double grad_scale, bool stop_requested = false);
  // The forward blocks of the program alone, without recording for autograd: the loss summed
  // over the micro-batches of `inputs` (a validation pass). Gradients, optimizer state and the
  // parameters are left as they were; grad_norm_squared is 0.
  Result<StepSums> evaluate(const std::vector<std::unordered_map<int64_t, at::Tensor>>& inputs);

  // The samples (rows of dimension 0) of each graph input this rank's ops read, as one range per
  // input tensor id; an input it never reads is absent (a middle pipeline stage reads no tokens).
  std::map<int64_t, graph::Range> input_rows() const;

  // This rank's parameter pieces, float32 on the device (leaves with gradients after run()).
  const std::vector<at::Tensor>& parameters() const;
  const std::vector<graph::SubTensor>& parameter_pieces() const;
  // How many ranks hold each parameter piece (for a global norm that counts elements once).
  const std::vector<int64_t>& parameter_replicas() const;
  // The elements [begin, end) of each piece (flattened) this rank updates: all of them, but
  // under parallel.zero 1 its share of the shared pieces (grad_buckets.h).
  std::vector<std::pair<int64_t, int64_t>> parameter_owned() const;
  // parallel.zero 1: after the optimizer step, every holder of a shared piece receives the
  // owner's updated values. Nothing to do otherwise.
  Status gather_parameters();
  // parallel.zero 3: the parameter gathers this rank ran since it was made, and how many of them
  // were started ahead of their use (a forward gathers the next piece, a backward the previous
  // linear's weight, while it computes).
  struct GatherCounts {
    int64_t gathers = 0;
    int64_t ahead = 0;
  };
  GatherCounts gather_counts() const;
  // This rank's first piece of parameter `name`; undefined when it holds none. On one rank, the
  // whole tensor.
  at::Tensor parameter(const std::string& name) const;
  comm::Comm& world();
  const RunDevice& device() const;
  // The gradient buckets of the parameter pieces this rank shares; null when it shares none.
  const GradBuckets* gradient_buckets() const;
  // Records every block and communication call of the following steps on `tracer`
  // (logging.trace_steps, runtime/step_trace.h); null: nothing is recorded.
  void set_tracer(observe::Tracer* tracer);

  struct Impl;  // opaque; public so the adapter autograd function can reach it

 private:
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::runtime
