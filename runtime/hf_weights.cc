#include "runtime/hf_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/hf_folder.h"
#include "checkpoint/hf_names.h"

namespace loom::runtime {
namespace {

// The folder's name of `tensor` (checkpoint/hf_folder.h: with or without the base prefix).
std::string folder_name(const HfFolder& folder, const HfNameMap& names, const std::string& tensor) {
  return folder.resolve(tensor, names.base_prefix);
}

// The folder's config.json says its LM head is untied (tie_word_embeddings: false).
bool untied_head(const HfFolder& folder) {
  nlohmann::json j = nlohmann::json::parse(folder.config_text(), nullptr, false);
  return j.is_object() && j.contains("tie_word_embeddings") &&
         j["tie_word_embeddings"].is_boolean() && !j["tie_word_embeddings"].get<bool>();
}

// Whether tensors `a` and `b` of the folder hold the same values, compared a block of rows at a
// time so that no rank holds a whole embedding.
Result<bool> same_values(const HfFolder& folder, const std::string& a, const std::string& b) {
  LOOM_ASSIGN_OR_RETURN(auto ta, folder.find(a));
  LOOM_ASSIGN_OR_RETURN(auto tb, folder.find(b));
  const Shape& shape = ta.second.shape;
  if (shape != tb.second.shape || shape.size() != 2) return false;
  constexpr int64_t kRows = 1024;  // 4 MiB of floats per side at hidden 1024
  for (int64_t row = 0; row < shape[0]; row += kRows) {
    const SliceRanges block = {{row, std::min(shape[0], row + kRows)}, {0, shape[1]}};
    LOOM_ASSIGN_OR_RETURN(std::vector<float> va, folder.read(a, block));
    LOOM_ASSIGN_OR_RETURN(std::vector<float> vb, folder.read(b, block));
    if (va != vb) return false;
  }
  return true;
}

// A tied run of a folder that carries its own LM head: transformers ties the two only when the
// file's head equals the embedding; a different head it keeps untied and uses. loom's tied model
// cannot use it, so that folder is refused with the setting that loads it as transformers does.
// Every rank reads both tensors, so every rank refuses alike.
Status check_tied_head(const HfFolder& folder, const Config& config, const std::string& embedding) {
  if (!folder.contains("lm_head.weight") || untied_head(folder)) return Status::success();
  LOOM_ASSIGN_OR_RETURN(bool same, same_values(folder, "lm_head.weight", embedding));
  if (same) return Status::success();
  return config.error("model.args.tied",
                      "the Hugging Face folder '" + folder.dir().string() +
                          "' holds its own 'lm_head.weight', different from '" + embedding +
                          "', while its config.json ties them (tie_word_embeddings); "
                          "transformers then leaves the head untied and uses 'lm_head.weight': "
                          "set model.args.tied=false to load the folder as it does");
}

// Every tensor of the folder is read by some parameter, or is a buffer: a folder with more
// layers than model.args, or an untied head under a tied model, would otherwise load in part.
Status check_all_read(const HfFolder& folder, const HfNameMap& names,
                      const std::set<std::string>& read, bool tied) {
  std::vector<std::string> unread;
  for (const std::string& name : folder.tensor_names()) {
    if (read.count(name) || names.buffer(name)) continue;
    // A tied model's file may still carry the head it shares with the embedding (equal values:
    // check_tied_head).
    if (tied && name == "lm_head.weight" && !untied_head(folder)) continue;
    unread.push_back(name);
  }
  if (unread.empty()) return Status::success();
  std::string why = tied && std::count(unread.begin(), unread.end(), "lm_head.weight")
                        ? "the folder's LM head is untied (tie_word_embeddings: false) but "
                          "model.args.tied is true"
                        : "does model.args match its config.json? model.from_hf fills them";
  return Error::at(unread.front(), "the Hugging Face folder '" + folder.dir().string() + "' has " +
                                       std::to_string(unread.size()) +
                                       " tensors loom's model does not read, e.g. '" +
                                       unread.front() + "' (" + why + ")");
}

// The folder's tensor `src.tensor` has the shape the map expects for loom's `name`.
Status check_shape(const HfFolder& folder, const HfSource& src, const std::string& name,
                   const Shape& loom_shape) {
  auto found = folder.find(src.tensor);
  if (!found.ok())
    return Error::at(src.tensor,
                     found.error().message + " (loom's parameter '" + name + "' reads it)");
  const Shape& have = found->second.shape;
  bool ok = have.size() == src.shape.size();
  for (size_t d = 0; ok && d < have.size(); ++d)
    ok = src.more_rows && d == 0 ? have[d] >= src.shape[d] : have[d] == src.shape[d];
  if (ok) return Status::success();
  return Error::at(src.tensor, "tensor '" + src.tensor + "' in '" + found->first.string() +
                                   "' has shape " + to_string(have) + ", but loom's parameter '" +
                                   name + "' " + to_string(loom_shape) + " needs " +
                                   (src.more_rows ? "at least " : "") + to_string(src.shape) +
                                   " (does model.args match the folder's config.json?)");
}

// The model's vocabulary: the token ids' bound (the embedding may hold padded rows past it).
int64_t graph_vocab(const graph::Graph& g) {
  for (const graph::FullTensor& t : g.tensors())
    if (t.role == graph::TensorRole::kInput && t.name == "tokens") return t.value_bound;
  return 0;
}

// Reads one parameter piece from the folder; rows of a padded vocabulary past the file's are 0.
Status load_piece(const HfFolder& folder, const HfSource& src, const graph::SubTensor& piece,
                  at::Tensor param) {
  // A value-split piece holds a share of a sum: chunk 0 the values, the others zeros (as the
  // seeded init).
  if (piece.value_chunk != 0) {
    param.zero_();
    return Status::success();
  }
  SliceRanges loom;
  for (const auto& r : piece.ranges) loom.emplace_back(r.start, r.end);
  SliceRanges region = src.region(loom);
  if (src.padded_rows) {
    param.zero_();
    region[0].second = std::min(region[0].second, src.shape[0]);
    if (region[0].second <= region[0].first) return Status::success();
    param = param.narrow(0, 0, region[0].second - region[0].first);
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<float> values, folder.read(src.tensor, region));
  std::vector<int64_t> region_shape;
  for (const auto& [start, end] : region) region_shape.push_back(end - start);
  at::Tensor host = at::from_blob(values.data(), region_shape, at::kFloat);
  if (src.transposed) host = host.t();
  param.copy_(host.reshape(param.sizes()));
  return Status::success();
}

}  // namespace

Status load_hf_weights(const CheckpointTarget& target, const Config& config, const HfNameMap& names,
                       const std::filesystem::path& dir) {
  LOOM_ASSIGN_OR_RETURN(HfFolder folder, HfFolder::open(dir));
  if (names.empty())
    return config.error("checkpoint.init_from", "model.type '" + config.model.type +
                                                    "' has no Hugging Face name map (its model "
                                                    "registry entry gives none)");
  const int64_t vocab = graph_vocab(*target.graph);
  // Every parameter of the model is checked against the folder's headers, not only this rank's:
  // every rank then refuses a folder with the same message, before any reads a byte.
  std::set<std::string> read;
  bool tied = true;
  for (const graph::FullTensor& t : target.graph->tensors()) {
    if (t.role != graph::TensorRole::kParameter) continue;
    LOOM_ASSIGN_OR_RETURN(HfSource src, names.source(t.name, t.shape, vocab));
    src.tensor = folder_name(folder, names, src.tensor);
    LOOM_TRY(check_shape(folder, src, t.name, t.shape));
    read.insert(src.tensor);
    if (src.tensor == "lm_head.weight") tied = false;
  }
  if (tied) LOOM_TRY(check_tied_head(folder, config, folder_name(folder, names, names.embedding)));
  LOOM_TRY(check_all_read(folder, names, read, tied));
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < target.pieces.size(); ++i) {
    const graph::SubTensor& piece = target.pieces[i];
    const graph::FullTensor& t = target.graph->tensor(piece.tensor);
    LOOM_ASSIGN_OR_RETURN(HfSource src, names.source(t.name, t.shape, vocab));
    src.tensor = folder_name(folder, names, src.tensor);
    LOOM_TRY(load_piece(folder, src, piece, target.params[i]));
  }
  return Status::success();
}

}  // namespace loom::runtime
