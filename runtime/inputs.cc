#include "runtime/inputs.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

#include "graph/ops_context.h"
#include "runtime/device.h"
#include "runtime/init.h"

namespace loom::runtime {

Result<std::unique_ptr<InputFeeder>> InputFeeder::create(const Config& config,
                                                         const graph::Graph& graph) {
  std::unique_ptr<InputFeeder> f(new InputFeeder());
  f->seed_ = static_cast<uint64_t>(config.run.seed);
  auto tokens = graph.find_tensor("tokens");
  auto targets = graph.find_tensor("targets");
  const graph::FullTensor* vocab_owner = nullptr;
  // The embedding reads the tokens, or their zigzag order under context parallelism
  // (graph/ops_context.h).
  std::set<int64_t> token_ids;
  if (tokens) token_ids.insert(tokens->value());
  for (const auto& op : graph.ops())
    if (op.type() == graph::kSeqPermute && token_ids.count(op.inputs[0].tensor.value()))
      token_ids.insert(op.outputs[0].tensor.value());
  if (tokens && targets)
    for (const auto& op : graph.ops())
      if (op.type() == "embedding" && token_ids.count(op.inputs[0].tensor.value()))
        vocab_owner = &graph.tensor(op.inputs[1].tensor);

  f->rows_ = -1;
  for (const auto& t : graph.tensors()) {
    if (t.role != graph::TensorRole::kInput) continue;
    if (t.shape.empty())
      return Error::at(t.name, "model input '" + t.name + "' has no batch dimension");
    if (f->rows_ >= 0 && t.shape[0] != f->rows_)
      return Error::at(t.name, "model input '" + t.name + "' has " + std::to_string(t.shape[0]) +
                                   " samples per micro-batch, other inputs " +
                                   std::to_string(f->rows_));
    f->rows_ = t.shape[0];
    if (vocab_owner && (t.id == *tokens || t.id == *targets)) continue;
    Synthetic s;
    s.id = t.id;
    s.name = t.name;
    s.sample_shape = Shape(t.shape.begin() + 1, t.shape.end());
    s.floating = is_floating(t.dtype);
    s.dtype = scalar_type(t.dtype);
    s.bound = t.value_bound;
    if (!s.floating && s.bound <= 0)
      return Error::at(t.name,
                       "integer model input '" + t.name +
                           "' has no value bound, so synthetic data cannot be drawn for it");
    f->synthetic_.push_back(std::move(s));
  }
  if (f->rows_ < 0) return Error::at(graph.name(), "model '" + graph.name() + "' has no inputs");

  if (vocab_owner) {
    f->tokens_id_ = *tokens;
    f->targets_id_ = *targets;
    f->seq_ = graph.tensor(*tokens).shape.at(1);
    LOOM_ASSIGN_OR_RETURN(f->tokens_, data::open_sources(config, vocab_owner->shape[0], f->seq_));
  }
  f->validating_ = config.eval.every > 0;
  return f;
}

graph::Range InputFeeder::rows_of(TensorId id) const {
  if (!rows_read_) return {0, rows_};
  auto it = rows_read_->find(id.value());
  return it == rows_read_->end() ? graph::Range{0, 0} : it->second;
}

Result<std::unordered_map<int64_t, at::Tensor>> InputFeeder::micro_batch(int64_t first_sample,
                                                                         bool validation) {
  std::unordered_map<int64_t, at::Tensor> out;
  if (tokens_.train) {
    data::TokenSource& source = validation ? *tokens_.validation : *tokens_.train;
    // A sample is read only when a row of the tokens or of the targets this rank reads is it.
    const graph::Range want_tokens = rows_of(tokens_id_), want_targets = rows_of(targets_id_);
    auto in = [](const graph::Range& r, int64_t row) { return row >= r.start && row < r.end; };
    buffer_.resize(static_cast<size_t>(seq_ + 1));
    at::Tensor tokens = at::zeros({rows_, seq_}, at::kLong);
    at::Tensor targets = at::zeros({rows_, seq_}, at::kLong);
    for (int64_t r = 0; r < rows_; ++r) {
      if (!in(want_tokens, r) && !in(want_targets, r)) continue;
      LOOM_TRY(source.sample(first_sample + r, buffer_.data()));
      std::copy(buffer_.begin(), buffer_.begin() + seq_, tokens.data_ptr<int64_t>() + r * seq_);
      std::copy(buffer_.begin() + 1, buffer_.end(), targets.data_ptr<int64_t>() + r * seq_);
    }
    if (want_tokens.size() > 0) out[tokens_id_.value()] = tokens;
    if (want_targets.size() > 0) out[targets_id_.value()] = targets;
  }
  // Synthetic inputs of validation samples come from indices no training run reaches.
  const int64_t synthetic_first = validation ? first_sample + (int64_t{1} << 50) : first_sample;
  for (const Synthetic& s : synthetic_) {
    const graph::Range want = rows_of(s.id);
    if (want.size() == 0) continue;
    // One generator per (run seed, tensor, sample): a sample's values do not depend on which
    // micro-batch or rank reads it.
    const uint64_t base = tensor_seed(seed_, s.name);
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<size_t>(rows_));
    for (int64_t r = 0; r < rows_; ++r) {
      if (r < want.start || r >= want.end) {
        rows.push_back(at::zeros(s.sample_shape,
                                 at::TensorOptions().dtype(s.floating ? at::kFloat : at::kLong)));
        continue;
      }
      const uint64_t index = static_cast<uint64_t>(synthetic_first + r);
      at::Generator gen =
          at::make_generator<at::CPUGeneratorImpl>(base ^ ((index + 1) * 0xD1B54A32D192ED03ull));
      if (s.floating)
        rows.push_back(
            at::normal(0.0, 1.0, s.sample_shape, gen, at::TensorOptions().dtype(at::kFloat)));
      else
        rows.push_back(
            at::randint(0, s.bound, s.sample_shape, gen, at::TensorOptions().dtype(at::kLong)));
    }
    out[s.id.value()] = at::stack(rows).to(s.dtype);
  }
  return out;
}

}  // namespace loom::runtime
