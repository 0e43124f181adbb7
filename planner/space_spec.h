// The split in space a plan asks for: the part of parallel.* the policies read (the device
// mesh, expert and sequence parallelism, context parallelism's kind, the stages), read once from
// the config by plan::PlanSpec::of, which holds it with the schedule and the memory features and
// says whether the schedule runs two pipelines; policies read it, not the config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "planner/mesh.h"

namespace loom::planner {

// How context parallelism splits attention (parallel.cp_kind).
enum class CpKind {
  kRing,            // p2p (or ring): ring attention over the sequence in zigzag order
  kRingContiguous,  // p2p-contiguous: ring attention, sequence chunk c in order on cp rank c
  kAllToAll,        // all-to-all (Ulysses): attention on whole sequences of 1/cp of the heads
};
// parallel.cp_kind's spelling of `kind` (p2p, p2p-contiguous, all-to-all).
const char* name(CpKind kind);

// The layers of one pipeline stage, both ends included (an entry of parallel.stages).
struct StageRange {
  int64_t first_layer = 0;
  int64_t last_layer = 0;
};

struct SpaceSpec {
  std::string policy = "hybrid";  // the registered policy that applies the split
  DeviceMesh mesh;                // dp x pp x cp x tp ranks (planner/mesh.h's order)
  int64_t ep = 1;                 // expert-parallel ranks, carved out of the dp ranks
  bool sp = false;                // sequence parallelism over the tp ranks
  CpKind cp_kind = CpKind::kRing;
  int64_t chunks = 1;              // pipeline stages per pipeline device (looping placement)
  std::vector<StageRange> stages;  // given stage boundaries; empty: balanced by FLOPs
  // A second pipeline over the same devices in the other direction (chimera's placement,
  // planner/chimera.h); the plan sets it from its schedule.
  bool two_pipelines = false;

  int64_t pipeline_stages() const { return mesh.pp() * chunks; }
  // Whether attention becomes ring attention steps before any split (context_parallel.h).
  bool ring_attention() const { return mesh.cp() > 1 && cp_kind != CpKind::kAllToAll; }
  bool all_to_all_attention() const { return mesh.cp() > 1 && cp_kind == CpKind::kAllToAll; }
  // "parallel.dp (2) x parallel.tp (2) x parallel.pp (1)", parallel.cp where above 1.
  std::string degrees() const;
};

}  // namespace loom::planner
