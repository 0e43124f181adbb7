// plan.json: the whole plan of a run (planned graph, lowered programs, schedule) serialised
// as core/plan.proto in Protobuf JSON (written directly, lower/plan_json_writer.h; read with
// Protobuf's parser), so `loom train --plan` runs exactly the
// plan `loom plan` wrote. A plan carries a hash of what it was made from: the config keys that
// shape a plan (model.*, parallel.*, batch.*, cost.*), the single-device model graph, and the code
// fingerprint (loom version, plan format, op types, policies). A plan whose hash differs from
// the one computed for this run is stale and refused, naming what differs.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
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

// The hash a plan for `config` made by this code from `model` carries (16 hex digits).
std::string plan_hash(const Config& config, const std::string& model_digest,
                      const std::string& code_fingerprint);

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

// Refuses a stale plan: its hash must equal `expected_hash`. The error names the file and what
// differs (the first config keys with both values, the code fingerprint, or the model).
Status check_plan_current(const PlanFile& plan, const std::string& source, const Config& config,
                          const std::string& model_digest, const std::string& code_fingerprint);

}  // namespace loom::lower
