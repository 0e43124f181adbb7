// The compute-only CSV schedule format of torch.distributed.pipelining: one row per rank, one
// action per cell ("0F0" stage 0 forward of micro-batch 0, "1B3", "2I1", "2W1"), an empty cell
// where the rank idles for a step, and composite cells "(0F7;7B3)OVERLAP_F_B" whose actions run
// in order in that step. Schedules move between loom and torchtitan through it. Files written
// before torch renamed its actions name a split backward's input gradient B instead of I; both
// namings are read (CsvActions).
#pragma once

#include <cstdint>
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
  double bwd = kBackwardForwards;
  double wgrad = 1;
  double input = 0;
};

// How a file names its backward actions. torch.distributed.pipelining writes a split backward
// as I (input gradient) then W (weight gradient); its files from before it renamed its actions
// write the input gradient B, so there a B followed by a W of the same stage and micro-batch is
// I + W, and a lone B is a full backward under either naming.
enum class CsvActions : uint8_t {
  kFullBackward,    // F and B only: both namings read it the same
  kInputWeight,     // a split backward written I + W (torch's current names)
  kBackwardWeight,  // a split backward written B + W (torch's names before the rename)
};
// "full-backward", "input-weight", "backward-weight": the JSON name.
std::string to_string(CsvActions actions);
// What a reader is told: "B + W (torch's names before it renamed the input gradient I: B
// followed by W of the same stage and micro-batch is I + W)".
std::string describe(CsvActions actions);

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
  int num_stages = 0;                              // S: stages 0..S-1
  int micro_batches = 0;                           // m: micro-batches 0..m-1
  CsvActions actions = CsvActions::kFullBackward;  // how the file named its backwards
  // Per workload block index, its cell (a block several rows run together: the topmost).
  std::vector<CsvCell> cells;
};

// Reads the chain pipeline the cells name (stages 0..S-1, micro-batches 0..m-1). Each row is a
// rank; the rank of each stage (looped, V-shaped, or any other placement) is inferred from the
// rows that run it, per micro-batch where stages move (Chimera). A micro-batch's backward at a
// stage is either B or I + W; in a file that writes no I, a B with a W of the same stage and
// micro-batch is torch's older name of I (CsvSchedule::actions says which naming was read).
// Errors start with the cell, "row R, column C: ...", for a malformed cell, a block listed twice,
// a block off its stage's rank, a block that waits for a dependency ordered after it (the first
// such block), and a deadlock (each stuck rank's cell); a missing block names the row that
// should run it. Errors in a file of the older names say so.
Result<CsvSchedule> read_csv(const std::string& text, const CsvImportOptions& options = {});
// read_csv's schedule.
Result<Schedule> from_csv(const std::string& text, const CsvImportOptions& options = {});

}  // namespace loom::sched
