#include "scheduler/predefined.h"

#include <algorithm>
#include <sstream>

#include "core/strings.h"
#include "scheduler/list_scheduler.h"

namespace loom::sched {

namespace {

const std::vector<std::pair<ScheduleKind, std::string>>& kind_table() {
  static const std::vector<std::pair<ScheduleKind, std::string>> table = {
      {ScheduleKind::kGPipe, "gpipe"},
      {ScheduleKind::k1F1B, "1f1b"},
      {ScheduleKind::kInterleaved, "interleaved"},
      {ScheduleKind::kChimera, "chimera"},
      {ScheduleKind::kLoopedBfs, "looped-bfs"},
      {ScheduleKind::kZbH1, "zb-h1"}};
  return table;
}

// Stage s of chunk c on device d: s = c*p + d (looping placement).
Result<Workload> chain(const PipelineSpec& spec, int stages, bool split,
                       std::function<std::vector<DeviceId>(StageId, MicroBatch)> devices) {
  const double v = spec.chunks;
  const double per_f = 1.0 / v;
  ChainLayout l;
  l.num_devices = spec.devices;
  l.num_stages = stages;
  l.micro_batches = spec.micro_batches;
  l.split_backward = split;
  l.devices = std::move(devices);
  l.duration = [&spec, v](BlockKind k, StageId) {
    switch (k) {
      case BlockKind::kF:
        return spec.fwd / v;
      case BlockKind::kB:
        return spec.bwd / v;
      case BlockKind::kI:
        return spec.bwd / v;
      case BlockKind::kW:
        return spec.wgrad / v;
    }
    return 0.0;
  };
  l.memory = [per_f](BlockKind k, StageId) { return block_memory(k) * per_f; };
  return Workload::chain(l);
}

auto looping(int p) {
  return [p](StageId s, MicroBatch) { return std::vector<DeviceId>{DeviceId(s.value() % p)}; };
}

BlockId F(int64_t s, int64_t k) { return BlockId::of(s, BlockKind::kF, k); }
BlockId B(int64_t s, int64_t k) { return BlockId::of(s, BlockKind::kB, k); }

Status need_one_chunk(const PipelineSpec& spec, const char* kind) {
  if (spec.chunks != 1)
    return error(std::string(kind) +
                 " runs one stage per device; --chunks applies to interleaved "
                 "and looped-bfs only (got " +
                 std::to_string(spec.chunks) + ")");
  return Status::success();
}

}  // namespace

std::string to_string(ScheduleKind kind) {
  for (const auto& [k, name] : kind_table())
    if (k == kind) return name;
  return "?";
}

const std::vector<std::string>& schedule_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& e : kind_table()) out.push_back(e.second);
    return out;
  }();
  return names;
}

Result<ScheduleKind> parse_schedule_kind(const std::string& name) {
  for (const auto& [k, n] : kind_table())
    if (n == name) return k;
  std::string hint = closest_match(name, schedule_kind_names());
  return error("unknown schedule kind '" + name + "'" +
               (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
               "; known: " + join(schedule_kind_names(), ", "));
}

Status PipelineSpec::validate() const {
  if (devices < 1)
    return Error::at("stages", "needs at least 1 device, got " + std::to_string(devices));
  if (micro_batches < 1)
    return Error::at("micro-batches",
                     "needs at least 1 micro-batch, got " + std::to_string(micro_batches));
  if (chunks < 1)
    return Error::at("chunks", "needs at least 1 chunk, got " + std::to_string(chunks));
  if (!(fwd > 0)) return Error::at("fwd", "the forward time must be positive");
  if (!(bwd > 0)) return Error::at("bwd", "the backward time must be positive");
  if (!(wgrad >= 0)) return Error::at("wgrad", "the weight-gradient time must not be negative");
  return Status::success();
}

std::string PipelineSpec::to_string() const {
  std::ostringstream os;
  os << "p=" << devices << " m=" << micro_batches << " v=" << chunks << " fwd=" << fwd
     << " bwd=" << bwd << " wgrad=" << wgrad;
  return os.str();
}

Result<Schedule> gpipe(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  LOOM_TRY(need_one_chunk(spec, "gpipe"));
  const int p = spec.devices, m = spec.micro_batches;
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p, false, looping(p)));
  std::vector<std::vector<BlockId>> order(p);
  for (int d = 0; d < p; ++d) {
    for (int k = 0; k < m; ++k) order[d].push_back(F(d, k));
    for (int k = 0; k < m; ++k) order[d].push_back(B(d, k));
  }
  return Schedule::create(std::move(w), std::move(order), "gpipe");
}

Result<Schedule> one_f_one_b(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  LOOM_TRY(need_one_chunk(spec, "1f1b"));
  const int p = spec.devices, m = spec.micro_batches;
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p, false, looping(p)));
  std::vector<std::vector<BlockId>> order(p);
  for (int d = 0; d < p; ++d) {
    const int warmup = std::min(p - d - 1, m);
    for (int k = 0; k < warmup; ++k) order[d].push_back(F(d, k));
    for (int k = 0; k < m - warmup; ++k) {
      order[d].push_back(F(d, warmup + k));
      order[d].push_back(B(d, k));
    }
    for (int k = m - warmup; k < m; ++k) order[d].push_back(B(d, k));
  }
  return Schedule::create(std::move(w), std::move(order), "1f1b");
}

Result<Schedule> interleaved_1f1b(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  const int p = spec.devices, m = spec.micro_batches, v = spec.chunks;
  if (m % p != 0)
    return Error::at("micro-batches", "interleaved needs m to be a multiple of p, got m=" +
                                          std::to_string(m) + " p=" + std::to_string(p));
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p * v, false, looping(p)));
  // Megatron-LM's order: micro-batches in groups of p, each group through chunk 0..v-1
  // forward and v-1..0 backward; warm-up 2(p-d-1) + (v-1)p chunk forwards.
  const int total = m * v;
  auto chunk_mb = [&](int i, bool forward) {
    int c = (i / p) % v;
    if (!forward) c = v - 1 - c;
    int k = (i / (p * v)) * p + i % p;
    return std::pair<int, int>{c, k};
  };
  std::vector<std::vector<BlockId>> order(p);
  for (int d = 0; d < p; ++d) {
    int warmup = m == p ? total : std::min(2 * (p - d - 1) + (v - 1) * p, total);
    auto fwd = [&](int i) {
      auto [c, k] = chunk_mb(i, true);
      order[d].push_back(F(c * p + d, k));
    };
    auto bwd = [&](int i) {
      auto [c, k] = chunk_mb(i, false);
      order[d].push_back(B(c * p + d, k));
    };
    for (int i = 0; i < warmup; ++i) fwd(i);
    for (int i = 0; i < total - warmup; ++i) fwd(warmup + i), bwd(i);
    for (int i = total - warmup; i < total; ++i) bwd(i);
  }
  return Schedule::create(std::move(w), std::move(order), "interleaved");
}

Result<Schedule> looped_bfs(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  const int p = spec.devices, m = spec.micro_batches, v = spec.chunks;
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p * v, false, looping(p)));
  std::vector<std::vector<BlockId>> order(p);
  for (int d = 0; d < p; ++d) {
    for (int c = 0; c < v; ++c)
      for (int k = 0; k < m; ++k) order[d].push_back(F(c * p + d, k));
    for (int c = v - 1; c >= 0; --c)
      for (int k = 0; k < m; ++k) order[d].push_back(B(c * p + d, k));
  }
  return Schedule::create(std::move(w), std::move(order), "looped-bfs");
}

Result<Schedule> chimera(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  LOOM_TRY(need_one_chunk(spec, "chimera"));
  const int p = spec.devices, m = spec.micro_batches;
  if (p % 2 != 0)
    return Error::at("stages", "chimera needs an even number of stages, got " + std::to_string(p));
  if (m % 2 != 0)
    return Error::at("micro-batches",
                     "chimera needs an even number of micro-batches (half go down, "
                     "half up), got " +
                         std::to_string(m));
  auto place = [p](StageId s, MicroBatch k) {
    bool down = k.value() % 2 == 0;
    return std::vector<DeviceId>{DeviceId(down ? s.value() : p - 1 - s.value())};
  };
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p, false, place));
  // Chimera's rule: backward first, then the oldest micro-batch; each device holds at most
  // p/2 + 1 ... p micro-batches of the two pipelines together (its stage in each).
  ListPolicy pol;
  pol.priority = [&w](int i) {
    const Block& b = w.block(i);
    return (b.kind == BlockKind::kF ? 1e9 : 0.0) + b.mb.value() * 1e3 + b.stage.value();
  };
  pol.memory_limit.assign(p, p);  // Chimera's bound: at most p micro-batches per device
  LOOM_ASSIGN_OR_RETURN(auto order, list_schedule(w, pol));
  return Schedule::from_indices(std::move(w), std::move(order), "chimera");
}

Result<Schedule> zb_h1(const PipelineSpec& spec) {
  LOOM_TRY(spec.validate());
  LOOM_TRY(need_one_chunk(spec, "zb-h1"));
  const int p = spec.devices;
  LOOM_ASSIGN_OR_RETURN(Workload w, chain(spec, p, true, looping(p)));
  // Stage d runs min(p-d, m) forwards, then per micro-batch j: I_j, the W it deferred d
  // micro-batches ago, the next F. Deferring W shortens the I chain that the cool-down waits
  // for; each stage holds at most p micro-batches (1F1B's peak), stage 0 exactly 1F1B's.
  const int m = spec.micro_batches;
  std::vector<std::vector<BlockId>> order(p);
  for (int d = 0; d < p; ++d) {
    const int warmup = std::min(p - d, m), lag = d;
    auto& o = order[d];
    for (int k = 0; k < warmup; ++k) o.push_back(F(d, k));
    for (int j = 0; j < m; ++j) {
      o.push_back(BlockId::of(d, BlockKind::kI, j));
      if (j >= lag) o.push_back(BlockId::of(d, BlockKind::kW, j - lag));
      if (warmup + j < m) o.push_back(F(d, warmup + j));
    }
    for (int j = std::max(0, m - lag); j < m; ++j) o.push_back(BlockId::of(d, BlockKind::kW, j));
  }
  return Schedule::create(std::move(w), std::move(order), "zb-h1");
}

Result<Schedule> build_predefined(ScheduleKind kind, const PipelineSpec& spec) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe(spec);
    case ScheduleKind::k1F1B:
      return one_f_one_b(spec);
    case ScheduleKind::kInterleaved:
      return interleaved_1f1b(spec);
    case ScheduleKind::kChimera:
      return chimera(spec);
    case ScheduleKind::kLoopedBfs:
      return looped_bfs(spec);
    case ScheduleKind::kZbH1:
      return zb_h1(spec);
  }
  return error("unknown schedule kind");
}

Result<std::vector<std::vector<BlockId>>> device_orders(ScheduleKind kind, int p, int m, int v) {
  LOOM_ASSIGN_OR_RETURN(Schedule s, build_predefined(kind, PipelineSpec::of(p, m, v)));
  return s.device_orders();
}

}  // namespace loom::sched
