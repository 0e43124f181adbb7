// The values of a model's graph inputs (TensorRole::kInput), one micro-batch at a time. Every
// sample is found by its global index, so each plan (micro-batching, data parallelism, any split)
// sees the same data as one device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "core/result.h"
#include "data/sources.h"
#include "graph/graph.h"

namespace loom::runtime {

class InputFeeder {
 public:
  // A language model (inputs `tokens` and `targets` read by an `embedding`) takes its samples
  // from the configured token sources (data.*, eval.*); every other input is synthetic and
  // seeded:
  // floating inputs ~ N(0, 1), integer inputs uniform in [0, value_bound). Fails naming the
  // tensor when an input has no batch dimension, the inputs disagree on the micro-batch size,
  // or an integer input has no value bound.
  static Result<std::unique_ptr<InputFeeder>> create(const Config& config,
                                                     const graph::Graph& graph);

  // Samples per micro-batch (all data-parallel replicas): dimension 0 of every input.
  int64_t rows() const { return rows_; }
  // The inputs of the micro-batch whose first sample has global index `first_sample`, by id:
  // training samples, or with `validation` the validation samples (eval.*).
  Result<std::unordered_map<int64_t, at::Tensor>> micro_batch(int64_t first_sample,
                                                              bool validation = false);
  // Limits what micro_batch() makes to the rows of each input a rank's ops read (by tensor id,
  // Executor::input_rows): other rows are zeros, an input no op reads is left out, and no sample
  // is read that no row needs. Unset: every row of every input.
  void read_only(std::map<int64_t, graph::Range> rows) { rows_read_ = std::move(rows); }
  // Whether the run validates (eval.every > 0).
  bool has_validation() const { return validating_; }

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
  // The token sources of a language model; null otherwise.
  data::DataSources tokens_;
  bool validating_ = false;
  std::optional<std::map<int64_t, graph::Range>> rows_read_;
  // The rows of input `id` to make: [0, rows_) unless read_only() says otherwise; empty for an
  // input no op reads.
  graph::Range rows_of(TensorId id) const;
  TensorId tokens_id_, targets_id_;
  int64_t seq_ = 0;
  std::vector<int64_t> buffer_;
  std::vector<Synthetic> synthetic_;
};

}  // namespace loom::runtime
