// Predefined pipeline schedules: GPipe, 1F1B, interleaved 1F1B, Chimera, looped breadth-first
// and ZB-H1, built for a chain of stages. The executor asks device_orders() for its program.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/schedule.h"

namespace loom::sched {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kChimera, kLoopedBfs, kZbH1 };

std::string to_string(ScheduleKind kind);  // "gpipe", "1f1b", "interleaved", ...
// Parses the command-line name; the error suggests the closest name.
Result<ScheduleKind> parse_schedule_kind(const std::string& name);
const std::vector<std::string>& schedule_kind_names();

// A chain pipeline to schedule. Units as in `loom schedule`: fwd and bwd are the forward and
// backward times of one device's share of the model for one micro-batch (a chunk takes 1/v of
// them); for ZB-H1 bwd is the input-gradient part I and wgrad the weight-gradient part W.
// Memory: +1/v per chunk forward (micro-batches of activations), released by B (or W).
struct PipelineSpec {
  int devices = 1;        // p
  int micro_batches = 1;  // m
  int chunks = 1;         // v: stages per device (interleaved, looped-bfs)
  double fwd = 1;
  double bwd = kBackwardForwards;
  double wgrad = 1;

  static PipelineSpec of(int p, int m, int v = 1) {
    PipelineSpec s;
    s.devices = p, s.micro_batches = m, s.chunks = v;
    return s;
  }
  Status validate() const;
  std::string to_string() const;
  friend bool operator==(const PipelineSpec& a, const PipelineSpec& b) {
    return a.devices == b.devices && a.micro_batches == b.micro_batches && a.chunks == b.chunks &&
           a.fwd == b.fwd && a.bwd == b.bwd && a.wgrad == b.wgrad;
  }
};

Result<Schedule> gpipe(const PipelineSpec& spec);
Result<Schedule> one_f_one_b(const PipelineSpec& spec);
// Megatron's interleaved 1F1B: stage c*p+d on device d; needs m to be a multiple of p.
Result<Schedule> interleaved_1f1b(const PipelineSpec& spec);
// Two pipelines in opposite directions; even micro-batches go down (stage s on device s), odd
// ones up (stage s on device p-1-s). Needs even p and m a multiple of 2.
Result<Schedule> chimera(const PipelineSpec& spec);
// Breadth-first looping placement: every micro-batch through chunk 0, then chunk 1, ...
Result<Schedule> looped_bfs(const PipelineSpec& spec);
// Zero-bubble ZB-H1: backward split into I and W, W deferred to fill bubbles, 1F1B's memory.
Result<Schedule> zb_h1(const PipelineSpec& spec);

Result<Schedule> build_predefined(ScheduleKind kind, const PipelineSpec& spec);

// The executor's entry point: each device's ordered (stage, micro-batch, kind) blocks for a
// predefined schedule over p devices, m micro-batches and v chunks per device.
Result<std::vector<std::vector<BlockId>>> device_orders(ScheduleKind kind, int p, int m, int v = 1);

}  // namespace loom::sched
