// Training data: each sample is found by its global index, so the data a step sees does not
// depend on the plan (micro-batching, data-parallel degree) and a resumed run continues exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/result.h"

namespace loom::runtime {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes seq+1 token ids of sample `index` (inputs are the first seq, targets the last seq).
  virtual Status sample(int64_t index, int64_t seq, int64_t* out) const = 0;
};

// `synthetic`: seeded arithmetic sequences (start + stride * t mod vocab): learnable, so the
// loss falls; `tokens`: windows of a flat little-endian uint16 file (nanoGPT's format).
// Fails with the key or file named when the data cannot serve this model.
Result<std::unique_ptr<TokenSource>> make_token_source(const Config& config, int64_t vocab,
                                                       int64_t seq);

}  // namespace loom::runtime
