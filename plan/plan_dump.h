// The plan dump, what a user reads before paying for a cluster: every rank's program
// (programs/rank_K.txt), plan.json, the pipeline schedule (schedule.csv in
// torch.distributed.pipelining's format, timeline.json for chrome://tracing and Perfetto,
// schedule.svg) and the estimate per rank (summary.txt, summary.json). `loom plan` and the
// embedding API's Trainer::dump_plan write it.
#pragma once

#include <string>

#include "core/config.h"
#include "core/result.h"
#include "plan/plan.h"

namespace loom::plan {

struct DumpOptions {
  bool plan_json = true;  // plan.json is the whole plan: ~100 MB at 1024 ranks
};

// summary.txt: a line on the plan, the cost model, a mixture of experts' routing where there is
// one, then one line per rank.
std::string summary_table(const Config& config, const Plan& plan);

// Writes the dump of `plan`, made of `config`, into `dir` (created), each file atomically.
// Returns the summary table. Errors name the file.
Result<std::string> write_plan_dump(const std::string& dir, const Config& config, const Plan& plan,
                                    const DumpOptions& options = {});

}  // namespace loom::plan
