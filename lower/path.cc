#include "lower/path.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <queue>
#include <set>
#include <sstream>

#include "core/strings.h"

namespace loom::lower {

std::string CommPath::to_string() const {
  if (steps.empty()) return "(no communication)";
  std::vector<std::string> parts;
  for (const auto& s : steps)
    parts.push_back(lower::to_string(s.primitive) + " -> " + s.after.to_string());
  return join(parts, "; ");
}

const std::vector<PrimitiveRule>& primitive_rules() {
  // Collective libraries pick their algorithm by size (ring, recursive halving and doubling,
  // Bruck), so a collective costs log2(k) latencies and the bandwidth term of the ring: a single
  // collective is never dearer than the same exchange spelled as several smaller ones.
  auto latency = [](int64_t k) { return std::ceil(std::log2(static_cast<double>(k))); };
  // The ring's volume per member: (k - 1) / k of the piece, twice for an all-reduce (a
  // reduce-scatter then an all-gather); an all-gather sends its piece to each of k - 1 others.
  auto ring = [](int64_t k, double bytes) {
    const double n = static_cast<double>(k);
    return (n - 1) / n * bytes;
  };
  auto none = [](int64_t, double) { return 0.0; };
  using K = PrimitiveKind;
  static const std::vector<PrimitiveRule> kRules = [&] {
    std::vector<PrimitiveRule> rules = {
        {Primitive::kAllReduce, "all_reduce", K::kCollective, false, false,
         [](int f, int t) { return f == 1 && t == 0; },
         [=](int64_t k, double bytes, double alpha, double beta) {
           return 2 * latency(k) * alpha + 2 * ring(k, bytes) * beta;
         },
         [=](int64_t k, double bytes) { return 2 * ring(k, bytes); }},
        {Primitive::kAllGather, "all_gather", K::kCollective, false, false,
         [](int f, int t) { return f >= 2 && t == 0; },
         [=](int64_t k, double bytes, double alpha, double beta) {
           return latency(k) * alpha + static_cast<double>(k - 1) * bytes * beta;
         },
         [](int64_t k, double bytes) { return static_cast<double>(k - 1) * bytes; }},
        {Primitive::kReduceScatter, "reduce_scatter", K::kCollective, false, false,
         [](int f, int t) { return f == 1 && t >= 2; },
         [=](int64_t k, double bytes, double alpha, double beta) {
           return latency(k) * alpha + ring(k, bytes) * beta;
         },
         ring},
        {Primitive::kAllToAll, "all_to_all", K::kCollective, false, true,
         [](int f, int t) { return f >= 2 && t >= 2 && f != t; },
         [=](int64_t k, double bytes, double alpha, double beta) {
           return latency(k) * alpha + ring(k, bytes) * beta;
         },
         ring},
        // Local steps: a copy of the kept part; beta is the local copy rate here.
        {Primitive::kChunk, "chunk", K::kLocal, false, false,
         [](int f, int t) { return f == 0 && t >= 2; },
         [](int64_t k, double bytes, double, double beta) {
           return bytes / static_cast<double>(k) * beta;
         },
         none},
        {Primitive::kValueChunk, "value_chunk", K::kLocal, false, false,
         [](int f, int t) { return f == 0 && t == 1; },
         [](int64_t, double bytes, double, double beta) { return bytes * beta; }, none},
        {Primitive::kPad, "pad", K::kLocal, true, false,
         [](int f, int t) { return f >= 2 && t == 1; },
         [](int64_t k, double bytes, double, double beta) {
           return bytes * static_cast<double>(k) * beta;
         },
         none},
        // One message of the piece, whatever the group.
        {Primitive::kSendRecv, "send_recv", K::kTransfer, false, false,
         [](int, int) { return false; },
         [](int64_t, double bytes, double alpha, double beta) { return alpha + bytes * beta; },
         [](int64_t, double bytes) { return bytes; }},
    };
    for (size_t i = 0; i < rules.size(); ++i)
      LOOM_CHECK(static_cast<size_t>(rules[i].primitive) == i)
          << "primitive_rules(): " << rules[i].name << " out of the enumeration's order";
    return rules;
  }();
  return kRules;
}

const PrimitiveRule& rule_of(Primitive p) {
  const auto i = static_cast<size_t>(p);
  LOOM_CHECK(i < primitive_rules().size()) << "no registry entry for primitive " << i;
  return primitive_rules()[i];
}

std::string to_string(Primitive p) { return rule_of(p).name; }

const PrimitiveRule* find_primitive(const std::string& name) {
  for (const PrimitiveRule& rule : primitive_rules())
    if (rule.name == name) return &rule;
  return nullptr;
}

double bytes_sent(const CommStep& step, int64_t rank, double piece_bytes) {
  const PrimitiveRule& rule = rule_of(step.primitive);
  double bytes = 0;
  for (const std::vector<DeviceId>& g : step.groups) {
    if (rule.kind == PrimitiveKind::kTransfer) {  // pairs {from, to}
      if (g[0].value() == rank && g[1].value() != rank) bytes += rule.bytes(2, piece_bytes);
      continue;
    }
    for (DeviceId d : g)
      if (d.value() == rank) bytes += rule.bytes(static_cast<int64_t>(g.size()), piece_bytes);
  }
  return bytes;
}

Layout move_factor(const Layout& l, int from, int to, int64_t k,
                   std::vector<std::vector<DeviceId>>* groups) {
  std::vector<int64_t> f = l.factors();
  LOOM_CHECK(from != to && k > 1 && f[from] % k == 0)
      << "bad move of " << k << " from " << from << " to " << to;
  Layout out = l;
  std::vector<int64_t> nf = f;
  nf[from] /= k;
  nf[to] *= k;
  out.r = nf[0];
  out.v = nf[1];
  for (size_t i = 0; i < out.d.size(); ++i) out.d[i] = nf[i + 2];
  std::map<std::vector<int64_t>, std::vector<DeviceId>> by_group;
  for (int64_t p = 0; p < l.size(); ++p) {
    std::vector<int64_t> c = l.coords(p);
    const int64_t sub = c[from] % k;
    c[from] /= k;
    std::vector<int64_t> key = c;
    c[to] = c[to] * k + sub;
    out.devices[static_cast<size_t>(out.position_of(c))] = l.devices[static_cast<size_t>(p)];
    if (groups) {
      auto& members = by_group[key];
      members.resize(static_cast<size_t>(k));
      members[static_cast<size_t>(sub)] = l.devices[static_cast<size_t>(p)];
    }
  }
  if (groups)
    for (auto& [key, members] : by_group) groups->push_back(std::move(members));
  return out;
}

double PathFinder::message_seconds(DeviceId src, DeviceId dst, double bytes) const {
  const PrimitiveRule& rule = rule_of(Primitive::kSendRecv);
  const bool inter = src.value() / model_.devices_per_node != dst.value() / model_.devices_per_node;
  const CostModel::Link link = model_.link(rule.name, inter);
  return rule.cost(2, bytes, link.alpha_s, link.beta_s_per_byte);
}

namespace {

double piece_bytes(const Layout& l, const Shape& shape, int64_t elem_bytes) {
  double n = static_cast<double>(numel(shape) * elem_bytes);
  for (int64_t x : l.d) n /= static_cast<double>(x);
  return n;
}

bool fully_replicated(const Layout& l) { return l.r == l.size(); }

}  // namespace

Result<CommPath> PathFinder::find(const Shape& shape, int64_t elem_bytes, const Layout& from,
                                  const Layout& to, bool gradient) {
  gradient_ = gradient;
  LOOM_TRY(from.validate(&shape));
  LOOM_TRY(to.validate(&shape));
  std::string key = std::string(gradient ? "g" : "") + loom::to_string(shape) + "x" +
                    std::to_string(elem_bytes) + "|" + from.to_string() + "|" + to.to_string();
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  std::set<DeviceId> a(from.devices.begin(), from.devices.end()),
      b(to.devices.begin(), to.devices.end());
  Result<CommPath> path =
      a == b ? intra(shape, elem_bytes, from, to) : cross(shape, elem_bytes, from, to);
  if (!path.ok()) return path;
  if (path->via_full_replication)
    spdlog::warn("communication path {} -> {} for shape {} passes through full replication",
                 from.to_string(), to.to_string(), loom::to_string(shape));
  cache_.emplace(key, *path);
  return path;
}

namespace {

// The intra-group search's states are factor tuples (R, V, D...), each with the device order its
// cheapest path reaches; the target's order, when different, is reached by one send/recv step.
// Keeping one order per tuple bounds the search by the number of tuples (a few hundred for 64
// devices and 4-D). The goal is its own state (the target factors with the target order), keyed
// apart.
struct SearchNode {
  double cost;
  std::vector<int64_t> key;
  bool operator>(const SearchNode& o) const { return cost > o.cost; }
};
struct SearchState {
  double cost;
  Layout layout;
  std::vector<int64_t> parent;
  CommStep step;  // the step that reached it
  bool done = false;
};
using SearchStates = std::map<std::vector<int64_t>, SearchState>;
const std::vector<int64_t> kGoal{-1};

// Offers `relax` every step out of `layout` (reached at `cost`) that moves k of one factor into
// another by a primitive rule, priced on the link class its groups cross; a step that cannot
// improve on a state already known is not built.
void factor_moves(const CostModel& model, bool gradient, const Shape& shape, int64_t elem_bytes,
                  const Layout& layout, double cost, const SearchStates& states,
                  const std::function<void(const std::vector<int64_t>&, CommStep)>& relax) {
  const std::vector<int64_t> f = layout.factors();
  const double bytes = piece_bytes(layout, shape, elem_bytes);
  // Node of the device at each position, and each factor's position stride.
  std::vector<int64_t> node_of(static_cast<size_t>(layout.size()));
  for (size_t p = 0; p < node_of.size(); ++p)
    node_of[p] = layout.devices[p].value() / model.devices_per_node;
  std::vector<int64_t> stride(f.size(), 1);
  for (size_t i = f.size() - 1; i-- > 0;) stride[i] = stride[i + 1] * f[i + 1];
  for (const PrimitiveRule& rule : primitive_rules()) {
    if (rule.kind == PrimitiveKind::kTransfer || (rule.gradient_only && !gradient)) continue;
    const bool local = rule.kind == PrimitiveKind::kLocal;
    for (int a = 0; a < static_cast<int>(f.size()); ++a)
      for (int b = 0; b < static_cast<int>(f.size()); ++b) {
        if (a == b || !rule.applies(a, b)) continue;
        for (int64_t k = 2; k <= f[a]; ++k) {
          if (f[a] % k != 0) continue;
          if (b >= 2 && shape[b - 2] % (f[b] * k) != 0) continue;
          // A group is the k positions that differ in the low part of factor a's coordinate
          // (position step stride[a]); it crosses nodes when its members' nodes differ.
          bool inter = false;
          if (!local)
            for (int64_t p = 0; p < layout.size() && !inter; ++p)
              if ((p / stride[a]) % f[a] % k == 0)
                for (int64_t j = 1; j < k && !inter; ++j)
                  inter = node_of[static_cast<size_t>(p + j * stride[a])] !=
                          node_of[static_cast<size_t>(p)];
          const CostModel::Link link = model.link(rule.name, inter);
          const double alpha = local ? 0 : link.alpha_s;
          const double beta = local ? model.local_beta_s_per_byte : link.beta_s_per_byte;
          CommStep step;
          step.primitive = rule.primitive;
          step.from_factor = a;
          step.to_factor = b;
          step.k = k;
          step.cost_s = rule.cost(k, bytes, alpha, beta) + 1e-12;  // fewer steps among equals
          std::vector<int64_t> key = f;
          key[a] /= k;
          key[b] *= k;
          auto it = states.find(key);
          if (it != states.end() && (it->second.done || it->second.cost <= cost + step.cost_s))
            continue;
          step.before = layout;
          step.after = move_factor(layout, a, b, k);
          relax(key, std::move(step));
        }
      }
  }
}

// The steps that reached the goal, from `start`, each with the device groups it runs on.
CommPath trace_path(SearchStates& states, const std::vector<int64_t>& start, const Layout& from,
                    const Layout& to) {
  CommPath path;
  path.cost_s = states.at(kGoal).cost;
  for (std::vector<int64_t> k = kGoal; k != start;) {
    SearchState& s = states.at(k);
    if (!(k == kGoal && s.step.k == 0)) {
      CommStep step = s.step;
      if (rule_of(step.primitive).kind != PrimitiveKind::kTransfer)
        move_factor(step.before, step.from_factor, step.to_factor, step.k, &step.groups);
      path.steps.push_back(std::move(step));
    }
    k = s.parent;
  }
  std::reverse(path.steps.begin(), path.steps.end());
  if (!fully_replicated(from) && !fully_replicated(to))
    for (size_t i = 0; i + 1 < path.steps.size(); ++i)
      if (fully_replicated(path.steps[i].after)) path.via_full_replication = true;
  return path;
}

}  // namespace

Result<CommPath> PathFinder::intra(const Shape& shape, int64_t elem_bytes, const Layout& from,
                                   const Layout& to) {
  SearchStates states;
  std::priority_queue<SearchNode, std::vector<SearchNode>, std::greater<SearchNode>> queue;
  const std::vector<int64_t> start = from.factors();
  states[start] = SearchState{0.0, from, {}, {}, false};
  queue.push({0.0, start});
  while (!queue.empty()) {
    SearchNode node = queue.top();
    queue.pop();
    SearchState& cur = states.at(node.key);
    if (cur.done || node.cost > cur.cost) continue;
    cur.done = true;
    if (node.key == kGoal) break;
    const Layout layout = cur.layout;
    const double cost = cur.cost;
    auto relax = [&](const std::vector<int64_t>& key, CommStep step) {
      double c = cost + step.cost_s;
      auto it = states.find(key);
      if (it != states.end() && (it->second.done || it->second.cost <= c)) return;
      Layout after = step.after;
      states[key] = SearchState{c, std::move(after), node.key, std::move(step), false};
      queue.push({c, key});
    };
    if (layout == to) {
      CommStep none;
      none.after = to;
      none.cost_s = 0;
      none.primitive = Primitive::kSendRecv;
      none.k = 0;  // marks "already there"
      relax(kGoal, std::move(none));
      continue;
    }
    factor_moves(model_, gradient_, shape, elem_bytes, layout, cost, states, relax);
    // Same factors, other order: pieces move by send/recv to where the target wants them.
    if (layout.same_factors(to)) {
      const double bytes = piece_bytes(layout, shape, elem_bytes);
      CommStep step;
      step.primitive = Primitive::kSendRecv;
      step.before = layout;
      step.after = to;
      double worst = 0;
      for (int64_t p = 0; p < layout.size(); ++p) {
        DeviceId dst = to.devices[static_cast<size_t>(p)],
                 src = layout.devices[static_cast<size_t>(p)];
        if (src == dst) continue;
        worst = std::max(worst, message_seconds(src, dst, bytes));
        step.groups.push_back({src, dst});
      }
      step.cost_s = worst + 1e-12;
      relax(kGoal, std::move(step));
    }
  }
  auto g = states.find(kGoal);
  if (g == states.end() || !g->second.done)
    return Error::at("layout",
                     "no communication path from " + from.to_string() + " to " + to.to_string());
  return trace_path(states, start, from, to);
}

namespace {

// Seconds of one send/recv message of `bytes` from `src` to `dst`.
using MessageSeconds = std::function<double(DeviceId src, DeviceId dst, double bytes)>;

// Same factors on both sides: every piece goes to the device at the same position, value
// chunks included (a gradient's partial sums cross a stage boundary as they are).
CommPath direct_sends(const Shape& shape, int64_t elem_bytes, const Layout& from, const Layout& to,
                      const MessageSeconds& seconds) {
  CommStep send;
  send.primitive = Primitive::kSendRecv;
  send.before = from;
  send.after = to;
  const double bytes = piece_bytes(from, shape, elem_bytes);
  for (int64_t p = 0; p < from.size(); ++p) {
    DeviceId src = from.devices[static_cast<size_t>(p)], dst = to.devices[static_cast<size_t>(p)];
    send.groups.push_back({src, dst});
    send.cost_s = std::max(send.cost_s, seconds(src, dst, bytes));
  }
  CommPath path;
  path.cost_s = send.cost_s;
  path.steps.push_back(std::move(send));
  return path;
}

// The consumers' layout right after a transfer to `to`: full-value pieces split like the
// target (the value split, if any, is made locally afterwards).
Layout received_layout(const Layout& to) {
  Layout y = to;
  y.r = to.r * to.v;
  y.v = 1;
  for (int64_t p = 0; p < to.size(); ++p) {
    std::vector<int64_t> c = to.coords(p);
    std::vector<int64_t> yc = c;
    yc[0] = c[0] * to.v + c[1];
    yc[1] = 0;
    y.devices[static_cast<size_t>(y.position_of(yc))] = to.devices[static_cast<size_t>(p)];
  }
  return y;
}

// Send/recv from the producers' layout `x` to the consumers' `y`: each consumer takes its piece
// from a producer holding it, replicas in turn.
CommStep replica_sends(const Shape& shape, int64_t elem_bytes, const Layout& x, const Layout& y,
                       const MessageSeconds& seconds) {
  CommStep send;
  send.primitive = Primitive::kSendRecv;
  send.before = x;
  send.after = y;
  const double bytes = piece_bytes(y, shape, elem_bytes);
  std::map<int64_t, int> load;
  double worst = 0;
  for (int64_t p = 0; p < y.size(); ++p) {
    std::vector<int64_t> c = y.coords(p);
    std::vector<int64_t> xc = c;
    xc[0] = c[0] % x.r;
    DeviceId src = x.devices[static_cast<size_t>(x.position_of(xc))];
    DeviceId dst = y.devices[static_cast<size_t>(p)];
    send.groups.push_back({src, dst});
    worst = std::max(worst, ++load[src.value()] * seconds(src, dst, bytes));
  }
  send.cost_s = worst;
  return send;
}

}  // namespace

Result<CommPath> PathFinder::cross(const Shape& shape, int64_t elem_bytes, const Layout& from,
                                   const Layout& to) {
  const MessageSeconds seconds = [this](DeviceId src, DeviceId dst, double bytes) {
    return message_seconds(src, dst, bytes);
  };
  if (from.same_factors(to)) return direct_sends(shape, elem_bytes, from, to, seconds);
  // Consumers receive full-value pieces split like the target; producers first bring their
  // pieces into that split.
  Layout y = received_layout(to);
  int64_t cells = 1;
  for (int64_t x : to.d) cells *= x;
  CommPath path;
  Layout x;
  if (from.size() % cells == 0) {
    // The producers' natural order, or the order they already hold such pieces in.
    x = from;
    x.r = from.size() / cells;
    x.v = 1;
    x.d = to.d;
    std::vector<Layout> candidates{x};
    if (from.v == 1 && from.d == to.d) candidates.push_back(from);
    Result<CommPath> best = Error::at("layout", "no path within the producers");
    for (const Layout& candidate : candidates) {
      auto p = intra(shape, elem_bytes, from, candidate);
      if (p.ok() && (!best.ok() || p->cost_s < best->cost_s)) {
        best = p;
        x = candidate;
      }
    }
    if (!best.ok()) return best.error();
    path = *best;
  } else {
    x = Layout::replicated(shape.size(), from.devices);
    LOOM_ASSIGN_OR_RETURN(path, intra(shape, elem_bytes, from, x));
    path.via_full_replication = !fully_replicated(from);
    y = Layout::replicated(shape.size(), to.devices);
  }
  CommStep send = replica_sends(shape, elem_bytes, x, y, seconds);
  path.cost_s += send.cost_s;
  path.steps.push_back(std::move(send));
  if (y != to) {
    LOOM_ASSIGN_OR_RETURN(CommPath tail, intra(shape, elem_bytes, y, to));
    path.steps.insert(path.steps.end(), tail.steps.begin(), tail.steps.end());
    path.cost_s += tail.cost_s;
  }
  return path;
}

}  // namespace loom::lower
