// The deadlock check of lowered programs: every rank's communication events are simulated in
// program order, and a send, receive or collective that can never be matched fails the plan
// with the ranks and steps that wait on each other.
#include <algorithm>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/strings.h"
#include "lower/program.h"

namespace loom::lower {

namespace {

// One communication event of a rank, in program order. Keys are integers (adapter, direction,
// micro-batch, step) so that checking a thousand ranks stays cheap; text is made on failure.
// 24 bytes: a 1024-rank plan's check holds tens of millions of them.
struct Event {
  enum class Kind : uint8_t { kSend, kRecv, kCollective };
  int64_t key;                           // identical on every party of the same exchange
  const std::vector<DeviceId>* members;  // collective: its members
  int32_t peer;                          // send: the receiver; recv: the sender
  Kind kind;
  Primitive primitive;
};

std::string describe(const Event& e, const Lowered& lowered, const graph::Graph& g) {
  if (e.key < 0) {
    const GradSync& s = lowered.grad_syncs[static_cast<size_t>(-e.key - 1)];
    return "all_reduce of the gradients of '" + g.tensor(s.tensor).name + "'";
  }
  const auto [adapter, forward, mb, step] = message_tag_parts(e.key);
  const Adapter& a = lowered.adapters[static_cast<size_t>(adapter)];
  std::string what = e.kind == Event::Kind::kSend   ? "send to rank " + std::to_string(e.peer)
                     : e.kind == Event::Kind::kRecv ? "recv from rank " + std::to_string(e.peer)
                                                    : to_string(e.primitive);
  return what + " (step " + std::to_string(step) + " of the " + (forward ? "forward" : "gradient") +
         " path of '" + g.tensor(a.tensor).name + "' for " + a.consumer + ", micro-batch " +
         std::to_string(mb) + ")";
}

// Steps of `path` this rank runs, on the given side of a cross-group adapter.
// For each step of a path, the index of the group each rank belongs to (-1: none).
using GroupIndex = std::vector<std::vector<int32_t>>;
GroupIndex index_groups(const CommPath& path, int64_t world) {
  GroupIndex out;
  for (const CommStep& st : path.steps) {
    std::vector<int32_t> of(static_cast<size_t>(world), -1);
    if (st.primitive != Primitive::kSendRecv)
      for (size_t g = 0; g < st.groups.size(); ++g)
        if (st.groups[g].size() > 1)
          for (DeviceId d : st.groups[g])
            of[static_cast<size_t>(d.value())] = static_cast<int32_t>(g);
    out.push_back(std::move(of));
  }
  return out;
}

void path_events(const CommPath& path, const GroupIndex& groups, int64_t adapter, bool forward,
                 int64_t mb, int64_t rank, int side, const std::vector<bool>& first_group,
                 std::vector<Event>& events) {
  // side: 0 = whole path, 1 = the first group's part, 2 = the second group's part.
  bool after_send = false;
  for (size_t i = 0; i < path.steps.size(); ++i) {
    const CommStep& st = path.steps[i];
    const int64_t key = message_tag(adapter, forward, mb, i);
    if (st.primitive == Primitive::kSendRecv) {
      for (const auto& pair : st.groups) {
        if (pair[0].value() == rank && side != 2)
          events.push_back({key, nullptr, static_cast<int32_t>(pair[1].value()), Event::Kind::kSend,
                            st.primitive});
        if (pair[1].value() == rank && side != 1)
          events.push_back({key, nullptr, static_cast<int32_t>(pair[0].value()), Event::Kind::kRecv,
                            st.primitive});
      }
      if (side != 0 && !st.groups.empty() &&
          first_group[static_cast<size_t>(st.groups[0][0].value())])
        after_send = true;
      continue;
    }
    const bool first_part = side != 0 && !after_send;
    if (side == 1 && !first_part) continue;
    if (side == 2 && first_part) continue;
    const int32_t g = groups[i][static_cast<size_t>(rank)];
    if (g >= 0)
      events.push_back(
          {key, &st.groups[static_cast<size_t>(g)], -1, Event::Kind::kCollective, st.primitive});
  }
}

}  // namespace

namespace {

// Each rank's communication events in program order, made one block at a time as the check
// reaches them: a 1024-rank plan has tens of millions, and only the current ones are needed.
class EventStreams {
 public:
  explicit EventStreams(const Lowered& lowered) : lowered_(lowered) {
    const size_t world = lowered.programs.size();
    sides_.resize(lowered.adapters.size());
    for (size_t i = 0; i < lowered.adapters.size(); ++i) {
      const Adapter& a = lowered.adapters[i];
      Sides& s = sides_[i];
      s.producer.assign(world, false);
      s.consumer.assign(world, false);
      for (DeviceId d : a.from.devices) s.producer[static_cast<size_t>(d.value())] = true;
      for (DeviceId d : a.to.devices) s.consumer[static_cast<size_t>(d.value())] = true;
      s.forward = index_groups(a.forward, static_cast<int64_t>(world));
      s.backward = index_groups(a.backward, static_cast<int64_t>(world));
    }
    ranks_.resize(world);
  }

  // The rank's next event, or nullptr when its program has no more.
  const Event* current(size_t r) {
    Stream& st = ranks_[r];
    while (st.at == st.events.size()) {
      const Program& prog = lowered_.programs[r];
      if (st.block > prog.blocks.size()) return nullptr;
      st.events.clear();
      st.at = 0;
      if (st.block < prog.blocks.size())
        block_events(r, prog.blocks[st.block], st.events);
      else
        for (int64_t s : prog.grad_syncs)
          st.events.push_back({-s - 1, &lowered_.grad_syncs[static_cast<size_t>(s)].devices, -1,
                               Event::Kind::kCollective, Primitive::kAllReduce});
      ++st.block;
    }
    return &st.events[st.at];
  }
  void advance(size_t r) { ++ranks_[r].at; }

 private:
  // Per adapter: each side's membership and each step's groups by rank.
  struct Sides {
    std::vector<bool> producer, consumer;
    GroupIndex forward, backward;
  };
  struct Stream {
    std::vector<Event> events;  // of the block before `block`
    size_t at = 0;
    size_t block = 0;  // blocks.size(): the gradient syncs; past it: the end
  };

  void block_events(size_t r, const ProgramBlock& b, std::vector<Event>& events) const {
    if (b.kind == BlockKind::kW) return;  // local matrix products only
    const Program& prog = lowered_.programs[r];
    const Segment& seg = *std::find_if(prog.segments.begin(), prog.segments.end(),
                                       [&](const Segment& s) { return s.stage == b.stage; });
    const int64_t rank = static_cast<int64_t>(r);
    auto visit = [&](const SegmentItem& it, bool fwd) {
      if (it.kind != SegmentItem::Kind::kAdapter) return;
      const Adapter& a = lowered_.adapters[static_cast<size_t>(it.index)];
      const Sides& s = sides_[static_cast<size_t>(it.index)];
      // Forward: producers run the first part; backward: the consumers (holding grad(to)) do.
      int side = 0;
      if (a.disjoint) side = (it.producer_side == fwd) ? 1 : 2;
      // A regathered parameter's backward gathers it again first.
      if (!fwd && a.regather)
        path_events(a.forward, s.forward, a.id, true, b.micro_batch.value(), rank, side, s.producer,
                    events);
      path_events(fwd ? a.forward : a.backward, fwd ? s.forward : s.backward, a.id, fwd,
                  b.micro_batch.value(), rank, side, fwd ? s.producer : s.consumer, events);
    };
    if (b.kind == BlockKind::kF) {
      for (const SegmentItem& it : seg.items) visit(it, true);
      return;
    }
    // A recomputed region's backward runs its forward (its collectives) again first.
    for (int64_t i = static_cast<int64_t>(seg.items.size()) - 1; i >= 0; --i) {
      for (const RecomputeRegion& region : seg.recompute)
        if (region.end - 1 == i)
          for (int64_t j = region.begin; j < region.end; ++j)
            visit(seg.items[static_cast<size_t>(j)], true);
      visit(seg.items[static_cast<size_t>(i)], false);
    }
  }

  const Lowered& lowered_;
  std::vector<Sides> sides_;
  std::vector<Stream> ranks_;
};

}  // namespace

Status check_deadlock_free(const graph::Graph& g, const Lowered& lowered) {
  const size_t world = lowered.programs.size();
  for (size_t r = 0; r < world; ++r) {
    const Program& prog = lowered.programs[r];
    for (const ProgramBlock& b : prog.blocks)
      if (std::none_of(prog.segments.begin(), prog.segments.end(),
                       [&](const Segment& s) { return s.stage == b.stage; }))
        return Error::at("program", "rank " + std::to_string(r) + " has a block for stage " +
                                        b.stage.to_string() + " it does not run");
  }
  // Run: sends never block; a receive waits for its send; a collective for all its members.
  // A rank runs until it waits and is woken by what it waits for (its send, or the last member
  // reaching its collective), so each event is looked at a bounded number of times. Whether the
  // programs finish, and where each stuck rank waits, does not depend on the order ranks run in.
  EventStreams streams(lowered);
  // Messages sent and not yet received (step key and receiver): each is received once, so the
  // set holds what is in flight, not every message of the step.
  std::unordered_set<int64_t> sent;
  std::unordered_map<int64_t, size_t> receiving;  // message -> the rank waiting for it
  // Members at each collective, keyed by its step key and member list.
  struct GroupHash {
    size_t operator()(const std::pair<int64_t, const std::vector<DeviceId>*>& g) const {
      return std::hash<int64_t>()(g.first) ^ (std::hash<const void*>()(g.second) * 31);
    }
  };
  std::unordered_map<std::pair<int64_t, const std::vector<DeviceId>*>, size_t, GroupHash> arrived;
  std::vector<char> counted(world, 0);  // the rank's arrival at its current collective counted
  auto message = [&](int64_t key, int64_t dst) { return key * 65536 + dst; };
  std::deque<size_t> runnable;
  for (size_t r = 0; r < world; ++r) runnable.push_back(r);
  while (!runnable.empty()) {
    const size_t r = runnable.front();
    runnable.pop_front();
    while (const Event* e = streams.current(r)) {
      if (e->kind == Event::Kind::kSend) {
        const int64_t m = message(e->key, e->peer);
        sent.insert(m);
        if (auto w = receiving.find(m); w != receiving.end()) {
          runnable.push_back(w->second);
          receiving.erase(w);
        }
      } else if (e->kind == Event::Kind::kRecv) {
        const int64_t m = message(e->key, static_cast<int64_t>(r));
        if (!sent.erase(m)) {
          receiving[m] = r;
          break;
        }
      } else {
        const auto group = arrived.try_emplace(std::make_pair(e->key, e->members), 0).first;
        if (!counted[r]) counted[r] = 1, ++group->second;
        if (group->second < e->members->size()) break;
        arrived.erase(group);
        for (DeviceId m : *e->members) {
          const size_t member = static_cast<size_t>(m.value());
          counted[member] = 0;
          if (member == r) continue;
          streams.advance(member);
          runnable.push_back(member);
        }
      }
      streams.advance(r);
    }
  }
  std::vector<std::string> stuck;
  for (size_t r = 0; r < world; ++r)
    if (const Event* e = streams.current(r))
      stuck.push_back("rank " + std::to_string(r) + " waits at " + describe(*e, lowered, g));
  if (!stuck.empty())
    return Error::at("program", "the programs would deadlock: " + join(stuck, "; "));
  return Status::success();
}

}  // namespace loom::lower
