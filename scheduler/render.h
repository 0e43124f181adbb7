// Drawing a simulated schedule: a chrome trace (chrome://tracing, Perfetto) and an SVG Gantt
// chart, what a user reads before paying for a cluster.
#pragma once

#include <string>

#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace loom::sched {

// {"traceEvents": [...]}: pid = device, one "X" slice per block and device (named "F s1 mb3",
// one time unit drawn as 1 ms), and the device's memory as a "C" counter track.
std::string to_chrome_trace(const Schedule& schedule, const Timeline& timeline);

// One row per device, one rect (class "block") per block and device, coloured by micro-batch;
// F, B, I and W differ in lightness and label; idle time stays empty; a time axis below.
std::string to_svg(const Schedule& schedule, const Timeline& timeline);

}  // namespace loom::sched
