#include "exec/runtime/hf_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "checkpoint/hf_folder.h"
#include "models/hf_names.h"

namespace loom::runtime {
namespace {

// The folder's tensor `src.tensor` has the shape the map expects for loom's `name`.
Status check_shape(const HfFolder& folder, const models::HfSource& src, const std::string& name,
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

}  // namespace

Status load_hf_weights(const CheckpointTarget& target, const Config& config,
                       const std::filesystem::path& dir) {
  LOOM_ASSIGN_OR_RETURN(HfFolder folder, HfFolder::open(dir));
  if (!models::has_hf_names(config.model.type))
    return config.error("checkpoint.init_from", "model.type '" + config.model.type +
                                                    "' has no Hugging Face name map (gpt and "
                                                    "llama have)");
  // Every parameter of the model is checked against the folder's headers, not only this rank's:
  // every rank then refuses a folder with the same message, before any reads a byte.
  for (const graph::FullTensor& t : target.graph->tensors()) {
    if (t.role != graph::TensorRole::kParameter) continue;
    LOOM_ASSIGN_OR_RETURN(models::HfSource src,
                          models::hf_source(config.model.type, t.name, t.shape));
    LOOM_TRY(check_shape(folder, src, t.name, t.shape));
  }
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < target.pieces.size(); ++i) {
    const graph::SubTensor& piece = target.pieces[i];
    const graph::FullTensor& t = target.graph->tensor(piece.tensor);
    LOOM_ASSIGN_OR_RETURN(models::HfSource src,
                          models::hf_source(config.model.type, t.name, t.shape));
    at::Tensor param = target.params[i];
    // A value-split piece holds a share of a sum: chunk 0 the values, the others zeros (as the
    // seeded init).
    if (piece.value_chunk != 0) {
      param.zero_();
      continue;
    }
    models::Ranges loom;
    for (const auto& r : piece.ranges) loom.emplace_back(r.start, r.end);
    const models::Ranges region = src.region(loom);
    LOOM_ASSIGN_OR_RETURN(std::vector<float> values, folder.read(src.tensor, region));
    std::vector<int64_t> region_shape;
    for (const auto& [start, end] : region) region_shape.push_back(end - start);
    at::Tensor host = at::from_blob(values.data(), region_shape, at::kFloat);
    if (src.transposed) host = host.t();
    param.copy_(host.reshape(param.sizes()));
  }
  return Status::success();
}

}  // namespace loom::runtime
