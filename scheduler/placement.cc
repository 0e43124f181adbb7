#include "scheduler/placement.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/strings.h"

namespace loom::sched {

namespace {

std::vector<DeviceId> all_devices(int p) {
  std::vector<DeviceId> out;
  for (int d = 0; d < p; ++d) out.push_back(DeviceId(d));
  return out;
}

PlacedBlock make(std::string name, BlockKind kind, int64_t stage, std::vector<DeviceId> devices,
                 double span, double memory, std::vector<int> after, int mb = 0) {
  PlacedBlock b;
  b.name = std::move(name);
  b.kind = kind;
  b.stage = StageId(stage);
  b.micro_batch = mb;
  b.devices = std::move(devices);
  b.span = span;
  b.memory = memory;
  b.after = std::move(after);
  return b;
}

// Appends a chain: F of each stage down `devs`, then B back up. Returns the index of the last B.
int add_chain(std::vector<PlacedBlock>& out, const std::vector<std::vector<DeviceId>>& devs,
              int64_t first_stage, int mb, const std::string& prefix, double fwd, double bwd,
              std::vector<int> first_after, int* last_f = nullptr) {
  const int n = static_cast<int>(devs.size());
  std::vector<int> f(n);
  for (int s = 0; s < n; ++s) {
    std::vector<int> after = s == 0 ? first_after : std::vector<int>{f[s - 1]};
    f[s] = static_cast<int>(out.size());
    out.push_back(make(prefix + "f" + std::to_string(s), BlockKind::kF, first_stage + s, devs[s],
                       fwd, 1, after, mb));
  }
  if (last_f) *last_f = f[n - 1];
  int prev = f[n - 1];
  for (int s = n - 1; s >= 0; --s) {
    std::vector<int> after = {prev};
    if (s != n - 1) after.push_back(f[s]);
    prev = static_cast<int>(out.size());
    out.push_back(make(prefix + "b" + std::to_string(s), BlockKind::kB, first_stage + s, devs[s],
                       bwd, -1, after, mb));
  }
  return prev;
}

std::vector<std::vector<DeviceId>> single(int p, bool reversed) {
  std::vector<std::vector<DeviceId>> out;
  for (int s = 0; s < p; ++s) out.push_back({DeviceId(reversed ? p - 1 - s : s)});
  return out;
}

Placement must(Result<Placement> r) {
  LOOM_CHECK(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

std::string fmt(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

Result<Placement> Placement::create(int devices, double memory_limit,
                                    std::vector<PlacedBlock> blocks) {
  Placement p;
  p.devices_ = devices;
  p.memory_limit_ = memory_limit;
  p.blocks_ = std::move(blocks);
  LOOM_TRY(p.validate());
  return p;
}

Placement Placement::v_shape(int p, double fwd, double bwd) {
  std::vector<PlacedBlock> b;
  add_chain(b, single(p, false), 0, 0, "", fwd, bwd, {});
  return must(create(p, p, std::move(b)));
}

Placement Placement::v_shape_split(int p, double fwd, double input, double weight) {
  std::vector<PlacedBlock> b;
  std::vector<int> f(p);
  for (int s = 0; s < p; ++s) {
    f[s] = static_cast<int>(b.size());
    b.push_back(make("f" + std::to_string(s), BlockKind::kF, s, {DeviceId(s)}, fwd, 1,
                     s == 0 ? std::vector<int>{} : std::vector<int>{f[s - 1]}));
  }
  int prev = f[p - 1];
  for (int s = p - 1; s >= 0; --s) {
    std::vector<int> after = {prev};
    if (s != p - 1) after.push_back(f[s]);
    const int i = static_cast<int>(b.size());
    b.push_back(make("i" + std::to_string(s), BlockKind::kI, s, {DeviceId(s)}, input, 0, after));
    b.push_back(make("w" + std::to_string(s), BlockKind::kW, s, {DeviceId(s)}, weight, -1, {i}));
    prev = i;
  }
  return must(create(p, p, std::move(b)));
}

Placement Placement::x_shape(int p, double fwd, double bwd) {
  std::vector<PlacedBlock> b;
  add_chain(b, single(p, false), 0, 0, "down_", fwd, bwd, {});
  add_chain(b, single(p, true), 0, 1, "up_", fwd, bwd, {});
  return must(create(p, p, std::move(b)));
}

Placement Placement::m_shape(int p, double fwd, double bwd) {
  std::vector<PlacedBlock> b;
  auto all = all_devices(p);
  b.push_back(make("embed_f", BlockKind::kF, 0, all, fwd, 0, {}));
  // Chain F blocks, then the LM head forward and backward, then chain B blocks.
  std::vector<int> f(p);
  for (int s = 0; s < p; ++s) {
    f[s] = static_cast<int>(b.size());
    b.push_back(make("f" + std::to_string(s), BlockKind::kF, s + 1, {DeviceId(s)}, fwd, 1,
                     {s == 0 ? 0 : f[s - 1]}));
  }
  int head_f = static_cast<int>(b.size());
  b.push_back(make("head_f", BlockKind::kF, p + 1, all, fwd, 1, {f[p - 1]}));
  int prev = static_cast<int>(b.size());
  b.push_back(make("head_b", BlockKind::kB, p + 1, all, bwd, -1, {head_f}));
  for (int s = p - 1; s >= 0; --s) {
    int idx = static_cast<int>(b.size());
    b.push_back(
        make("b" + std::to_string(s), BlockKind::kB, s + 1, {DeviceId(s)}, bwd, -1, {prev, f[s]}));
    prev = idx;
  }
  b.push_back(make("embed_b", BlockKind::kB, 0, all, bwd, 0, {prev}));
  return must(create(p, p, std::move(b)));
}

Placement Placement::k_shape(int p, double fwd, double bwd) {
  LOOM_CHECK(p >= 2) << "the K-shape needs at least 2 devices";
  const int h = p / 2 - 1;
  std::vector<std::vector<DeviceId>> devs;
  for (int s = 0; s < p - 1; ++s) {
    if (s < h)
      devs.push_back({DeviceId(s)});
    else if (s == h)
      devs.push_back({DeviceId(h), DeviceId(h + 1)});
    else
      devs.push_back({DeviceId(s + 1)});
  }
  std::vector<PlacedBlock> b;
  add_chain(b, devs, 0, 0, "", fwd, bwd, {});
  return must(create(p, p, std::move(b)));
}

int Placement::micro_batches_per_instance() const {
  int n = 1;
  for (const auto& b : blocks_) n = std::max(n, b.micro_batch + 1);
  return n;
}

double Placement::load(DeviceId d) const {
  double t = 0;
  for (const auto& b : blocks_)
    for (DeviceId x : b.devices)
      if (x == d) t += b.span;
  return t;
}

Status Placement::validate() const {
  if (devices_ < 1)
    return Error::at("devices", "must be at least 1, got " + std::to_string(devices_));
  if (!(memory_limit_ > 0)) return Error::at("memory_limit", "must be positive");
  if (blocks_.empty()) return Error::at("blocks", "a placement needs at least one block");
  std::map<std::string, int> names;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const auto& b = blocks_[i];
    const std::string who = "block '" + b.name + "'";
    if (b.name.empty()) return Error::at("blocks", "block " + std::to_string(i) + " has no name");
    if (!names.emplace(b.name, static_cast<int>(i)).second)
      return Error::at("blocks", who + " is defined twice");
    if (b.devices.empty()) return Error::at("blocks", who + " runs on no device");
    for (DeviceId d : b.devices)
      if (d.value() < 0 || d.value() >= devices_)
        return Error::at("blocks", who + " runs on device " + d.to_string() + ", outside 0.." +
                                       std::to_string(devices_ - 1));
    if (!(b.span > 0))
      return Error::at("blocks", who + " needs a positive span, got " + fmt(b.span));
    if (b.micro_batch < 0) return Error::at("blocks", who + " has a negative micro_batch");
    for (int a : b.after)
      if (a < 0 || a >= static_cast<int>(blocks_.size()) || a == static_cast<int>(i))
        return Error::at("blocks", who + " has an invalid dependency");
  }
  // Memory balance per device: a steady state only exists if each instance frees what it takes.
  for (int d = 0; d < devices_; ++d) {
    double sum = 0;
    for (const auto& b : blocks_)
      for (DeviceId x : b.devices)
        if (x.value() == d) sum += b.memory;
    if (std::abs(sum) > 1e-9)
      return Error::at("blocks",
                       "the memory of device " + std::to_string(d) + " changes by " + fmt(sum) +
                           " per micro-batch; the blocks on it must free what they allocate");
  }
  LOOM_ASSIGN_OR_RETURN(Workload w, unroll(1));
  (void)w;
  return Status::success();
}

Result<Workload> Placement::unroll(int instances) const {
  if (instances < 1)
    return error("need at least one placement instance, got " + std::to_string(instances));
  const int per = micro_batches_per_instance();
  std::vector<Block> blocks;
  std::vector<std::vector<int>> deps;
  for (int k = 0; k < instances; ++k) {
    for (const auto& pb : blocks_) {
      Block b;
      b.stage = pb.stage;
      b.mb = MicroBatch(static_cast<int64_t>(k) * per + pb.micro_batch);
      b.kind = pb.kind;
      b.devices = pb.devices;
      b.duration = pb.span;
      b.memory = pb.memory;
      b.name = pb.name;
      blocks.push_back(std::move(b));
      std::vector<int> d;
      for (int a : pb.after) d.push_back(unrolled_index(k, a));
      deps.push_back(std::move(d));
    }
  }
  auto w = Workload::create(devices_, std::move(blocks), std::move(deps));
  if (!w.ok()) return Error::at("blocks", w.error().message);
  return w;
}

namespace {

// One entry of a placement file's blocks, as written: the block, the names it comes after and
// whether it gives its stage. YAML conversion errors throw to Placement::parse.
struct WrittenBlock {
  PlacedBlock block;
  std::vector<std::pair<std::string, YAML::Node>> after;
  bool has_stage = false;
};

Result<WrittenBlock> parse_block(const YAML::Node& node, size_t position,
                                 const std::function<std::string(const YAML::Node&)>& where) {
  static const std::vector<std::string> keys = {"name",   "kind",  "devices", "span",
                                                "memory", "after", "stage",   "micro_batch"};
  const std::string at = where(node);
  if (!node.IsMap())
    return Error::at("blocks", at + ": each block is a map such as {name: f0, kind: F, "
                                    "devices: [0], span: 1, memory: 1}");
  for (const auto& kv : node) {
    std::string key = kv.first.as<std::string>();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string hint = closest_match(key, keys);
      return Error::at(key, where(kv.first) + ": block " + std::to_string(position) +
                                ": unknown key '" + key + "'" +
                                (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  }
  if (!node["name"])
    return Error::at("name", at + ": block " + std::to_string(position) + " has no name");
  WrittenBlock out;
  PlacedBlock& b = out.block;
  b.name = node["name"].as<std::string>();
  const std::string who = at + ": block '" + b.name + "'";
  if (!node["kind"]) return Error::at("kind", who + ": missing 'kind' (F, B, I or W)");
  std::string kind = node["kind"].as<std::string>();
  auto k = kind.size() == 1 ? parse_block_kind(kind[0]) : std::nullopt;
  if (!k) return Error::at("kind", who + ": kind must be F, B, I or W, got '" + kind + "'");
  b.kind = *k;
  if (!node["devices"] || !node["devices"].IsSequence())
    return Error::at("devices", who + ": 'devices' must be a list such as [0] or [0, 1]");
  for (const auto& d : node["devices"]) b.devices.push_back(DeviceId(d.as<int>()));
  b.span = node["span"] ? node["span"].as<double>() : 1.0;
  b.memory = node["memory"] ? node["memory"].as<double>() : 0.0;
  b.micro_batch = node["micro_batch"] ? node["micro_batch"].as<int>() : 0;
  out.has_stage = static_cast<bool>(node["stage"]);
  if (node["stage"]) b.stage = StageId(node["stage"].as<int>());
  if (node["after"]) {
    if (!node["after"].IsSequence())
      return Error::at("after", who + ": 'after' must be a list of block names");
    for (const auto& a : node["after"]) out.after.emplace_back(a.as<std::string>(), a);
  }
  return out;
}

// Each block's `after` names as block indices; an unknown name is an error at its line.
Status resolve_after(std::vector<PlacedBlock>& blocks,
                     const std::vector<std::vector<std::pair<std::string, YAML::Node>>>& after,
                     const std::map<std::string, int>& index,
                     const std::function<std::string(const YAML::Node&)>& where) {
  std::vector<std::string> all_names;
  for (const auto& b : blocks) all_names.push_back(b.name);
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (const auto& [name, node] : after[i]) {
      auto it = index.find(name);
      if (it == index.end()) {
        std::string hint = closest_match(name, all_names);
        return Error::at("after", where(node) + ": block '" + blocks[i].name +
                                      "': 'after' names '" + name + "', which is not a block" +
                                      (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
      blocks[i].after.push_back(it->second);
    }
  }
  return Status::success();
}

// Stages: explicit, else the name's trailing number, else the order among blocks of a kind.
void infer_stages(std::vector<PlacedBlock>& blocks, const std::vector<bool>& has_stage) {
  std::map<BlockKind, int> seen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    int count = seen[b.kind]++;
    if (has_stage[i]) continue;
    size_t e = b.name.size(), s = e;
    while (s > 0 && std::isdigit(static_cast<unsigned char>(b.name[s - 1]))) --s;
    b.stage = StageId(s < e && e - s < 9 ? std::stoll(b.name.substr(s)) : count);
  }
}

}  // namespace

Result<Placement> Placement::parse(const std::string& yaml, const std::string& source) {
  const std::function<std::string(const YAML::Node&)> where = [&](const YAML::Node& n) {
    return source + ":" + std::to_string(n.Mark().line + 1);
  };
  try {
    YAML::Node root = YAML::Load(yaml);
    if (!root.IsMap())
      return Error::at(source, source + ": expected a map with devices, memory_limit and blocks");
    static const std::vector<std::string> top = {"devices", "memory_limit", "blocks"};
    for (const auto& kv : root) {
      std::string key = kv.first.as<std::string>();
      if (std::find(top.begin(), top.end(), key) == top.end()) {
        std::string hint = closest_match(key, top);
        return Error::at(key, where(kv.first) + ": unknown key '" + key + "'" +
                                  (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
    }
    if (!root["devices"]) return Error::at("devices", source + ": missing 'devices'");
    if (!root["blocks"] || !root["blocks"].IsSequence())
      return Error::at("blocks", source + ": missing 'blocks' (a list)");
    int devices = root["devices"].as<int>();
    double limit = root["memory_limit"] ? root["memory_limit"].as<double>() : kNoLimit;
    std::vector<PlacedBlock> blocks;
    std::map<std::string, int> index;
    std::vector<std::vector<std::pair<std::string, YAML::Node>>> after_names;
    std::vector<bool> has_stage;
    for (const auto& node : root["blocks"]) {
      LOOM_ASSIGN_OR_RETURN(WrittenBlock written, parse_block(node, blocks.size(), where));
      has_stage.push_back(written.has_stage);
      after_names.push_back(std::move(written.after));
      if (!index.emplace(written.block.name, static_cast<int>(blocks.size())).second)
        return Error::at("name",
                         where(node) + ": block '" + written.block.name + "': defined twice");
      blocks.push_back(std::move(written.block));
    }
    LOOM_TRY(resolve_after(blocks, after_names, index, where));
    infer_stages(blocks, has_stage);
    auto placement = create(devices, limit, std::move(blocks));
    if (!placement.ok())
      return Error::at(placement.error().key, source + ": " + placement.error().message);
    return placement;
  } catch (const YAML::BadConversion& e) {
    return Error::at(source, source + ":" + std::to_string(e.mark.line + 1) +
                                 ": a value has the wrong type (devices, span, memory, stage, "
                                 "micro_batch are numbers; devices and after are lists)");
  } catch (const YAML::Exception& e) {
    return Error::at(source, source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

Result<Placement> Placement::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error::at(path, "cannot read placement file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

std::string Placement::to_yaml() const {
  std::ostringstream os;
  os << "devices: " << devices_ << "\n";
  if (memory_limit_ != kNoLimit) os << "memory_limit: " << memory_limit_ << "\n";
  os << "blocks:\n";
  for (const auto& b : blocks_) {
    os << "  - {name: " << b.name << ", kind: " << to_char(b.kind) << ", devices: [";
    for (size_t i = 0; i < b.devices.size(); ++i) os << (i ? ", " : "") << b.devices[i];
    os << "], span: " << b.span << ", memory: " << b.memory;
    os << ", stage: " << b.stage;
    if (b.micro_batch) os << ", micro_batch: " << b.micro_batch;
    if (!b.after.empty()) {
      os << ", after: [";
      for (size_t i = 0; i < b.after.size(); ++i) os << (i ? ", " : "") << blocks_[b.after[i]].name;
      os << "]";
    }
    os << "}\n";
  }
  return os.str();
}

}  // namespace loom::sched
