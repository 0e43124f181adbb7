// Lowering: a placed, staged graph becomes one Program per rank. Activations that a consumer
// op needs in another layout (or on another stage) get an Adapter: the communication path of
// the forward pass and the path of its gradient in the backward pass. Gradient layouts are the
// forward layouts with R and V swapped (replicas receive partial gradients; each value chunk
// receives the whole gradient), so the backward of an all-gather is a reduce-scatter, of an
// all-reduce an all-reduce, and so on. Parameters held by several devices get their gradients
// all-reduced over exactly those devices; the loss seeds its backward with 1 / (its replicas).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/path.h"
#include "scheduler/block.h"

namespace loom::lower {

// Gradient layout of a tensor laid out as `l`.
Layout grad_layout(const Layout& l);

struct Adapter {
  int64_t id = 0;
  TensorId tensor;
  std::string consumer;  // the first consumer op's name
  // Every consumer op reading through this adapter: ops that want the same layout of the same
  // tensor in the same stage share one transfer (q, k and v read one all-gather).
  std::vector<std::string> consumers;
  StageId producer_stage;
  StageId consumer_stage;
  Layout from;
  Layout to;
  CommPath forward;   // from -> to
  CommPath backward;  // grad(to) -> grad(from)
  // Producers and consumers share no device: the adapter runs in two parts, the producers'
  // (steps and sends) and the consumers' (receives and steps).
  bool disjoint = false;
  // parallel.zero 3 (lower/param_shards.h): `tensor` is a parameter stored as `from` (split
  // over the readers) and read as `to`; the adapter runs in its consumers' stage.
  bool parameter = false;
  // A parameter adapter whose consumers need the gathered value again in their backward (linear
  // weights): its backward runs the forward path again before the gradient path, so the
  // gathered value is not kept between a micro-batch's forward and backward.
  bool regather = false;
  bool cross_stage() const { return producer_stage != consumer_stage; }
};

// One thing a segment does in its forward pass, in order: run a local sub-op, or take part in
// an adapter (the steps of its path that involve this rank).
struct SegmentItem {
  enum class Kind { kOp, kAdapter } kind;
  int64_t index;  // op index in the planned graph, or adapter id
  // Adapters between disjoint device groups run in two parts: the producers' (their steps and
  // the sends, at the end of the producing stage) and the consumers' (receives and their steps).
  bool producer_side = false;
};

// Items [begin, end) of a segment whose forward keeps only what enters and leaves them: their
// backward runs their forward again first (parallel.recompute; lower/recompute.h).
struct RecomputeRegion {
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const RecomputeRegion& a, const RecomputeRegion& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// The work of one pipeline stage on one rank.
struct Segment {
  StageId stage;
  std::vector<SegmentItem> items;
  std::vector<RecomputeRegion> recompute;  // in item order, disjoint
};

// Parameter pieces held by several devices: their gradients are summed over `devices`.
struct GradSync {
  TensorId tensor;
  graph::SubTensor piece;
  std::vector<DeviceId> devices;
};

// The scheduler's block kinds. A backward may run whole (kB) or split as zero-bubble schedules
// run it: the input gradient (kI: the backward pass with its communication, parameter matrix
// products left out) and later the weight gradient (kW: those matrix products, no
// communication), which fills pipeline bubbles. sched::to_char gives the letter.
using sched::BlockKind;
// Whether blocks of `kind` run the backward pass and its communication (B and I do).
inline bool runs_backward_pass(BlockKind kind) {
  return kind == BlockKind::kB || kind == BlockKind::kI;
}
struct ProgramBlock {
  BlockKind kind;
  StageId stage;
  MicroBatch micro_batch;
};

struct Program {
  Rank rank;
  std::vector<Segment> segments;     // one per stage this rank runs
  std::vector<ProgramBlock> blocks;  // the order of stage x micro-batch work
  std::vector<int64_t> grad_syncs;   // indices into Lowered::grad_syncs this rank joins
  double loss_seed = 0;              // 1 / replicas of this rank's loss piece; 0: no loss here
};

struct Lowered {
  std::vector<Adapter> adapters;
  std::vector<GradSync> grad_syncs;
  std::vector<Program> programs;  // by rank
};

// The one encoding of a message tag: step `step` of adapter `adapter`'s forward (or gradient)
// path for micro-batch `mb`. Every party of an exchange computes the same tag, the runtime
// sends with it and the deadlock check matches events by it.
constexpr int64_t kMaxMicroBatches = 1024;  // per step, per data-parallel replica
constexpr int64_t kMaxPathSteps = 64;       // steps of one communication path
inline int64_t message_tag(int64_t adapter, bool forward, int64_t mb, int64_t step = 0) {
  return (((adapter * 2 + (forward ? 0 : 1)) * kMaxMicroBatches + mb) * kMaxPathSteps + step);
}
// The parts of a message tag, for messages that name a stuck exchange.
struct MessageTagParts {
  int64_t adapter = 0;
  bool forward = true;
  int64_t mb = 0;
  int64_t step = 0;
};
inline MessageTagParts message_tag_parts(int64_t tag) {
  MessageTagParts p;
  p.step = tag % kMaxPathSteps;
  tag /= kMaxPathSteps;
  p.mb = tag % kMaxMicroBatches;
  tag /= kMaxMicroBatches;
  p.forward = tag % 2 == 0;
  p.adapter = tag / 2;
  return p;
}

// Lowers `graph` (placed on `world_size` ranks) with `micro_batches` micro-batches per step, each
// micro-batch's forward then its backward (gradient accumulation), or in `order` when given: per
// rank, its (kind, stage, micro-batch) blocks. Fails naming the tensor when pieces do not form
// layouts, and the ranks and steps when the programs would deadlock.
Result<Lowered> lower(const graph::Graph& graph, int64_t world_size, int64_t micro_batches,
                      PathFinder& paths,
                      const std::vector<std::vector<ProgramBlock>>* order = nullptr);

// Per rank, its (kind, stage, micro-batch) blocks, chosen from a lowering whose programs are
// complete but for their order (GPipe's until then): what the adapters deliver and the gradient
// syncs are known, so an order may depend on what each stage holds (plan/plan.cc).
using BlockOrderFn =
    std::function<Result<std::vector<std::vector<ProgramBlock>>>(const Lowered& lowered)>;
// What a lowering does besides keeping data dependencies.
struct LowerOptions {
  // parallel.zero 3: parameters stored split over their readers (lower/param_shards.h).
  bool shard_parameters = false;
  // Off when the caller marks recomputation first and checks the marked programs itself (a
  // recomputed forward repeats its collectives inside the backward).
  bool check_deadlock = true;
};
// The same, the order asked of `order` once adapters, gradient syncs and loss seeds are in
// place; the deadlock check runs on the order it returns.
Result<Lowered> lower(const graph::Graph& graph, int64_t world_size, int64_t micro_batches,
                      PathFinder& paths, const BlockOrderFn& order,
                      const LowerOptions& options = {});

// Simulates every rank's communication in program order (sends buffered, receives and
// collectives blocking) and fails naming the stuck ranks and what each waits for.
Status check_deadlock_free(const graph::Graph& graph, const Lowered& lowered);

// A readable listing of one rank's program.
std::string listing(const graph::Graph& graph, const Lowered& lowered, Rank rank);

}  // namespace loom::lower
