// plan.json: a lowered plan survives the trip through Protobuf JSON unchanged, its hash follows
// exactly the keys a plan is made from, and damaged or stale files are refused by name.
#include "lower/plan_file.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/plan.pb.h"
#include "graph/dump.h"
#include "lower/recompute.h"
#include "lower/schedule_order.h"
#include "models/model.h"
#include "plan/plan.h"
#include "tests/support/plan_chain.h"

namespace loom::lower {
namespace {

const char* kYaml = "model: {type: gpt, preset: tiny}\nbatch: {global: 8, micro: 2}\n";

Config config_with(const std::vector<std::string>& overrides) {
  auto c = parse_config(kYaml, "p.yaml", overrides);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return *c;
}

std::string fingerprint() {
  return code_fingerprint(graph::OpRegistry::with_builtin_ops().types(),
                          planner::PolicyRegistry::with_builtin_policies().names());
}

std::string digest(const Config& c) {
  auto model = testing_support::single_device_graph(c);
  EXPECT_TRUE(model.ok());
  return model_digest(*model);
}

PlanFile make(const std::vector<std::string>& overrides) {
  Config c = config_with(overrides);
  const int64_t world = c.parallel.world_size();
  auto g = loom::plan::planned_graph(c, loom::plan::Registries{}, world);
  EXPECT_TRUE(g.ok()) << g.error().message;
  auto order = testing_support::pipeline_order_of(c, c.micro_batches());
  EXPECT_TRUE(order.ok());
  PathFinder paths;
  auto l =
      lower(*g, world, c.micro_batches(), paths, order->ranks.empty() ? nullptr : &order->ranks);
  EXPECT_TRUE(l.ok()) << l.error().message;
  auto recompute = parse_recompute(c.parallel.recompute);
  EXPECT_TRUE(recompute.ok());
  mark_recompute(*g, *l, *recompute);
  PlanFile p;
  p.code_fingerprint = fingerprint();
  p.model_digest = digest(c);
  p.hash = testing_support::plan_hash_of(c, p.model_digest, p.code_fingerprint);
  p.config_yaml = to_yaml(c);
  p.world_size = world;
  p.micro_batches = c.micro_batches();
  p.graph = *g;
  p.lowered = *l;
  p.schedule_csv = "0F0,1F0\n";
  return p;
}

class RoundTrip : public testing::TestWithParam<std::vector<std::string>> {};

TEST_P(RoundTrip, JsonReadsBackToTheSamePlan) {
  PlanFile plan = make(GetParam());
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.ok()) << json.error().message;
  auto back = plan_from_json(*json, "plan.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->hash, plan.hash);
  EXPECT_EQ(back->config_yaml, plan.config_yaml);
  EXPECT_EQ(back->schedule_csv, plan.schedule_csv);
  EXPECT_EQ(graph::dump(back->graph), graph::dump(plan.graph));
  ASSERT_EQ(back->lowered.programs.size(), plan.lowered.programs.size());
  for (int64_t r = 0; r < plan.world_size; ++r)
    EXPECT_EQ(listing(back->graph, back->lowered, Rank(r)),
              listing(plan.graph, plan.lowered, Rank(r)))
        << r;
  for (size_t i = 0; i < plan.lowered.adapters.size(); ++i) {
    const Adapter &a = plan.lowered.adapters[i], &b = back->lowered.adapters[i];
    EXPECT_EQ(a.forward.to_string(), b.forward.to_string());
    EXPECT_EQ(a.backward.to_string(), b.backward.to_string());
    EXPECT_EQ(a.from, b.from);
    EXPECT_EQ(a.to, b.to);
    EXPECT_EQ(a.consumers, b.consumers);
    EXPECT_EQ(a.disjoint, b.disjoint);
  }
  for (size_t i = 0; i < plan.lowered.grad_syncs.size(); ++i) {
    EXPECT_EQ(back->lowered.grad_syncs[i].piece, plan.lowered.grad_syncs[i].piece);
    EXPECT_EQ(back->lowered.grad_syncs[i].devices, plan.lowered.grad_syncs[i].devices);
  }
  for (int64_t r = 0; r < plan.world_size; ++r)
    for (size_t s = 0; s < plan.lowered.programs[r].segments.size(); ++s)
      EXPECT_EQ(back->lowered.programs[r].segments[s].recompute,
                plan.lowered.programs[r].segments[s].recompute);
  int64_t weight_products = 0;  // the linears: a round trip of true values, not only false ones
  for (size_t i = 0; i < plan.graph.ops().size(); ++i) {
    EXPECT_EQ(back->graph.ops()[i].def->attention_core, plan.graph.ops()[i].def->attention_core);
    EXPECT_EQ(back->graph.ops()[i].def->weight_product, plan.graph.ops()[i].def->weight_product);
    weight_products += back->graph.ops()[i].def->weight_product;
    EXPECT_EQ(back->graph.ops()[i].attrs(), plan.graph.ops()[i].attrs());
    EXPECT_EQ(back->graph.ops()[i].annotation(), plan.graph.ops()[i].annotation());
  }
  EXPECT_GT(weight_products, 0);
  EXPECT_TRUE(check_deadlock_free(back->graph, back->lowered).ok());
  // Printing what was read gives the same text, byte for byte.
  auto again = plan_to_json(*back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *json);
}

// What Protobuf's printer makes of `json` (sealed) read back into core/plan.proto's message,
// sealed the same way.
std::string printed_by_protobuf(const std::string& json) {
  const size_t body = json.find(",\"format\"");
  EXPECT_NE(body, std::string::npos);
  planpb::Plan message;
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage("{" + json.substr(body + 1), &message).ok());
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.preserve_proto_field_names = true;
  std::string printed;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(message, &printed, options).ok());
  return seal_plan_json(printed);
}

// Where two texts first differ, with some text around it (a plan's JSON is too long to print).
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = std::string_view("{\"seal\":\"0123456789abcdef\",").size();  // past the seals
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i > 80 ? i - 80 : 0;
  return "at byte " + std::to_string(i) + ":\n  " + a.substr(from, 200) + "\n  " +
         b.substr(from, 200);
}

// plan.json is written directly, not through Protobuf: its bytes are the printer's all the same
// (field order, fields at zero left out, int64 quoted, enums by name, doubles, escapes).
TEST_P(RoundTrip, JsonIsProtobufsPrinterText) {
  PlanFile plan = make(GetParam());
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.ok()) << json.error().message;
  const std::string printed = printed_by_protobuf(*json);
  EXPECT_TRUE(printed == *json) << first_difference(printed, *json);
}

TEST(PlanJson, StringsAndDoublesAreWrittenAsProtobufPrintsThem) {
  PlanFile plan = make({"parallel.tp=2"});
  plan.source = "p/plan.json";
  std::string every_byte;
  for (int c = 1; c < 128; ++c) every_byte += static_cast<char>(c);
  plan.config_yaml = every_byte + " <b> \"q\" \\ caf\xc3\xa9 \xe2\x80\xa8 end";
  plan.schedule_csv = "0F0,\t<>\n";
  const double odd[] = {0.1,
                        1.0 / 3,
                        2.5e-300,
                        1e21,
                        123456789012.0,
                        5e-324,
                        std::numeric_limits<double>::infinity(),
                        std::nan("")};
  size_t i = 0;
  for (Adapter& a : plan.lowered.adapters) {
    a.forward.cost_s = odd[i++ % std::size(odd)];
    for (CommStep& st : a.backward.steps) st.cost_s = odd[i++ % std::size(odd)];
  }
  for (Program& p : plan.lowered.programs) p.loss_seed = odd[i++ % std::size(odd)];
  auto json = plan_to_json(plan);
  ASSERT_TRUE(json.ok()) << json.error().message;
  const std::string printed = printed_by_protobuf(*json);
  EXPECT_TRUE(printed == *json) << first_difference(printed, *json);
}

INSTANTIATE_TEST_SUITE_P(
    GptTiny, RoundTrip,
    testing::Values(std::vector<std::string>{},
                    std::vector<std::string>{"parallel.tp=2", "parallel.pp=2"},
                    std::vector<std::string>{"parallel.dp=2", "parallel.tp=2", "parallel.sp=true"},
                    std::vector<std::string>{"model.args.layers=4", "parallel.pp=2",
                                             "parallel.chunks=2", "parallel.schedule=interleaved"},
                    std::vector<std::string>{"parallel.tp=2", "parallel.recompute=full"},
                    std::vector<std::string>{"parallel.pp=2", "parallel.recompute=selective"},
                    std::vector<std::string>{"parallel.pp=2", "parallel.schedule=zb-h1"}));

TEST(PlanHash, FollowsThePlanKeysOnly) {
  const std::string base = testing_support::plan_hash_of(config_with({"parallel.tp=2"}), "m", "c");
  EXPECT_EQ(base, testing_support::plan_hash_of(config_with({"parallel.tp=2"}), "m", "c"));
  EXPECT_EQ(base.size(), 16u);
  // The optimizer, run and logging keys do not change a plan.
  EXPECT_EQ(base, testing_support::plan_hash_of(
                      config_with({"parallel.tp=2", "optimizer.lr=0.5", "run.steps=3"}), "m", "c"));
  EXPECT_NE(base, testing_support::plan_hash_of(config_with({"parallel.tp=2", "parallel.sp=true"}),
                                                "m", "c"));
  EXPECT_NE(base, testing_support::plan_hash_of(config_with({"parallel.tp=2", "batch.micro=4"}),
                                                "m", "c"));
  EXPECT_NE(base,
            testing_support::plan_hash_of(config_with({"parallel.tp=2"}), "other model", "c"));
  EXPECT_NE(base, testing_support::plan_hash_of(config_with({"parallel.tp=2"}), "m", "other code"));
}

TEST(PlanHash, AStalePlanNamesWhatDiffers) {
  PlanFile plan = make({"parallel.tp=2"});
  plan.source = "p/plan.json";
  Config same = config_with({"parallel.tp=2", "optimizer.lr=0.1"});
  EXPECT_TRUE(loom::plan::check_plan_current(plan, same, digest(same), fingerprint()).ok());

  Config changed = config_with({"parallel.tp=2", "parallel.sp=true"});
  Status s = loom::plan::check_plan_current(plan, changed, digest(changed), fingerprint());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(
                "p/plan.json: stale plan: parallel.sp was false in the plan, is true now"),
            std::string::npos)
      << s.error().message;

  s = loom::plan::check_plan_current(plan, same, digest(same), "loom 9.9");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("made by another loom build"), std::string::npos)
      << s.error().message;

  plan.hash = "0000000000000000";
  s = loom::plan::check_plan_current(plan, same, digest(same), fingerprint());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("does not match"), std::string::npos) << s.error().message;
}

void expect_refused(const std::string& json, const std::string& expect) {
  auto r = plan_from_json(json, "x/plan.json");
  ASSERT_FALSE(r.ok()) << "accepted: " << expect;
  EXPECT_NE(r.error().message.find("x/plan.json"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(expect), std::string::npos) << r.error().message;
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(PlanJson, DamagedFilesAreRefusedByName) {
  auto json = plan_to_json(make({"parallel.tp=2", "parallel.pp=2"}));
  ASSERT_TRUE(json.ok());
  expect_refused(json->substr(0, json->size() / 2), "not a loom plan");
  expect_refused("[1, 2]", "not a loom plan");
  // Damage behind an intact seal (a file sealed again after editing) is still refused.
  expect_refused(
      seal_plan_json(replace_once(*json, "\"format\":\"loom-plan\"", "\"format\":\"other\"")),
      "format");
  expect_refused(
      seal_plan_json(replace_once(*json, "\"format_version\":1", "\"format_version\":99")),
      "plan format version 99");
  expect_refused(seal_plan_json(replace_once(*json, "\"device\":\"1\"", "\"device\":\"7\"")),
                 "device: 7 is out of range [0, 4)");
  expect_refused(seal_plan_json(replace_once(*json, "\"def\":\"1\"", "\"def\":\"100000\"")),
                 ".def: 100000 is out of range");
  expect_refused(seal_plan_json(replace_once(*json, "\"format\"", "\"surprise\": 1, \"format\"")),
                 "not a loom plan");
  expect_refused(
      seal_plan_json(replace_once(*json, "\"world_size\":\"4\"", "\"world_size\":\"3\"")),
      "is out of range [0, 3)");
  // Indices the executor uses to reach its per-micro-batch and per-stage tables.
  expect_refused(
      seal_plan_json(replace_once(*json, "{\"micro_batch\":\"1\"}", "{\"micro_batch\":\"9\"}")),
      "blocks.micro_batch: 9 is out of range [0, 4)");
  expect_refused(seal_plan_json(replace_once(*json, "\"blocks\":[{\"stage\":\"1\"}",
                                             "\"blocks\":[{\"stage\":\"0\"}")),
                 "stage 0 has no segment on rank 2");
  expect_refused(seal_plan_json(replace_once(*json, "\"segments\":[{\"stage\":\"1\"",
                                             "\"segments\":[{\"stage\":\"5\"")),
                 "segments.stage: 5 is out of range [0, 2)");
}

// plan.json is sealed: any edit after `loom plan` wrote it is refused before a field is used.
TEST(PlanJson, EditedOrUnsealedFilesAreRefused) {
  auto json = plan_to_json(make({"parallel.tp=2", "parallel.pp=2"}));
  ASSERT_TRUE(json.ok());
  ASSERT_EQ(json->rfind("{\"seal\":\"", 0), 0u) << json->substr(0, 40);
  EXPECT_TRUE(plan_from_json(*json + "\n", "x/plan.json").ok());  // a final newline is no edit
  EXPECT_EQ(seal_plan_json(*json), *json);
  const std::string edited = "plan was edited after `loom plan` wrote it";
  const size_t shape = json->find("\"shape\":[\"");
  ASSERT_NE(shape, std::string::npos);
  std::string wider = *json;
  wider[shape + 10] = wider[shape + 10] == '9' ? '8' : '9';
  expect_refused(wider, edited);
  // The refusal never prints the seal that would make the edit pass.
  const std::string resealed = seal_plan_json(wider).substr(9, 16);
  auto refused = plan_from_json(wider, "x/plan.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message.find(resealed), std::string::npos) << refused.error().message;
  const size_t yaml = json->find("\"config_yaml\":\"");
  ASSERT_NE(yaml, std::string::npos);
  std::string config = *json;
  config[yaml + 15] = config[yaml + 15] == 'x' ? 'y' : 'x';
  expect_refused(config, edited);
  expect_refused(replace_once(*json, "\"world_size\":\"4\"", "\"world_size\":\"2\""), edited);
  std::string unsealed = "{" + json->substr(json->find(",\"format\"") + 1);
  expect_refused(unsealed, "plan has no seal");
  EXPECT_EQ(seal_plan_json(unsealed), *json);
  std::string reseal = *json;  // the seal itself edited
  reseal[9] = reseal[9] == '0' ? '1' : '0';
  expect_refused(reseal, edited);
}

}  // namespace
}  // namespace loom::lower
