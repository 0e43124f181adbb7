// Context parallelism: ring attention (cp steps of query chunk x key chunk, merged by their
// log-sum-exp) equals one-device causal attention per element, forward and backward, in
// contiguous and zigzag order (there on the permuted sequence); GPT and
// Llama tiny under cp alone and with tp, sp, pp, dp and zero 3 equal one device (ranks as threads
// over the local backend; SGD, so tests/support/tolerance.h's bounds apply); the per-op oracle
// holds on every piece.
#include "planner/context_parallel.h"

#include <ATen/ATen.h>

#include "graph/ops_context.h"
#include "runtime/attention_tiles.h"
#include "runtime/kernels.h"
#include "tests/runtime/local_ranks.h"
#include "tests/support/plan_chain.h"

namespace loom {
namespace {

Config config(const std::string& model, const std::vector<std::string>& overrides) {
  const std::string yaml = "run: {seed: 7, steps: 5}\nmodel: {type: " + model +
                           ", preset: tiny}\nbatch: {global: 4, micro: 2}\n"
                           "optimizer: {type: sgd, lr: 0.3, momentum: 0.9, weight_decay: 0.01, "
                           "clip_grad_norm: 1.0}\ncomm: {timeout_s: 60}\n";
  auto c = parse_config(yaml, model + ".yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// The attention output and (q, k, v) gradients of one layer's attention: `ring` runs the
// ring-attention ops that replace it under `overrides` (with parallel.cp), else the plain op.
struct AttentionRun {
  at::Tensor out, dq, dk, dv;
};

AttentionRun run_attention(const std::string& model, const std::vector<std::string>& overrides,
                           const std::vector<at::Tensor>& qkv, const at::Tensor& dout) {
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto kernels = runtime::KernelRegistry::with_builtin_kernels();
  auto g = testing_support::single_device_graph(config(model, overrides), ops);
  EXPECT_TRUE(g.ok()) << g.error().message;
  std::vector<at::Tensor> in;
  for (const at::Tensor& t : qkv) in.push_back(t.detach().clone().requires_grad_(true));
  // Tensor values by id: q, k, v of h0's attention, then whatever its ops make.
  std::map<int64_t, at::Tensor> env;
  const graph::Op* first = nullptr;
  for (const auto& op : g->ops())
    if (op.name().rfind("h0.attn.core", 0) == 0 && !first) first = &op;
  EXPECT_NE(first, nullptr);
  for (size_t i = 0; i < 3; ++i) env[first->inputs[i].tensor.value()] = in[i];
  int64_t out_id = -1;  // what the last of them writes: the attention's output
  for (const auto& op : g->ops()) {
    if (op.name().rfind("h0.attn.core", 0) != 0) continue;
    out_id = op.outputs[0].tensor.value();
    std::vector<at::Tensor> args;
    for (const auto& i : op.inputs) args.push_back(env.at(i.tensor.value()));
    auto outs = (*kernels.find(op.type()))(runtime::KernelContext{*g, op}, args);
    for (size_t o = 0; o < outs.size(); ++o) env[op.outputs[o].tensor.value()] = outs[o];
  }
  AttentionRun r;
  r.out = env.at(out_id);
  (r.out.to(at::kDouble) * dout).sum().backward();
  r.dq = in[0].grad();
  r.dk = in[1].grad();
  r.dv = in[2].grad();
  return r;
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.abs().max().to(at::kDouble))
      .item<double>();
}

// float32 attention over 24 keys of head size 16: the ring merges the same exponentials in
// another order, a few ulps apart (1e-6 measured); 1e-5 of the largest element bounds it. A
// chunk attending the wrong keys, a missed causal mask or a lost step moves outputs by 1e-2 or
// more.
constexpr double kRingTolerance = 1e-5;

// The positions of a sequence of `seq` in zigzag order over 2 cp halves (`zigzag`), else in
// order: index i holds position perm[i].
at::Tensor order_of(int64_t seq, int64_t cp, bool zigzag) {
  std::vector<at::Tensor> parts;
  for (const auto& run : graph::sequence_runs(0, seq, seq, zigzag ? 2 * cp : 0))
    parts.push_back(at::arange(run.position, run.position + run.len, at::kLong));
  return at::cat(parts);
}

// In zigzag order the ring's operands and results are the sequence permuted: it runs on the
// permuted q, k, v and output gradient and must give the permuted output and gradients.
void expect_ring_equals_attention(const std::string& model, int64_t cp, int64_t seq,
                                  const std::string& order) {
  SCOPED_TRACE(model + " cp " + std::to_string(cp) + " seq " + std::to_string(seq) + " " + order);
  at::manual_seed(11);
  const std::vector<std::string> args = {"model.args.seq=" + std::to_string(seq)};
  const int64_t kv = model == "llama" ? 32 : 64;  // llama tiny: 2 kv heads of 16
  const std::vector<at::Tensor> qkv = {at::randn({2, seq, 64}), at::randn({2, seq, kv}),
                                       at::randn({2, seq, kv})};
  const at::Tensor dout = at::randn({2, seq, 64}, at::kDouble);
  const AttentionRun plain = run_attention(model, args, qkv, dout);
  const at::Tensor perm = order_of(seq, cp, order == "zigzag");
  auto permuted = [&](const at::Tensor& t) { return t.index_select(1, perm); };
  std::vector<std::string> ring_args = args;
  ring_args.push_back("parallel.cp=" + std::to_string(cp));
  ring_args.push_back(order == "zigzag" ? "parallel.cp_kind=p2p"
                                        : "parallel.cp_kind=p2p-contiguous");
  const AttentionRun ring = run_attention(
      model, ring_args, {permuted(qkv[0]), permuted(qkv[1]), permuted(qkv[2])}, permuted(dout));
  EXPECT_LT(max_rel(ring.out, permuted(plain.out)), kRingTolerance);
  EXPECT_LT(max_rel(ring.dq, permuted(plain.dq)), kRingTolerance);
  EXPECT_LT(max_rel(ring.dk, permuted(plain.dk)), kRingTolerance);
  EXPECT_LT(max_rel(ring.dv, permuted(plain.dv)), kRingTolerance);
}

TEST(RingAttention, EqualsCausalAttentionForwardAndBackward) {
  expect_ring_equals_attention("gpt", 2, 24, "contiguous");
  expect_ring_equals_attention("gpt", 3, 24, "contiguous");    // chunks of 8
  expect_ring_equals_attention("llama", 4, 24, "contiguous");  // chunks of 6: grouped-query heads
  expect_ring_equals_attention("llama", 3, 21, "contiguous");  // chunks of 7
}

// Zigzag order: chunk c holds halves c and 2 cp - 1 - c; each step computes only the blocks of
// halves with something to see and merges them by their log-sum-exp.
TEST(RingAttention, ZigzagEqualsCausalAttentionOfThePermutedSequence) {
  expect_ring_equals_attention("gpt", 2, 24, "zigzag");    // halves of 6
  expect_ring_equals_attention("gpt", 3, 24, "zigzag");    // halves of 4
  expect_ring_equals_attention("llama", 4, 24, "zigzag");  // halves of 3: grouped-query heads
  expect_ring_equals_attention("llama", 3, 30, "zigzag");  // halves of 5
}

// A piece of a zigzag ring step as the cp rank runs it (one query chunk, its key chunk) equals
// the rows of the whole step's result: the kernel reads its positions from the piece's ranges.
TEST(RingAttention, ZigzagPiecesEqualTheWholeStep) {
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto kernels = runtime::KernelRegistry::with_builtin_kernels();
  auto g = testing_support::single_device_graph(
      config("llama", {"parallel.cp=4", "model.args.seq=32"}), ops);
  ASSERT_TRUE(g.ok()) << g.error().message;
  at::manual_seed(13);
  const at::Tensor q = at::randn({2, 32, 64}), k = at::randn({2, 32, 32}),
                   v = at::randn({2, 32, 32});
  int steps = 0;
  for (const auto& op : g->ops()) {
    if (op.type() != graph::kRingAttentionStep || op.layer() != 0) continue;
    ++steps;
    auto whole = (*kernels.find(op.type()))(runtime::KernelContext{*g, op}, {q, k, v});
    for (const graph::Op& part : planner::ring_step_parts(op)) {
      const graph::Range qr = part.inputs[0].ranges[1], kr = part.inputs[1].ranges[1];
      auto piece = (*kernels.find(op.type()))(
          runtime::KernelContext{*g, part},
          {q.narrow(1, qr.start, qr.size()), k.narrow(1, kr.start, kr.size()),
           v.narrow(1, kr.start, kr.size())});
      for (size_t o = 0; o < 2; ++o) {
        const at::Tensor want = whole[o].narrow(1, qr.start, qr.size());
        // Queries that see nothing: -inf on both sides.
        const at::Tensor seen = want.isfinite();
        EXPECT_TRUE(piece[o].isfinite().equal(seen)) << op.name() << " output " << o;
        // The same products per element: equal to float32 rounding.
        EXPECT_TRUE(
            at::allclose(piece[o].masked_fill(~seen, 0), want.masked_fill(~seen, 0), 1e-6, 1e-6))
            << op.name() << " output " << o;
      }
    }
  }
  EXPECT_EQ(steps, 4);
}

// A ring step's attention a few queries at a time (tiles of 5 over 13 queries, keys from
// position 4 so the causal mask cuts through tiles) equals the whole at once, output, log-sum-exp
// and every gradient, the log-sum-exp's included: the same float32 products per element, summed
// in another order (1e-6 of the largest element).
TEST(RingAttention, TilesOfQueriesEqualTheWhole) {
  at::manual_seed(12);
  const at::Tensor q = at::randn({2, 3, 13, 8}), k = at::randn({2, 3, 9, 8}),
                   v = at::randn({2, 3, 9, 8});
  const at::Tensor d_out = at::randn({2, 3, 13, 8}), d_lse = at::randn({2, 3, 13});
  std::vector<std::vector<at::Tensor>> runs;
  for (int64_t tile : {13, 5}) {
    std::vector<at::Tensor> in = {q.clone().requires_grad_(true), k.clone().requires_grad_(true),
                                  v.clone().requires_grad_(true)};
    auto [out, lse] = runtime::tiled_attention_with_lse(in[0], in[1], in[2], 8, 4, tile);
    ((out * d_out).sum() + (lse * d_lse).sum()).backward();
    runs.push_back({out.detach(), lse.detach(), in[0].grad(), in[1].grad(), in[2].grad()});
  }
  for (size_t i = 0; i < runs[0].size(); ++i)
    EXPECT_LT(max_rel(runs[1][i], runs[0][i]), 1e-6) << "tensor " << i;
  // The untiled run against autograd through the explicit products, in double.
  std::vector<at::Tensor> in = {q.to(at::kDouble).requires_grad_(true),
                                k.to(at::kDouble).requires_grad_(true),
                                v.to(at::kDouble).requires_grad_(true)};
  at::Tensor scores = at::matmul(in[0], in[1].transpose(-1, -2)) / std::sqrt(8.0);
  const at::Tensor hidden =
      at::arange(4, 13, at::kLong).unsqueeze(0) > at::arange(8, 21, at::kLong).unsqueeze(1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const at::Tensor lse = at::logsumexp(scores, -1);
  const at::Tensor out = at::matmul(at::softmax(scores, -1), in[2]);
  ((out * d_out).sum() + (lse * d_lse).sum()).backward();
  const std::vector<at::Tensor> want = {out.detach(), lse.detach(), in[0].grad(), in[1].grad(),
                                        in[2].grad()};
  // float32 against double over 9 keys of 8: 1e-5 of the largest element bounds the rounding;
  // a gradient missing the log-sum-exp's term is off by its whole size.
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LT(max_rel(runs[0][i], want[i]), 1e-5) << "tensor " << i;
}

void expect_equal_to_single_device(const std::string& model, const std::vector<std::string>& o,
                                   int world_size) {
  static std::map<std::string, testing_support::Reference> refs;
  auto it = refs.find(model);
  if (it == refs.end())
    it = refs.emplace(model, testing_support::train_single_device(config(model, {}), 5)).first;
  // GPT's key bias cannot change the output (softmax ignores a shift shared by all keys).
  testing_support::expect_equal_to_single_device(
      it->second, config(model, o), world_size,
      model == "gpt" ? std::vector<std::string>{"attn.k.b"} : std::vector<std::string>{});
}

TEST(ContextParallel, GptCp2) { expect_equal_to_single_device("gpt", {"parallel.cp=2"}, 2); }
TEST(ContextParallel, GptCp4) { expect_equal_to_single_device("gpt", {"parallel.cp=4"}, 4); }
TEST(ContextParallel, GptCp4Contiguous) {
  expect_equal_to_single_device("gpt", {"parallel.cp=4", "parallel.cp_kind=p2p-contiguous"}, 4);
}
TEST(ContextParallel, LlamaCp2) { expect_equal_to_single_device("llama", {"parallel.cp=2"}, 2); }
TEST(ContextParallel, LlamaCp4) { expect_equal_to_single_device("llama", {"parallel.cp=4"}, 4); }
TEST(ContextParallel, LlamaCp2Tp2Sp) {
  expect_equal_to_single_device("llama", {"parallel.cp=2", "parallel.tp=2", "parallel.sp=true"}, 4);
}
TEST(ContextParallel, GptCp2Pp2) {
  expect_equal_to_single_device("gpt", {"parallel.cp=2", "parallel.pp=2"}, 4);
}
TEST(ContextParallel, LlamaCp2Dp2Zero3SelectiveRecompute) {
  expect_equal_to_single_device(
      "llama",
      {"parallel.cp=2", "parallel.dp=2", "parallel.zero=3", "parallel.recompute=selective"}, 4);
}

// all-to-all (Ulysses): attention on whole sequences of its share of the heads, the lowering's
// all-to-alls around it.
TEST(ContextParallel, LlamaCp2AllToAll) {
  expect_equal_to_single_device("llama", {"parallel.cp=2", "parallel.cp_kind=all-to-all"}, 2);
}
TEST(ContextParallel, GptCp2Tp2AllToAllPp2) {
  expect_equal_to_single_device(
      "gpt", {"parallel.cp=2", "parallel.tp=2", "parallel.cp_kind=all-to-all", "parallel.pp=2"}, 8);
}

TEST(ContextParallelOracle, LlamaCp2Tp2Pp2) {
  testing_support::expect_ops_correct(
      config("llama", {"parallel.cp=2", "parallel.tp=2", "parallel.pp=2"}));
}
TEST(ContextParallelOracle, GptCp4) {
  testing_support::expect_ops_correct(config("gpt", {"parallel.cp=4"}));
}

TEST(ContextParallel, ConfigsItCannotServeNameTheKey) {
  auto error_of = [&](const std::string& model, const std::vector<std::string>& o) {
    Config c = config(model, o);
    Status s = testing_support::check_split(c);
    return s.ok() ? std::string() : s.error().message;
  };
  EXPECT_NE(error_of("llama", {"parallel.cp=3"}).find("parallel.cp"), std::string::npos);
  EXPECT_NE(error_of("llama", {"parallel.cp=3"}).find("seq (32) is not divisible by 3"),
            std::string::npos);
  EXPECT_NE(error_of("llama", {"parallel.cp=2", "parallel.tp=4"}).find("kv_heads (2)"),
            std::string::npos);
  EXPECT_NE(error_of("swin", {"parallel.cp=2"}).find("model.type 'swin' has none to split"),
            std::string::npos);
  EXPECT_NE(error_of("llama", {"parallel.cp=4", "parallel.cp_kind=all-to-all"})
                .find("kv_heads (2) is not divisible by 4"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
