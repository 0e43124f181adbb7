#include "exec/runtime/trainer.h"

#include <chrono>
#include <cmath>

#include <ATen/ATen.h>

#include "exec/runtime/data.h"
#include "exec/runtime/executor.h"
#include "exec/runtime/lr_schedule.h"
#include "exec/runtime/optimizer.h"
#include "graph/verify.h"
#include "models/model.h"

namespace loom::runtime {

struct Trainer::Impl {
  Config config;
  graph::OpRegistry ops = graph::OpRegistry::with_builtin_ops();
  KernelRegistry kernels = KernelRegistry::with_builtin_kernels();
  graph::Graph graph;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<TokenSource> data;
  std::unique_ptr<Optimizer> optimizer;
  TensorId tokens_id, targets_id;
  int64_t seq = 0;
  int64_t rows = 0;  // samples per micro-batch (all replicas)
  int64_t step = 0;
  std::vector<int64_t> buffer;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const Config& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  LOOM_ASSIGN_OR_RETURN(impl->graph, models::build_model(config, impl->ops));
  LOOM_TRY(graph::verify(impl->graph, impl->ops));
  auto tokens = impl->graph.find_tensor("tokens");
  auto targets = impl->graph.find_tensor("targets");
  LOOM_CHECK(tokens && targets) << "model graph has no tokens/targets inputs";
  impl->tokens_id = *tokens;
  impl->targets_id = *targets;
  const Shape& shape = impl->graph.tensor(*tokens).shape;
  impl->rows = shape[0];
  impl->seq = shape[1];
  const graph::FullTensor* vocab_owner = nullptr;
  for (const auto& op : impl->graph.ops())
    if (op.type() == "embedding") vocab_owner = &impl->graph.tensor(op.inputs[1].tensor);
  LOOM_CHECK(vocab_owner) << "model graph has no embedding";
  LOOM_ASSIGN_OR_RETURN(impl->data, make_token_source(config, vocab_owner->shape[0], impl->seq));

  impl->executor = std::make_unique<Executor>(impl->graph, impl->kernels,
                                              static_cast<uint64_t>(config.run.seed));
  std::vector<bool> decay;
  for (TensorId id : impl->executor->parameter_ids())
    decay.push_back(impl->graph.tensor(id).shape.size() >= 2);
  impl->optimizer =
      std::make_unique<Optimizer>(config.optimizer, impl->executor->parameters(), std::move(decay));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Result<StepStats> Trainer::step() {
  Impl& s = *impl_;
  auto start = std::chrono::steady_clock::now();
  const int64_t micro = s.config.micro_batches();
  const int64_t first_sample = s.step * s.config.batch.global;
  s.executor->zero_grad();
  s.buffer.resize(static_cast<size_t>(s.seq + 1));
  double loss_sum = 0;
  for (int64_t m = 0; m < micro; ++m) {
    at::Tensor tokens = at::empty({s.rows, s.seq}, at::kLong);
    at::Tensor targets = at::empty({s.rows, s.seq}, at::kLong);
    int64_t* tp = tokens.data_ptr<int64_t>();
    int64_t* gp = targets.data_ptr<int64_t>();
    for (int64_t r = 0; r < s.rows; ++r) {
      LOOM_TRY(s.data->sample(first_sample + m * s.rows + r, s.seq, s.buffer.data()));
      std::copy(s.buffer.begin(), s.buffer.begin() + s.seq, tp + r * s.seq);
      std::copy(s.buffer.begin() + 1, s.buffer.end(), gp + r * s.seq);
    }
    at::Tensor loss = s.executor->forward({{s.tokens_id.value(), tokens}, {s.targets_id.value(), targets}});
    (loss * (1.0 / static_cast<double>(micro))).backward();
    loss_sum += loss.item<double>();
  }
  const auto& params = s.executor->parameters();
  const double norm = std::sqrt(grad_norm_squared(params));
  clip_gradients(params, norm, s.config.optimizer.clip_grad_norm);
  const double lr = lr_at(s.config.optimizer, s.step, s.config.run.steps);
  s.optimizer->step(lr);
  ++s.step;

  StepStats st;
  st.step = s.step;
  st.loss = loss_sum / static_cast<double>(micro);
  st.lr = lr;
  st.grad_norm = norm;
  st.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  st.tokens_per_s = static_cast<double>(s.config.batch.global * s.seq) / st.step_time_s;
  return st;
}

int64_t Trainer::steps_done() const { return impl_->step; }
const Config& Trainer::config() const { return impl_->config; }
const graph::Graph& Trainer::graph() const { return impl_->graph; }
Executor& Trainer::executor() { return *impl_->executor; }

}  // namespace loom::runtime
