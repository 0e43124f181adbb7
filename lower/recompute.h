// Activation recomputation as a pass over lowered programs (parallel.recompute): it marks, per
// segment, the item ranges whose forward keeps only what enters and leaves them and whose
// backward runs that forward again. The executor runs the marks; the estimator counts them.
#pragma once

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

enum class Recompute { kNone, kSelective, kFull };
// "none" | "selective" | "full"; the error names parallel.recompute.
Result<Recompute> parse_recompute(const std::string& text);
// The spelling parse_recompute reads.
const char* name(Recompute mode);

// Marks `lowered`'s segments (replacing earlier marks):
//  - selective: every attention-core op (graph::OpDef::attention_core) alone;
//  - full: each run of items of one model layer (ops before the first layer and after the last
//    are kept as they are). An adapter counts with the op after it; an adapter that sends,
//    receives, or crosses stages ends a region, so a recomputed forward repeats only
//    collectives among the ranks of its own stage, never a pipeline transfer.
// `fused`: fused_into_next of the plan, when the caller has it (found otherwise).
void mark_recompute(const graph::Graph& planned, Lowered& lowered, Recompute mode,
                    const std::vector<bool>* fused = nullptr);

// Whether item `item` of `segment` lies in one of its regions.
bool recomputed(const Segment& segment, int64_t item);

// What a region hands on: the values its forward must keep for readers outside it on its rank,
// since the rest of what it makes is made again in its backward. The executor keeps exactly
// these and the estimator counts exactly these.
struct RegionBorder {
  std::vector<int64_t> tensors;   // made by its ops, read outside it (directly), or the loss
  std::vector<int64_t> adapters;  // delivered inside it to a consumer op outside it
};

// Which (tensor, consumer op) pairs are read through an adapter: one set per lowering.
using AdapterReads = std::set<std::pair<int64_t, std::string>>;
AdapterReads adapter_reads(const Lowered& lowered);

// Where each value is read on one rank, indexed once so that every region's border is a few
// look-ups (a thousand-rank plan has thousands of regions).
class ProgramReaders {
 public:
  ProgramReaders(const graph::Graph& planned, const Lowered& lowered, const AdapterReads& reads,
                 const Program& program);
  RegionBorder border(size_t segment, const RecomputeRegion& region) const;

 private:
  struct Position {
    size_t segment;
    int64_t item;
  };
  const graph::Graph& graph_;
  const Lowered& lowered_;
  const Program& program_;
  std::unordered_map<int64_t, std::vector<Position>> direct_;  // tensor -> items reading it
  std::map<std::pair<int64_t, std::string>, std::vector<Position>> through_;  // -> reading ops
};

// One region's border (a ProgramReaders made for it alone).
RegionBorder region_border(const graph::Graph& planned, const Lowered& lowered,
                           const Program& program, size_t segment, const RecomputeRegion& region);

}  // namespace loom::lower
