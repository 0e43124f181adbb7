// plan.json's text written straight from a PlanFile, in the bytes Protobuf's JSON printer gives
// core/plan.proto (compact, proto field names, proto3 presence: zero scalars and empty lists
// left out, int64 quoted, enums by name, doubles as Protobuf prints them). A 1024-rank plan is
// ~100 MB of text: building the message and printing it through Protobuf's reflection took most
// of `loom plan`. Reading plan.json stays Protobuf's parser (lower/plan_file.h).
#pragma once

#include <string>

#include "lower/plan_file.h"

namespace loom::lower {

// Appends the plan's JSON object, unsealed, to `out`.
void write_plan_json(const PlanFile& plan, std::string& out);

}  // namespace loom::lower
