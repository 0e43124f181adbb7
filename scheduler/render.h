// Drawing a simulated schedule: a chrome trace (chrome://tracing, Perfetto) and an SVG Gantt
// chart, what a user reads before paying for a cluster.
#pragma once

#include <string>

#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace loom::sched {

// A block's slice name in chrome traces, "F s1 mb3" (kind letter, stage, micro-batch): the
// estimated timeline and the measured traces (observe/trace.h) name blocks alike.
std::string block_slice_name(char kind, StageId stage, MicroBatch mb);

// {"traceEvents": [...]}: pid = device, one "X" slice per block and device (named "F s1 mb3",
// one time unit drawn as 1 ms), and the device's memory as a "C" counter track.
std::string to_chrome_trace(const Schedule& schedule, const Timeline& timeline);

// One row per device, one rect (class "block") per block and device, coloured by micro-batch;
// F, B, I and W differ in lightness and label; idle time stays empty; a time axis below.
std::string to_svg(const Schedule& schedule, const Timeline& timeline);

}  // namespace loom::sched
