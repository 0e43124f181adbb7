#include "checkpoint/hf_names.h"

#include <utility>

namespace loom {

SliceRanges HfSource::region(const SliceRanges& loom) const {
  SliceRanges out = loom;
  if (transposed) std::swap(out[0], out[1]);
  for (size_t d = 0; d < out.size(); ++d) {
    out[d].first += offset[d];
    out[d].second += offset[d];
  }
  return out;
}

Result<HfSource> HfNameMap::source(const std::string& name, const Shape& shape,
                                   int64_t vocab) const {
  if (empty()) return Error::at(name, "no Hugging Face name map to find '" + name + "' in");
  LOOM_ASSIGN_OR_RETURN(HfSource src, lookup(name, shape));
  const bool vocab_rows = src.tensor == embedding || src.tensor == "lm_head.weight";
  if (vocab_rows && vocab > 0 && shape.size() == 2 && shape[0] > vocab) {
    src.shape[0] = vocab;
    src.padded_rows = true;
  }
  return src;
}

bool HfNameMap::buffer(const std::string& hf_name) const {
  for (const std::string& tail : buffers)
    if (hf_name.size() >= tail.size() &&
        hf_name.compare(hf_name.size() - tail.size(), tail.size(), tail) == 0)
      return true;
  return false;
}

}  // namespace loom
