// The values of a model's graph inputs (TensorRole::kInput), one micro-batch at a time. Every
// sample is found by its global index, so each plan (micro-batching, data parallelism, any split)
// sees the same data as one device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "graph/graph.h"
#include "runtime/data.h"

namespace loom::runtime {

class InputFeeder {
 public:
  // A language model (inputs `tokens` and `targets` read by an `embedding`) takes its samples
  // from the configured token source (data.*); every other input is synthetic and seeded:
  // floating inputs ~ N(0, 1), integer inputs uniform in [0, value_bound). Fails naming the
  // tensor when an input has no batch dimension, the inputs disagree on the micro-batch size,
  // or an integer input has no value bound.
  static Result<std::unique_ptr<InputFeeder>> create(const Config& config,
                                                     const graph::Graph& graph);

  // Samples per micro-batch (all data-parallel replicas): dimension 0 of every input.
  int64_t rows() const { return rows_; }
  // The inputs of the micro-batch whose first sample has global index `first_sample`, by id.
  Result<std::unordered_map<int64_t, at::Tensor>> micro_batch(int64_t first_sample);

 private:
  InputFeeder() = default;

  struct Synthetic {
    TensorId id;
    std::string name;
    Shape sample_shape;  // the input's shape without the batch dimension
    bool floating = true;
    at::ScalarType dtype = at::kFloat;
    int64_t bound = 0;
  };
  uint64_t seed_ = 0;
  int64_t rows_ = 0;
  // The token source of a language model; null otherwise.
  std::unique_ptr<TokenSource> tokens_;
  TensorId tokens_id_, targets_id_;
  int64_t seq_ = 0;
  std::vector<int64_t> buffer_;
  std::vector<Synthetic> synthetic_;
};

}  // namespace loom::runtime
