// plan.json: the whole plan of a run (planned graph, lowered programs, schedule) serialised
// as core/plan.proto in Protobuf JSON (written directly, lower/plan_json_writer.h; read with
// Protobuf's parser), so `loom train --plan` runs exactly the
// plan `loom plan` wrote. A plan carries a hash of what it was made from (plan/plan_hash.h: the
// plan's spec and cost model, the single-device model graph, and the code fingerprint); a plan
// whose hash differs from the one computed for this run is stale and refused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"
#include "lower/program.h"

namespace loom::lower {

// Bumped whenever a field of plan.proto changes meaning.
constexpr int kPlanFormatVersion = 1;

struct PlanFile {
  std::string source;  // the file it was read from, for messages
  std::string hash;
  std::string code_fingerprint;
  std::string config_yaml;  // the resolved config the plan was made from
  std::string model_digest;
  int64_t world_size = 0;
  int64_t micro_batches = 0;
  graph::Graph graph;  // planned: sub-operators on devices and stages
  Lowered lowered;
  std::string schedule_csv;
};

// What the code contributes to a plan's hash: loom's version, the plan format, the registered
// op types and policy names.
std::string code_fingerprint(const std::vector<std::string>& op_types,
                             const std::vector<std::string>& policy_names);

// A digest of the single-device model graph: tensor names, shapes, dtypes and roles, op types,
// names, attributes and annotations, in order. A changed model builder changes it.
std::string model_digest(const graph::Graph& model);

// FNV-1a 64 of `text` as 16 hex digits: stable across builds and platforms (a plan's hash).
std::string digest16(std::string_view text);

// plan.json text (compact Protobuf JSON), sealed. Fails only on an internal error.
Result<std::string> plan_to_json(const PlanFile& plan);

// Seals plan JSON: a first member "seal" holding the FNV-1a 64 digest (16 hex digits) of the
// text without it, trailing whitespace aside. A sealed text is sealed again over its content.
std::string seal_plan_json(const std::string& json);

// What a plan's seal says of its text: it matches, the text has none, or the text was changed
// after the seal was made.
enum class SealState { kMatches, kMissing, kMismatch };

// Reads plan.json text; `source` names the file in messages. Malformed JSON, an unknown format
// or version, a missing seal or one that does not match (the file was edited after `loom plan`
// wrote it), and ids out of range are errors naming the file and the field. With `seal` given,
// a missing or mismatched seal is recorded there instead of refused: for reading a hand-edited
// or third-party plan to judge it (`loom verify --static --plan`), never to run it.
Result<PlanFile> plan_from_json(const std::string& json, const std::string& source,
                                SealState* seal = nullptr);

// Reads a plan file from disk (`seal` as plan_from_json's).
Result<PlanFile> load_plan_file(const std::string& path, SealState* seal = nullptr);

}  // namespace loom::lower
