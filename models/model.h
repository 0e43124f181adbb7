// The model registry: each model family (model.type) is one entry that builds its graph from a
// config's model.*, checks the split in space against it and says what its throughput counts.
// loom's zoo (GPT, Llama dense and MoE, Swin Transformer, AlphaFold2's Evoformer) registers here
// like a user's model.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/hf_names.h"
#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/policy.h"

namespace loom::models {

// What a throughput figure counts for a model: tokens for a language model (per_sample =
// sequence length), images for a vision model (per_sample = 1).
struct SampleItems {
  int64_t per_sample = 1;
  std::string unit = "samples";
  std::string rate_label = "samples/s";  // how progress lines print the rate: tok/s, img/s
};

// What a model will hold, known before it is built: enough to refuse one that cannot fit in
// well under a second, naming the key that made it large.
struct ModelSize {
  double parameters = 0;  // a lower bound (the dominant weights), in double: any args fit
  std::string shape;      // the args that size it: "layers 2, hidden 64, ..."
  std::string key;        // the first of those model.args gives, else model.preset
};

// What a model's graph is built for besides model.*, from the plan's PlanSpec: a builder reads no
// parallel.* or batch.* key (under policy auto those are the planner's choice, not the file's).
struct GraphShape {
  // Samples of one micro-batch over every data-parallel replica (batch.micro x parallel.dp).
  int64_t samples = 1;
  int64_t tp = 1;  // the tensor-parallel degree (Llama lays out its kv heads by it)
};

// The single-device graph of one micro-batch over every data-parallel replica, from the config's
// model.* and `shape`.
using ModelBuilder =
    std::function<Result<graph::Graph>(const Config&, const GraphShape&, const graph::OpRegistry&)>;

struct ModelType {
  std::string name;  // the model.type that selects it
  ModelBuilder build;
  // Checks that the split in space fits the model of the config's model.* (e.g. tensor
  // parallelism divides the heads), naming the keys and numbers. Empty: any split the policy
  // accepts.
  std::function<Status(const Config&, const planner::SpaceSpec&)> check_parallel;
  // Empty: samples.
  std::function<Result<SampleItems>(const Config&)> items;
  // Whether parallel.cp may split its sequence (a language model's causal attention); others
  // refuse parallel.cp above 1.
  bool context_parallel = false;
  // The routed experts of the config's model (0: a dense one) that expert parallelism may split;
  // empty: the type holds no mixture of experts (parallel.ep above 1 refused).
  std::function<Result<int64_t>(const Config&)> experts;
  // Empty: no size check before building.
  std::function<Result<ModelSize>(const Config&)> size;
  // Its parameters' names in Hugging Face checkpoints (models/hf_names.h); empty: none
  // (checkpoint.init_from of a folder and export-hf refuse the type).
  HfNameMap hf_names;
};

class ModelRegistry {
 public:
  static ModelRegistry with_builtin_models();  // gpt, llama, swin, evoformer

  // Refuses an entry without a name or a builder, or a name already registered.
  Status add(ModelType type);
  const ModelType* find(const std::string& name) const;
  std::vector<std::string> names() const;
  // The entry of config.model.type, or an error naming model.type, its line and the types.
  Result<const ModelType*> of(const Config& config) const;

 private:
  std::vector<ModelType> types_;
};

// The split in space against `type`'s model: context and expert parallelism where the type
// allows them, then the type's own check. Errors name the keys.
Status check_parallel(const Config& config, const planner::SpaceSpec& space, const ModelType& type);
// parallel.cp above 1 only for a type that declares context_parallel, naming the type.
Status check_context_parallel(const planner::SpaceSpec& space, const ModelType& type);
// What a decoder (GPT, Llama) needs of parallel.cp and parallel.pp: the sequence `seq` in cp
// equal chunks under the hybrid policy, `heads` (named `heads_key`: the heads all-to-all splits)
// whole on each of cp x tp ranks under cp_kind all-to-all, and no more stages than `layers`.
// Errors name the keys, the preset's where model.args does not set them.
Status check_decoder_parallel(const Config& config, const planner::SpaceSpec& space, int64_t layers,
                              int64_t seq, const std::string& heads_key, int64_t heads);

// The vocabulary rows of a language model, as Megatron's make_vocab_size_divisible_by: `vocab`
// itself where the default `groups` are 8 or more (every tp within a node splits them) or
// model.args.vocab_groups is given, else `vocab` padded to a multiple of 64 with 64 groups
// (GPT-2's 50257 becomes 50304), so that every tp dividing 64 splits it. The same under every plan
// (a checkpoint reshards between any two). The padded rows are zero in a loaded folder, left out of
// the loss and of export-hf. Updates `groups` to the padded vocabulary's.
int64_t pad_vocab(const Config& config, int64_t vocab, int64_t* groups);

// Tensor parallelism splits a language model's vocabulary in its loss's `vocab_groups` groups:
// tp must divide them. pad_vocab pads where it can; what is left (a tp that does not divide 64,
// an explicit vocab_groups) is refused, saying to pad the vocabulary and to what.
Status check_vocab_split(const Config& config, const planner::SpaceSpec& space, int64_t vocab,
                         int64_t vocab_groups);

// "unknown <family> preset 'x' (did you mean 'y'?); presets: ...", naming model.preset.
Error unknown_preset(const Config& config, const std::string& family,
                     const std::vector<std::string>& names);
// The preset model.preset names in `presets`, or that error.
template <class Spec>
Result<Spec> find_preset(const Config& config, const std::map<std::string, Spec>& presets,
                         const std::string& family) {
  auto it = presets.find(config.model.preset);
  if (it != presets.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [name, spec] : presets) names.push_back(name);
  return unknown_preset(config, family, names);
}

}  // namespace loom::models
