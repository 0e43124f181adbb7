// Model inputs: language models read the token source, other inputs are seeded per sample.
#include "runtime/inputs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "graph/builder.h"

namespace loom::runtime {
namespace {

Config config(const std::vector<std::string>& overrides) {
  auto c = parse_config("", "t.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

// A graph with a float input `images` [rows, 2, 3] and an integer input `labels` [rows].
graph::Graph image_graph(const graph::OpRegistry& ops, int64_t rows, int64_t bound) {
  graph::GraphBuilder b(ops, "img");
  TensorId x = b.input("images", {rows, 2, 3}, DType::kFloat32);
  TensorId y = b.input("labels", {rows}, DType::kInt64, bound);
  TensorId w = b.parameter("w", {4, 3}, graph::ParamInit::normal(0.1));
  TensorId h = b.op1("linear", "fc", {x, w});
  TensorId logits = b.op1("group_logsumexp", "g", {h}, graph::Attrs{{"v", int64_t{4}}});
  TensorId lse = b.op1("logsumexp", "lse", {logits});
  (void)y;
  TensorId loss = b.op1("nll", "loss", {lse, lse}, graph::Attrs{{"normalizer", rows}});
  b.set_loss(loss);
  auto g = b.finish();
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::move(g).value();
}

TEST(Inputs, SyntheticSamplesDependOnlyOnSeedNameAndIndex) {
  auto ops = graph::OpRegistry::with_builtin_ops();
  graph::Graph four = image_graph(ops, 4, 10);
  graph::Graph two = image_graph(ops, 2, 10);
  auto whole = InputFeeder::create(config({"run.seed=7"}), four);
  auto halves = InputFeeder::create(config({"run.seed=7"}), two);
  auto other_seed = InputFeeder::create(config({"run.seed=8"}), four);
  ASSERT_TRUE(whole.ok() && halves.ok() && other_seed.ok());
  EXPECT_EQ((*whole)->rows(), 4);
  auto a = (*whole)->micro_batch(4);
  auto b0 = (*halves)->micro_batch(4);
  auto b1 = (*halves)->micro_batch(6);
  auto c = (*other_seed)->micro_batch(4);
  ASSERT_TRUE(a.ok() && b0.ok() && b1.ok() && c.ok());
  const int64_t img = four.find_tensor("images")->value(),
                lab = four.find_tensor("labels")->value();
  ASSERT_EQ(a->at(img).sizes(), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(a->at(img).scalar_type(), at::kFloat);
  EXPECT_EQ(a->at(lab).scalar_type(), at::kLong);
  // Micro-batches of two see the same samples as one of four.
  EXPECT_TRUE(a->at(img).equal(at::cat({b0->at(img), b1->at(img)})));
  EXPECT_TRUE(a->at(lab).equal(at::cat({b0->at(lab), b1->at(lab)})));
  EXPECT_FALSE(a->at(img).equal(c->at(img)));
  // Samples differ from each other; labels stay in [0, bound); images look like N(0, 1).
  EXPECT_FALSE(a->at(img)[0].equal(a->at(img)[1]));
  EXPECT_GE(a->at(lab).min().item<int64_t>(), 0);
  EXPECT_LT(a->at(lab).max().item<int64_t>(), 10);
  auto big = (*whole)->micro_batch(100);
  ASSERT_TRUE(big.ok());
  EXPECT_LT(std::abs(at::cat({a->at(img), big->at(img)}).mean().item<double>()), 0.6);
}

TEST(Inputs, IntegerInputWithoutBoundIsAnErrorNamingIt) {
  auto ops = graph::OpRegistry::with_builtin_ops();
  auto f = InputFeeder::create(config({}), image_graph(ops, 2, 0));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("'labels'"), std::string::npos) << f.error().message;
}

}  // namespace
}  // namespace loom::runtime
