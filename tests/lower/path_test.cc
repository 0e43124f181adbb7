// Communication paths, checked symbolically: the tensor is cut into atoms (grid cells x value
// units); every step moves atoms exactly as its primitive does, and each device must end up with
// exactly the atoms of its target piece. Random layouts over 1-8 devices, random shapes.
#include "lower/path.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <set>

#include "tests/lower/random_layout.h"

namespace loom::lower {
namespace {

using Atom = std::vector<int64_t>;  // cell index per dim, then value unit
using Atoms = std::set<Atom>;

// Value units per element: a multiple of every value chunk count of the case (each divides the
// device count of its group).
int64_t kUnits = 1;

// Every (cell, value unit) a piece holds; chunk c of n holds units [c, c+1) * kUnits / n.
Atoms fine(const graph::SubTensor& s) {
  Atoms out;
  const int64_t per = kUnits / s.value_chunks;
  std::vector<int64_t> i(s.ranges.size());
  for (size_t d = 0; d < i.size(); ++d) i[d] = s.ranges[d].start;
  while (true) {
    for (int64_t u = s.value_chunk * per; u < (s.value_chunk + 1) * per; ++u) {
      Atom a = i;
      a.push_back(u);
      out.insert(a);
    }
    size_t d = 0;
    for (; d < i.size(); ++d) {
      if (++i[d] < s.ranges[d].end) break;
      i[d] = s.ranges[d].start;
    }
    if (d == i.size()) break;
  }
  return out;
}

std::map<DeviceId, Atoms> state_of(const Layout& l, const Shape& shape) {
  std::map<DeviceId, Atoms> st;
  for (int64_t p = 0; p < l.size(); ++p) st[l.devices[p]] = fine(l.piece(p, TensorId(0), shape));
  return st;
}

// Runs the path on atoms; fails the test on any step that needs atoms it does not have or
// would add a value twice.
void simulate(const CommPath& path, const Layout& from, const Layout& to, const Shape& shape) {
  std::map<DeviceId, Atoms> st = state_of(from, shape);
  for (const CommStep& step : path.steps) {
    std::map<DeviceId, Atoms> want = state_of(step.after, shape);
    std::map<DeviceId, Atoms> next;
    auto need = [&](DeviceId dev, const Atoms& available) {
      for (const Atom& a : want[dev]) {
        ASSERT_TRUE(available.count(a)) << to_string(step.primitive) << " leaves device " << dev
                                        << " short of a piece; path " << path.to_string();
      }
      next[dev] = want[dev];
    };
    switch (step.primitive) {
      case Primitive::kChunk:
      case Primitive::kValueChunk:
      case Primitive::kPad:
        for (auto& [dev, atoms] : st) need(dev, atoms);
        break;
      case Primitive::kSendRecv: {
        std::map<DeviceId, Atoms> received;
        for (const auto& pair : step.groups) {
          const Atoms& src = st.count(pair[0]) ? st[pair[0]] : next[pair[0]];
          received[pair[1]].insert(src.begin(), src.end());
        }
        for (auto& [dev, atoms] : want) {
          Atoms have = received[dev];
          if (st.count(dev)) have.insert(st[dev].begin(), st[dev].end());
          need(dev, have);
        }
        break;
      }
      default: {
        std::set<DeviceId> covered;
        for (const auto& group : step.groups) {
          Atoms all;
          size_t total = 0;
          for (DeviceId m : group) {
            all.insert(st[m].begin(), st[m].end());
            total += st[m].size();
          }
          if (step.primitive == Primitive::kAllReduce ||
              step.primitive == Primitive::kReduceScatter) {
            ASSERT_EQ(all.size(), total)
                << "a value would be added twice in " << to_string(step.primitive);
          }
          for (DeviceId m : group) {
            need(m, all);
            covered.insert(m);
          }
        }
        ASSERT_EQ(covered.size(), st.size()) << to_string(step.primitive) << " leaves devices out";
      }
    }
    st = next;
  }
  std::map<DeviceId, Atoms> target = state_of(to, shape);
  ASSERT_EQ(st.size(), target.size());
  for (auto& [dev, atoms] : target) {
    EXPECT_EQ(st[dev], atoms) << "device " << dev << " via " << path.to_string();
  }
}

std::vector<DeviceId> range(int from, int count) {
  std::vector<DeviceId> out;
  for (int i = 0; i < count; ++i) out.push_back(DeviceId(from + i));
  return out;
}

TEST(Path, NamedCases) {
  PathFinder finder;
  Shape shape{4, 8};
  auto path =
      finder.find(shape, 4, Layout::partial(2, range(0, 2)), Layout::replicated(2, range(0, 2)));
  ASSERT_TRUE(path.ok());
  ASSERT_EQ(path->steps.size(), 1u);
  EXPECT_EQ(path->steps[0].primitive, Primitive::kAllReduce);
  path = finder.find(shape, 4, Layout::partial(2, range(0, 2)), Layout::split(2, 1, range(0, 2)));
  ASSERT_TRUE(path.ok());
  ASSERT_EQ(path->steps.size(), 1u);
  EXPECT_EQ(path->steps[0].primitive, Primitive::kReduceScatter);
  path =
      finder.find(shape, 4, Layout::split(2, 0, range(0, 4)), Layout::replicated(2, range(0, 4)));
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(path->steps[0].primitive, Primitive::kAllGather);
  path = finder.find(shape, 4, Layout::split(2, 0, range(0, 2)), Layout::split(2, 1, range(0, 2)));
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(path->steps[0].primitive, Primitive::kAllToAll);
  path =
      finder.find(shape, 4, Layout::replicated(2, range(0, 2)), Layout::split(2, 1, range(0, 2)));
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(path->steps[0].primitive, Primitive::kChunk);
  path =
      finder.find(shape, 4, Layout::replicated(2, range(0, 2)), Layout::replicated(2, range(2, 2)));
  ASSERT_TRUE(path.ok());
  ASSERT_EQ(path->steps.size(), 1u);
  EXPECT_EQ(path->steps[0].primitive, Primitive::kSendRecv);
  EXPECT_EQ(path->steps[0].groups.size(), 2u);  // replica i sends to consumer i
  size_t cached = finder.cache_size();
  ASSERT_TRUE(
      finder.find(shape, 4, Layout::replicated(2, range(0, 2)), Layout::replicated(2, range(2, 2)))
          .ok());
  EXPECT_EQ(finder.cache_size(), cached);
}

TEST(PrimitiveRules, OneEntryPerPrimitiveInOrder) {
  const std::vector<PrimitiveRule>& rules = primitive_rules();
  ASSERT_EQ(rules.size(), static_cast<size_t>(Primitive::kSendRecv) + 1);
  std::set<std::string> names;
  for (size_t i = 0; i < rules.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(rules[i].primitive), i);
    EXPECT_EQ(&rule_of(rules[i].primitive), &rules[i]);
    EXPECT_EQ(find_primitive(rules[i].name), &rules[i]);
    EXPECT_TRUE(names.insert(rules[i].name).second) << rules[i].name;
    EXPECT_TRUE(rules[i].applies && rules[i].cost && rules[i].bytes) << rules[i].name;
  }
  EXPECT_EQ(find_primitive("broadcast"), nullptr);
  // The cost model has an alpha and a beta of its own for each primitive that crosses a link
  // (cost.intra_<name>_alpha_s), under the entry's name.
  CostModel model;
  for (const PrimitiveRule& rule : rules)
    EXPECT_EQ(model.set_intra_link(rule.name, {1, 1}), rule.kind != PrimitiveKind::kLocal)
        << rule.name;
}

TEST(PrimitiveRules, BytesSentPerRank) {
  PathFinder finder;
  const Shape shape{4, 8};  // 128 bytes of float32
  auto ar =
      finder.find(shape, 4, Layout::partial(2, range(0, 4)), Layout::replicated(2, range(0, 4)));
  ASSERT_TRUE(ar.ok());
  EXPECT_DOUBLE_EQ(bytes_sent(ar->steps[0], 1, 128), 2 * 3.0 / 4 * 128);  // the ring's twice
  EXPECT_DOUBLE_EQ(bytes_sent(ar->steps[0], 7, 128), 0);                  // not a member
  auto ag =
      finder.find(shape, 4, Layout::split(2, 0, range(0, 4)), Layout::replicated(2, range(0, 4)));
  ASSERT_TRUE(ag.ok());
  EXPECT_DOUBLE_EQ(bytes_sent(ag->steps[0], 0, 32), 3 * 32);  // its piece to each other member
  auto chunk =
      finder.find(shape, 4, Layout::replicated(2, range(0, 2)), Layout::split(2, 1, range(0, 2)));
  ASSERT_TRUE(chunk.ok());
  EXPECT_DOUBLE_EQ(bytes_sent(chunk->steps[0], 0, 128), 0);  // local
  // Send/recv: replica i sends to consumer i; only senders count, once per message.
  auto send =
      finder.find(shape, 4, Layout::replicated(2, range(0, 2)), Layout::replicated(2, range(2, 2)));
  ASSERT_TRUE(send.ok());
  EXPECT_DOUBLE_EQ(bytes_sent(send->steps[0], 0, 128), 128);
  EXPECT_DOUBLE_EQ(bytes_sent(send->steps[0], 2, 128), 0);
}

TEST(Path, RandomLayoutsWithinAGroup) {
  std::mt19937 rng(7);
  PathFinder finder;
  const int64_t dims[] = {2, 4, 6, 8, 12};
  for (int iter = 0; iter < 250; ++iter) {
    Shape shape;
    size_t ndim = 1 + rng() % 3;
    for (size_t k = 0; k < ndim; ++k) shape.push_back(dims[rng() % 5]);
    int n = 1 + static_cast<int>(rng() % 8);
    Layout from = random_layout(rng, shape, range(0, n));
    Layout to = random_layout(rng, shape, range(0, n));
    auto path = finder.find(shape, 4, from, to);
    ASSERT_TRUE(path.ok()) << path.error().message;
    kUnits = n;
    simulate(*path, from, to, shape);
    if (HasFatalFailure()) FAIL() << from.to_string() << " -> " << to.to_string();
  }
}

TEST(Path, RandomLayoutsAcrossGroups) {
  std::mt19937 rng(11);
  PathFinder finder;
  const int64_t dims[] = {2, 4, 8, 12};
  for (int iter = 0; iter < 150; ++iter) {
    Shape shape;
    size_t ndim = 1 + rng() % 3;
    for (size_t k = 0; k < ndim; ++k) shape.push_back(dims[rng() % 4]);
    int n1 = 1 + static_cast<int>(rng() % 4), n2 = 1 + static_cast<int>(rng() % 4);
    Layout from = random_layout(rng, shape, range(0, n1));
    Layout to = random_layout(rng, shape, range(n1, n2));
    auto path = finder.find(shape, 4, from, to);
    ASSERT_TRUE(path.ok()) << path.error().message;
    kUnits = std::lcm(n1, n2);
    simulate(*path, from, to, shape);
    if (HasFatalFailure()) FAIL() << from.to_string() << " -> " << to.to_string();
  }
}

}  // namespace
}  // namespace loom::lower
