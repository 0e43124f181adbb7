// The compute-only CSV schedule format of torch.distributed.pipelining: one row per rank, one
// action per cell ("0F0" stage 0 forward of micro-batch 0, "1B3", "2I1", "2W1"), an empty cell
// where the rank idles for a step, and composite cells "(0F7;7B3)OVERLAP_F_B" whose actions run
// in order in that step. Schedules move between loom and torchtitan through it.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "scheduler/schedule.h"

namespace loom::sched {

// One column per step of the schedule run with every block taking one step, so idle steps
// show as empty cells. A block on several devices appears in each of their rows, in one column.
Result<std::string> to_csv(const Schedule& schedule);

// Block costs of an imported chain pipeline, in `loom schedule` units: fwd and bwd per
// device's share (a stage of v stages per device takes 1/v), wgrad for W when B is split, and
// input for I (0: bwd, as `loom schedule --from-csv --bwd` gives I's time).
struct CsvImportOptions {
  double fwd = 1;
  double bwd = 2;
  double wgrad = 1;
  double input = 0;
};

// A cell of the file, 1-based as a spreadsheet shows it: the row is the line, the column the
// comma-separated field.
struct CsvCell {
  int row = 0;
  int column = 0;
  std::string to_string() const;  // "row 2, column 5"
  friend bool operator==(const CsvCell& a, const CsvCell& b) {
    return a.row == b.row && a.column == b.column;
  }
};

// An imported schedule and where each of its blocks is written.
struct CsvSchedule {
  Schedule schedule;
  int num_stages = 0;     // S: stages 0..S-1
  int micro_batches = 0;  // m: micro-batches 0..m-1
  // Per workload block index, its cell (a block several rows run together: the topmost).
  std::vector<CsvCell> cells;
};

// Reads the chain pipeline the cells name (stages 0..S-1, micro-batches 0..m-1). Each row is a
// rank; the rank of each stage (looped, V-shaped, or any other placement) is inferred from the
// rows that run it, per micro-batch where stages move (Chimera). A micro-batch's backward at a
// stage is either B or I + W. Errors start with the cell, "row R, column C: ...", for a malformed
// cell, a block listed twice, a block off its stage's rank, a block that waits for a dependency
// ordered after it (the first such block), and a deadlock (each stuck rank's cell); a missing
// block names the row that should run it.
Result<CsvSchedule> read_csv(const std::string& text, const CsvImportOptions& options = {});
// read_csv's schedule.
Result<Schedule> from_csv(const std::string& text, const CsvImportOptions& options = {});

}  // namespace loom::sched
