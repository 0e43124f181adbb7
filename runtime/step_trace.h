// The runtime's side of measured step traces (logging.trace_steps, observe/trace.h): the spans
// the executor, the path runner and the gradient buckets record while a Tracer is set, and the
// end of a traced step, when rank 0 gathers every rank's events over the world Comm, writes
// trace_step_N.json and sums the step up against the plan's estimate.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "comm/comm.h"
#include "lower/program.h"
#include "observe/trace.h"
#include "runtime/device.h"

namespace loom::runtime {

// A block of the program, named as the plan's timeline.json names it ("F s1 mb3").
observe::TraceEvent block_event(const lower::ProgramBlock& block);

// A communication call on `tensor` (its bytes) with `peer` and `tag` (-1: a collective), over
// `group` (null: point to point).
observe::TraceEvent comm_event(const char* name, const at::Tensor& tensor, int64_t peer,
                               int64_t tag, const comm::Comm* group);

// Ends a traced step: every rank's events reach rank 0 over `world` (an all-gather of their
// sizes, then of the bytes: bounded by the Comm's timeout), which writes
// `<output_dir>/trace_step_<step>.json` and returns its summary line (observe::summary_line);
// the other ranks return "".
Result<std::string> finish_step_trace(const observe::Tracer& tracer, comm::Comm& world,
                                      const RunDevice& device, int64_t step,
                                      const std::string& output_dir,
                                      const observe::EstimateFigures& estimate);

}  // namespace loom::runtime
