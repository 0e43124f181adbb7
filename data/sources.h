// The training and validation samples a run's config asks for (data.*, eval.*).
#pragma once

#include <cstdint>
#include <memory>

#include "core/config.h"
#include "core/result.h"
#include "data/token_source.h"

namespace loom::data {

struct DataSources {
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> validation;  // null when eval.every is 0
};

// Opens every file the config names and checks it against the model (its vocabulary, `seq`
// tokens per sample) before step 1: each failure names its key and file.
Result<DataSources> open_sources(const Config& config, int64_t vocab, int64_t seq);
// The training samples alone.
Result<std::unique_ptr<TokenSource>> make_token_source(const Config& config, int64_t vocab,
                                                       int64_t seq);

}  // namespace loom::data
