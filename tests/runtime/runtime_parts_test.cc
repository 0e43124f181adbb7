// Parameter init, data sources, the LR schedule, SGD and AdamW, each against closed forms or a
// per-element double-precision reference.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "comm/local_comm.h"
#include "data/sources.h"
#include "runtime/init.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer.h"
#include "runtime/rank_agreement.h"

namespace loom::runtime {
namespace {

using data::make_token_source;

graph::FullTensor param(const std::string& name, Shape shape) {
  graph::FullTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.role = graph::TensorRole::kParameter;
  t.init = graph::ParamInit::normal(0.02);
  return t;
}

TEST(Init, PiecesAreSlicesOfTheSameFullValues) {
  graph::FullTensor w = param("w", {8, 6});
  at::Tensor full = init_full_parameter(w, 3);
  EXPECT_NEAR(full.std().item<double>(), 0.02, 0.01);
  graph::SubTensor piece = graph::SubTensor::full(w);
  piece.ranges[0] = {4, 8};
  piece.ranges[1] = {2, 5};
  at::Tensor p = init_parameter_piece(w, piece, 3);
  EXPECT_TRUE(p.equal(full.slice(0, 4, 8).slice(1, 2, 5)));
  piece.value_chunk = 1;
  piece.value_chunks = 2;
  EXPECT_EQ(init_parameter_piece(w, piece, 3).abs().sum().item<double>(), 0.0);
  EXPECT_FALSE(init_full_parameter(param("v", {8, 6}), 3).equal(full));
  EXPECT_FALSE(init_full_parameter(w, 4).equal(full));
}

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("", "t.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

TEST(Data, SyntheticIsDeterministicPerSample) {
  auto a = make_token_source(config({"run.seed=5"}), 100, 8);
  auto b = make_token_source(config({"run.seed=5"}), 100, 8);
  std::vector<int64_t> x(9), y(9), z(9);
  ASSERT_TRUE((*a)->sample(17, x.data()).ok());
  ASSERT_TRUE((*b)->sample(17, y.data()).ok());
  ASSERT_TRUE((*a)->sample(18, z.data()).ok());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  for (int64_t t : x) EXPECT_LT(t, 100);
}

std::string write_tokens(const std::string& name, const std::vector<uint16_t>& ids,
                         bool odd = false) {
  std::string path = testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * 2));
  if (odd) out.put('x');
  return path;
}

TEST(Data, TokenFileWindows) {
  std::vector<uint16_t> ids(50);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i);
  std::string path = write_tokens("ok.bin", ids);
  auto src = make_token_source(config({"data.type=tokens", "data.path=" + path}), 64, 8);
  ASSERT_TRUE(src.ok()) << src.error().message;
  std::vector<int64_t> x(9);
  ASSERT_TRUE((*src)->sample(1, x.data()).ok());
  EXPECT_EQ(x[0], 8);
  EXPECT_EQ(x[8], 16);
}

// Llama 3's vocabulary (128256) needs uint32 ids: data.token_bytes 4 reads them whole.
TEST(Data, TokenFileOfUint32Ids) {
  std::vector<uint32_t> ids(20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(128000 + i);
  const std::string path = testing::TempDir() + "wide.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * 4));
  auto src = make_token_source(
      config({"data.type=tokens", "data.path=" + path, "data.token_bytes=4"}), 128256, 4);
  ASSERT_TRUE(src.ok()) << src.error().message;
  std::vector<int64_t> x(5);
  ASSERT_TRUE((*src)->sample(1, x.data()).ok());
  EXPECT_EQ(x[0], 128004);
  EXPECT_EQ(x[4], 128008);
  // Read as uint16 the same bytes are other ids (here the high halves, 1, outside no vocabulary).
  auto narrow = make_token_source(config({"data.type=tokens", "data.path=" + path}), 128256, 4);
  ASSERT_TRUE(narrow.ok());
  ASSERT_TRUE((*narrow)->sample(0, x.data()).ok());
  EXPECT_EQ(x[1], 1);
  auto bad = parse_config("data: {type: tokens, path: x.bin, token_bytes: 3}\n", "d.yaml", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("data.token_bytes"), std::string::npos) << bad.error().message;
}

// An id outside the vocabulary anywhere in the file is found before step 1, naming its
// position; a directory as data.path is named as one.
TEST(Data, TokenFileIsCheckedWholeBeforeTraining) {
  std::vector<uint16_t> ids(50, 3);
  ids[40] = 99;
  auto src = make_token_source(
      config({"data.type=tokens", "data.path=" + write_tokens("oov.bin", ids)}), 64, 8);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.error().message.find("token 99 at position 40 is outside the model's vocabulary"),
            std::string::npos)
      << src.error().message;
  auto dir =
      make_token_source(config({"data.type=tokens", "data.path=" + testing::TempDir()}), 64, 8);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().message.find("is a directory"), std::string::npos) << dir.error().message;
}

TEST(Data, TokenFileErrorsNameTheFile) {
  auto missing =
      make_token_source(config({"data.type=tokens", "data.path=/nonexistent/t.bin"}), 64, 8);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("data.path: cannot read token file '/nonexistent/t.bin'"),
            std::string::npos)
      << missing.error().message;
  std::string odd = write_tokens("odd.bin", {1, 2, 3}, true);
  auto o = make_token_source(config({"data.type=tokens", "data.path=" + odd}), 64, 2);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.error().message.find("7 bytes, not a whole number of uint16 ids"), std::string::npos)
      << o.error().message;
  std::string shortf = write_tokens("short.bin", {1, 2, 3});
  auto s = make_token_source(config({"data.type=tokens", "data.path=" + shortf}), 64, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("holds 3 tokens"), std::string::npos);
  std::string big = write_tokens("big.bin", {1, 2, 300, 4, 5});
  auto b = make_token_source(config({"data.type=tokens", "data.path=" + big}), 64, 4);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("token 300 at position 2"), std::string::npos)
      << b.error().message;
}

TEST(LrSchedule, WarmupThenDecay) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.schedule = "linear";
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(o, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 9, 14), 0.55);
  EXPECT_DOUBLE_EQ(lr_at(o, 14, 14), 0.1);
  o.schedule = "cosine";
  EXPECT_NEAR(lr_at(o, 9, 14), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(o, 4, 14), 1.0, 1e-12);
  o.schedule = "constant";
  EXPECT_DOUBLE_EQ(lr_at(o, 12, 14), 1.0);
}

TEST(Optimizer, SgdWithMomentumAndDecay) {
  OptimizerConfig o;
  o.momentum = 0.5;
  o.weight_decay = 0.1;
  at::Tensor p = at::ones({2});
  p.set_requires_grad(true);
  Optimizer opt(OptimizerKind::kSgd, o, {p}, {true});
  p.mutable_grad() = at::full({2}, 2.0);
  opt.step(0.1);  // g = 2 + 0.1 = 2.1; p = 1 - 0.21
  EXPECT_NEAR(p[0].item<double>(), 0.79, 1e-6);
  p.mutable_grad() = at::full({2}, 2.0);
  opt.step(0.1);  // g = 2 + 0.079 = 2.079; buf = 1.05 + 2.079 = 3.129; p = 0.79 - 0.3129
  EXPECT_NEAR(p[0].item<double>(), 0.4771, 1e-6);
}

// AdamW over several tensors at once (decaying and not, one without a gradient) against the
// update written out per element in double precision. float32 arithmetic of a few ops per
// element: 1e-6 relative is ~10 ulps; a wrong bias correction or decay is off by > 1e-3.
TEST(Optimizer, AdamwMatchesThePerElementUpdate) {
  OptimizerConfig o;
  o.betas = {0.9, 0.95};
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  std::vector<at::Tensor> params = {at::randn({3, 4}), at::randn({4}), at::randn({2, 2})};
  const std::vector<bool> decay = {true, false, true};
  std::vector<std::vector<double>> p(3), m(3), v(3);
  for (int i = 0; i < 3; ++i)
    for (int64_t k = 0; k < params[i].numel(); ++k) {
      p[i].push_back(params[i].flatten()[k].item<double>());
      m[i].push_back(0);
      v[i].push_back(0);
    }
  Optimizer opt(OptimizerKind::kAdamw, o, params, decay);
  const double lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    for (int i = 0; i < 2; ++i) params[i].mutable_grad() = at::randn(params[i].sizes());
    params[2].mutable_grad() = at::Tensor();  // no gradient: left untouched
    for (int i = 0; i < 2; ++i)
      for (size_t k = 0; k < p[i].size(); ++k) {
        const double g = params[i].grad().flatten()[k].item<double>();
        if (decay[i]) p[i][k] *= 1 - lr * o.weight_decay;
        m[i][k] = 0.9 * m[i][k] + 0.1 * g;
        v[i][k] = 0.95 * v[i][k] + 0.05 * g * g;
        const double mhat = m[i][k] / (1 - std::pow(0.9, t));
        const double denom = std::sqrt(v[i][k]) / std::sqrt(1 - std::pow(0.95, t)) + o.eps;
        p[i][k] -= lr * mhat / denom;
      }
    opt.step(lr);
  }
  for (int i = 0; i < 3; ++i)
    for (size_t k = 0; k < p[i].size(); ++k)
      EXPECT_NEAR(params[i].flatten()[k].item<double>(), p[i][k], 1e-6 * (1 + std::abs(p[i][k])))
          << "tensor " << i << " element " << k;
  EXPECT_EQ(opt.steps_taken(), 3);
}

TEST(Optimizer, ClippingUsesTheGlobalNorm) {
  at::Tensor a = at::zeros({1}), b = at::zeros({1});
  a.mutable_grad() = at::full({1}, 3.0);
  b.mutable_grad() = at::full({1}, 4.0);
  double norm = std::sqrt(grad_norm_squared({a, b}));
  EXPECT_NEAR(norm, 5.0, 1e-9);
  clip_gradients({a, b}, norm, 1.0);
  EXPECT_NEAR(a.grad().item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), 0.8, 1e-6);
}

// Three ranks, rank 2 different from rank 0 in one fact: every rank stops with the same message
// naming what differs (the build before the config before the plan), both values and the rank.
TEST(RankAgreement, EveryRankNamesWhatDiffersFromRankZero) {
  const RankFacts zero{"run:\n  seed: 1\nmodel:\n  args:\n    layers: 2\n", "plan-a", "loom 1"};
  struct Case {
    RankFacts other;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {zero, ""},
      {{"run:\n  seed: 1\nmodel:\n  args:\n    layers: 3\n", "plan-b", "loom 1"},
       "rank 2 was started with another config than rank 0: model.args.layers is 2 on rank 0 and "
       "3 on rank 2; start every rank with the same config file and overrides (rank 2 of 3 "
       "differs from rank 0)"},
      {{zero.config_yaml, "plan-b", "loom 1"}, "rank 2 made another plan than rank 0"},
      {{zero.config_yaml, "plan-b", "loom 2"},
       "rank 2 runs another build of loom than rank 0: loom 2 on rank 2, loom 1 on rank 0"},
  };
  for (const Case& c : cases) {
    comm::LocalWorld world(3, 10);
    const auto results = world.run([&](comm::Comm& comm) {
      return check_ranks_agree(comm, RunDevice{}, comm.rank().value() == 2 ? c.other : zero);
    });
    for (const Status& s : results) {
      if (c.expect.empty()) {
        EXPECT_TRUE(s.ok()) << s.error().message;
      } else {
        ASSERT_FALSE(s.ok()) << c.expect;
        EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
      }
    }
  }
  const auto flat = flatten_config_yaml("a:\n  b: 1\n  c:\n    - x\n    - y\n  d:\n    []\ne: 2\n");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"a.b", "1"}, {"a.c", "- x - y"}, {"a.d", "[]"}, {"e", "2"}};
  EXPECT_EQ(flat, expected);
}

}  // namespace
}  // namespace loom::runtime
