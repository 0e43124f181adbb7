// The estimator's communication: every rank's share of each adapter's paths and of the
// gradient all-reduces, in seconds on the cost model and bytes sent.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/check.h"
#include "core/training_state.h"
#include "graph/ops_moe.h"
#include "graph/precision.h"
#include "lower/fusion.h"
#include "lower/grad_bucketing.h"
#include "lower/param_shards.h"
#include "lower/path.h"
#include "lower/recompute.h"
#include "plan/estimate_parts.h"
#include "planner/cost.h"
#include "scheduler/block.h"

namespace loom::plan {
namespace {

// By tensor id: the share of a mixture of experts' slots buffer a balanced router fills (the
// expert ops' `rows` of its c slots), what a ragged all-to-all sends of it
// (runtime/path_runner.h); 1 for every other tensor.
std::vector<double> slot_fill(const graph::Graph& planned) {
  std::vector<double> fill(planned.tensors().size(), 1.0);
  for (const auto& op : planned.ops()) {
    if ((op.type() != graph::kMoeDispatch && op.type() != graph::kExpertLinear) ||
        !op.attrs().has("rows"))
      continue;
    const auto out = static_cast<size_t>(op.outputs[0].tensor.value());
    const double slots = static_cast<double>(planned.tensor(op.outputs[0].tensor).shape[2]);
    fill[out] = std::min(1.0, static_cast<double>(op.attrs().get<int64_t>("rows")) / slots);
  }
  return fill;
}

// Every rank's share of a communication path at once: what path_seconds and add_path_bytes give
// each rank, in O(the path's devices) rather than O(world) per rank (a plan of a thousand ranks
// has thousands of adapters, each path on a few of them). Each rank's figures are summed in the
// same order as those functions sum them, so they are the same numbers.
class PathShares {
 public:
  explicit PathShares(size_t world)
      : seconds_(world, 0),
        bytes_(world, 0),
        piece_(world, 0),
        seen_(world, 0),
        listed_(world, 0) {}

  // path_seconds(path, r, fill) of every rank r: seconds(r), nonzero only for ranks().
  void time(const lower::CommPath& path, double fill) {
    for (size_t r : ranks_) seconds_[r] = 0;
    ranks_.clear();
    ++path_mark_;
    for (const lower::CommStep& st : path.steps) {
      ++step_mark_;
      const double c = st.cost_s * (lower::rule_of(st.primitive).ragged ? fill : 1.0);
      for (const auto* layout : {&st.before, &st.after})
        for (DeviceId d : layout->devices) {
          const auto r = static_cast<size_t>(d.value());
          if (seen_[r] == step_mark_) continue;
          seen_[r] = step_mark_;
          if (listed_[r] != path_mark_) listed_[r] = path_mark_, ranks_.push_back(r);
          seconds_[r] += c;
        }
    }
  }
  const std::vector<size_t>& ranks() const { return ranks_; }
  bool has(size_t r) const { return listed_[r] == path_mark_; }
  double seconds(size_t r) const { return seconds_[r]; }

  // add_path_bytes(path, shape, elem, r, times, ranks[r].sent, fill) for every rank r.
  void add_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, double times,
                 double fill, std::vector<RankEstimate>& ranks) {
    std::vector<size_t> senders;
    for (const lower::CommStep& st : path.steps) {
      ++step_mark_;
      senders.clear();
      // Each rank of the layout before the step, at its last position (add_path_bytes').
      for (size_t p = st.before.devices.size(); p-- > 0;) {
        const auto r = static_cast<size_t>(st.before.devices[p].value());
        if (seen_[r] == step_mark_) continue;
        seen_[r] = step_mark_;
        piece_[r] = static_cast<double>(
            numel(st.before.piece(static_cast<int64_t>(p), TensorId(0), shape).shape()) * elem);
        bytes_[r] = 0;
        senders.push_back(r);
      }
      const lower::PrimitiveRule& rule = lower::rule_of(st.primitive);
      for (const std::vector<DeviceId>& g : st.groups) {     // lower::bytes_sent, group by group
        if (rule.kind == lower::PrimitiveKind::kTransfer) {  // pairs {from, to}
          const auto r = static_cast<size_t>(g[0].value());
          if (seen_[r] == step_mark_ && g[1] != g[0]) bytes_[r] += rule.bytes(2, piece_[r]);
          continue;
        }
        for (DeviceId d : g) {
          const auto r = static_cast<size_t>(d.value());
          if (seen_[r] == step_mark_)
            bytes_[r] += rule.bytes(static_cast<int64_t>(g.size()), piece_[r]);
        }
      }
      for (size_t r : senders) {
        const double bytes = bytes_[r] * (rule.ragged ? fill : 1.0);
        if (bytes > 0) ranks[r].sent[rule.name] += bytes * times;
      }
    }
  }

 private:
  std::vector<double> seconds_, bytes_, piece_;
  std::vector<uint64_t> seen_;    // == step_mark_: met in the current step
  std::vector<uint64_t> listed_;  // == path_mark_: in ranks_
  std::vector<size_t> ranks_;
  uint64_t step_mark_ = 0, path_mark_ = 0;
};

}  // namespace

namespace estimate_detail {

// Every rank's communication per step through the adapters: each adapter's forward and
// gradient paths per micro-batch (the steps a rank takes part in), and a weight gathered again
// for its backward, at slot_fill's share of a ragged all-to-all.
void add_adapter_communication(const graph::Graph& planned, const lower::Lowered& lowered, double m,
                               std::vector<RankEstimate>& ranks) {
  const std::vector<double> fill = slot_fill(planned);
  PathShares forward(ranks.size()), backward(ranks.size());
  for (const auto& a : lowered.adapters) {
    const double f = fill[static_cast<size_t>(a.tensor.value())];
    forward.time(a.forward, f);
    backward.time(a.backward, f);
    for (size_t r : forward.ranks())
      ranks[r].comm_s += m * (forward.seconds(r) + backward.seconds(r));
    for (size_t r : backward.ranks())
      if (!forward.has(r)) ranks[r].comm_s += m * (forward.seconds(r) + backward.seconds(r));
    const auto& t = planned.tensor(a.tensor);
    forward.add_bytes(a.forward, t.shape, size_bytes(t.dtype), m, f, ranks);
    forward.add_bytes(a.backward, t.shape, size_bytes(t.dtype), m, f, ranks);
    if (!a.regather) continue;  // a linear's weight is gathered again for its backward
    forward.time(a.forward, 1.0);
    for (size_t r : forward.ranks()) ranks[r].comm_s += m * forward.seconds(r);
    forward.add_bytes(a.forward, t.shape, size_bytes(t.dtype), m, 1.0, ranks);
  }
}

// A rank's gradient all-reduces, once per step: one per bucket of the runtime's (a latency per
// bucket, not per tensor).
void add_grad_sync(const PlanSpec& spec, const lower::Lowered& lowered, const CostModel& cost,
                   size_t r, RankEstimate& re) {
  const GradGroups groups = grad_groups(lowered, r);
  for (size_t k = 0; k < groups.devices.size(); ++k) {
    const auto members = static_cast<int64_t>(groups.devices[k].size());
    for (const lower::BucketPlan& b :
         lower::plan_buckets(groups.numels[k], 4, spec.bucket_bytes, members, false)) {
      const double bytes = static_cast<double>(b.elements * 4);
      re.comm_s += all_reduce_seconds(cost, groups.devices[k], bytes);
      re.sent["grad all_reduce"] +=
          lower::rule_of(lower::Primitive::kAllReduce).bytes(members, bytes);
    }
  }
}

}  // namespace estimate_detail

double all_reduce_seconds(const CostModel& cost, const std::vector<DeviceId>& devices,
                          double bytes) {
  const double k = static_cast<double>(devices.size());
  if (k < 2) return 0;
  bool inter = false;
  for (DeviceId d : devices)
    inter =
        inter || d.value() / cost.devices_per_node != devices[0].value() / cost.devices_per_node;
  const lower::PrimitiveRule& rule = lower::rule_of(lower::Primitive::kAllReduce);
  const CostModel::Link link = cost.link(rule.name, inter);
  // lower's formula, the one loom calibrate fits.
  return rule.cost(static_cast<int64_t>(devices.size()), bytes, link.alpha_s, link.beta_s_per_byte);
}

double path_seconds(const lower::CommPath& path, int64_t rank, double all_to_all_fill) {
  double t = 0;
  for (const lower::CommStep& st : path.steps) {
    bool in = false;
    for (const auto& layout : {&st.before, &st.after})
      for (DeviceId d : layout->devices) in = in || d.value() == rank;
    if (in) t += st.cost_s * (lower::rule_of(st.primitive).ragged ? all_to_all_fill : 1.0);
  }
  return t;
}

void add_path_bytes(const lower::CommPath& path, const Shape& shape, int64_t elem, int64_t rank,
                    double times, std::map<std::string, double>& out, double all_to_all_fill) {
  for (const lower::CommStep& st : path.steps) {
    int64_t pos = -1;
    for (size_t p = 0; p < st.before.devices.size(); ++p)
      if (st.before.devices[p].value() == rank) pos = static_cast<int64_t>(p);
    if (pos < 0) continue;
    const double piece =
        static_cast<double>(numel(st.before.piece(pos, TensorId(0), shape).shape()) * elem);
    const lower::PrimitiveRule& rule = lower::rule_of(st.primitive);
    const double bytes = lower::bytes_sent(st, rank, piece) * (rule.ragged ? all_to_all_fill : 1.0);
    if (bytes > 0) out[rule.name] += bytes * times;
  }
}
}  // namespace loom::plan
