#include "core/cost_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/config.h"
#include "core/cost_model_builtin.h"  // generated from configs/cost-model.yaml
#include "core/strings.h"

namespace loom {
namespace {

// The one table of cost-model values; the file reader, the cost.* config keys and the listing
// of known keys all walk it.
struct RealField {
  const char* key;
  double CostModel::*field;
  double CostConfig::*override;  // cost.<key>: 0 keeps the preset's value
  bool required = false;         // every built-in preset sets it (0 means something else)
};
const std::vector<RealField>& real_fields() {
  static const std::vector<RealField> kFields = {
      {"device_flops_per_s", &CostModel::device_flops_per_s, &CostConfig::device_flops_per_s, true},
      {"device_memory_bytes", &CostModel::device_memory_bytes, &CostConfig::device_memory_bytes,
       true},
      {"intra_alpha_s", &CostModel::intra_alpha_s, &CostConfig::intra_alpha_s, true},
      {"intra_beta_s_per_byte", &CostModel::intra_beta_s_per_byte,
       &CostConfig::intra_beta_s_per_byte, true},
      {"inter_alpha_s", &CostModel::inter_alpha_s, &CostConfig::inter_alpha_s, true},
      {"inter_beta_s_per_byte", &CostModel::inter_beta_s_per_byte,
       &CostConfig::inter_beta_s_per_byte, true},
      {"local_beta_s_per_byte", &CostModel::local_beta_s_per_byte,
       &CostConfig::local_beta_s_per_byte, true},
      {"node_flops_per_s", &CostModel::node_flops_per_s, &CostConfig::node_flops_per_s},
      {"intra_send_recv_alpha_s", &CostModel::intra_send_recv_alpha_s,
       &CostConfig::intra_send_recv_alpha_s},
      {"intra_send_recv_beta_s_per_byte", &CostModel::intra_send_recv_beta_s_per_byte,
       &CostConfig::intra_send_recv_beta_s_per_byte},
      {"intra_all_reduce_alpha_s", &CostModel::intra_all_reduce_alpha_s,
       &CostConfig::intra_all_reduce_alpha_s},
      {"intra_all_reduce_beta_s_per_byte", &CostModel::intra_all_reduce_beta_s_per_byte,
       &CostConfig::intra_all_reduce_beta_s_per_byte},
      {"intra_all_gather_alpha_s", &CostModel::intra_all_gather_alpha_s,
       &CostConfig::intra_all_gather_alpha_s},
      {"intra_all_gather_beta_s_per_byte", &CostModel::intra_all_gather_beta_s_per_byte,
       &CostConfig::intra_all_gather_beta_s_per_byte},
      {"intra_reduce_scatter_alpha_s", &CostModel::intra_reduce_scatter_alpha_s,
       &CostConfig::intra_reduce_scatter_alpha_s},
      {"intra_reduce_scatter_beta_s_per_byte", &CostModel::intra_reduce_scatter_beta_s_per_byte,
       &CostConfig::intra_reduce_scatter_beta_s_per_byte},
      {"intra_all_to_all_alpha_s", &CostModel::intra_all_to_all_alpha_s,
       &CostConfig::intra_all_to_all_alpha_s},
      {"intra_all_to_all_beta_s_per_byte", &CostModel::intra_all_to_all_beta_s_per_byte,
       &CostConfig::intra_all_to_all_beta_s_per_byte}};
  return kFields;
}
constexpr const char* kDevicesPerNode = "devices_per_node";

std::string at_line(const std::string& source, const YAML::Node& node) {
  return source + ":" + std::to_string(node.Mark().line + 1);
}

// Reads one model's mapping over the defaults in `m`.
Result<CostModel> read_model(const YAML::Node& map, const std::string& source, CostModel m) {
  if (!map.IsMap())
    return Error::at(source, at_line(source, map) + ": expected a mapping of cost-model keys");
  const std::vector<std::string> known = cost_model_keys();
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      return Error::at(source, at_line(source, kv.first) + ": a key must be a plain name");
    const std::string key = kv.first.Scalar();
    const std::string where = at_line(source, kv.first) + ": " + key;
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::string close = closest_match(key, known);
      return Error::at(
          key, where + ": unknown key" + (close.empty() ? "" : " (did you mean '" + close + "'?)"));
    }
    try {
      if (key == kDevicesPerNode) {
        m.devices_per_node = kv.second.as<int64_t>();
        if (m.devices_per_node < 1) return Error::at(key, where + ": must be positive");
        continue;
      }
      const double value = kv.second.as<double>();
      if (!(value >= 0)) return Error::at(key, where + ": must be zero or positive");
      for (const auto& f : real_fields())
        if (key == f.key) m.*f.field = value;
    } catch (const YAML::Exception&) {
      return Error::at(key, where + ": expected a number");
    }
  }
  return m;
}

Result<YAML::Node> load_yaml(const std::string& yaml, const std::string& source) {
  try {
    return YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return Error::at(source,
                     source + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error::at(path, "cannot read cost model '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

namespace {
struct PrimitiveFields {
  const char* primitive;
  double CostModel::*alpha_s;
  double CostModel::*beta_s_per_byte;
};
const PrimitiveFields* primitive_fields(const std::string& primitive) {
  static const PrimitiveFields kFields[] = {
      {"send_recv", &CostModel::intra_send_recv_alpha_s,
       &CostModel::intra_send_recv_beta_s_per_byte},
      {"all_reduce", &CostModel::intra_all_reduce_alpha_s,
       &CostModel::intra_all_reduce_beta_s_per_byte},
      {"all_gather", &CostModel::intra_all_gather_alpha_s,
       &CostModel::intra_all_gather_beta_s_per_byte},
      {"reduce_scatter", &CostModel::intra_reduce_scatter_alpha_s,
       &CostModel::intra_reduce_scatter_beta_s_per_byte},
      {"all_to_all", &CostModel::intra_all_to_all_alpha_s,
       &CostModel::intra_all_to_all_beta_s_per_byte},
  };
  for (const PrimitiveFields& f : kFields)
    if (primitive == f.primitive) return &f;
  return nullptr;
}
}  // namespace

CostModel::Link CostModel::intra_link(const std::string& primitive) const {
  Link l{intra_alpha_s, intra_beta_s_per_byte};
  if (const PrimitiveFields* f = primitive_fields(primitive)) {
    if (this->*f->alpha_s > 0) l.alpha_s = this->*f->alpha_s;
    if (this->*f->beta_s_per_byte > 0) l.beta_s_per_byte = this->*f->beta_s_per_byte;
  }
  return l;
}

CostModel::Link CostModel::link(const std::string& primitive, bool inter) const {
  return inter ? Link{inter_alpha_s, inter_beta_s_per_byte} : intra_link(primitive);
}

bool CostModel::set_intra_link(const std::string& primitive, const Link& link) {
  const PrimitiveFields* f = primitive_fields(primitive);
  if (f == nullptr) return false;
  this->*f->alpha_s = link.alpha_s;
  this->*f->beta_s_per_byte = link.beta_s_per_byte;
  return true;
}

double CostModel::node_compute_flops_per_s() const {
  const double independent = device_flops_per_s * static_cast<double>(devices_per_node);
  return node_flops_per_s > 0 ? std::min(node_flops_per_s, independent) : independent;
}

std::vector<std::string> cost_model_keys() {
  std::vector<std::string> keys;
  for (const auto& f : real_fields()) keys.push_back(f.key);
  keys.push_back(kDevicesPerNode);
  return keys;
}

std::string cost_model_values(const CostModel& model) {
  std::ostringstream out;
  out.precision(17);
  for (const auto& f : real_fields()) out << f.key << "=" << model.*f.field << "\n";
  out << kDevicesPerNode << "=" << model.devices_per_node << "\n";
  return out.str();
}

Result<CostModel> CostModel::parse(const std::string& yaml, const std::string& source) {
  LOOM_ASSIGN_OR_RETURN(YAML::Node root, load_yaml(yaml, source));
  CostModel m = builtin();
  if (!root.IsNull()) {
    LOOM_ASSIGN_OR_RETURN(m, read_model(root, source, builtin()));
  }
  m.name = source;
  return m;
}

Result<CostModel> CostModel::load(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string text, read_text(path));
  return parse(text, path);
}

namespace {

// A cost-model file's presets, each read over `base` (the built-in file: over an empty model).
Result<CostModelFile> parse_file_over(const std::string& yaml, const std::string& source,
                                      const CostModel& base) {
  LOOM_ASSIGN_OR_RETURN(YAML::Node root, load_yaml(yaml, source));
  if (!root.IsMap())
    return Error::at(source,
                     source + ": expected a mapping (presets: and default:, or cost-model keys)");
  CostModelFile file;
  if (!root["presets"]) {  // one flat model
    LOOM_ASSIGN_OR_RETURN(CostModel m, read_model(root, source, base));
    file.default_preset = "custom";
    file.presets.emplace_back("custom", m);
    return file;
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (key != "presets" && key != "default")
      return Error::at(source, at_line(source, kv.first) + ": unknown key '" + key +
                                   "' (a file of presets has presets: and default:)");
  }
  const YAML::Node presets = root["presets"];
  if (!presets.IsMap() || presets.size() == 0)
    return Error::at(
        source, at_line(source, presets) + ": presets: expected a mapping of named cost models");
  for (const auto& kv : presets) {
    const std::string name = kv.first.Scalar();
    LOOM_ASSIGN_OR_RETURN(CostModel m, read_model(kv.second, source, base));
    file.presets.emplace_back(name, m);
  }
  if (root["default"]) {
    file.default_preset = root["default"].IsScalar() ? root["default"].Scalar() : "";
  } else {
    file.default_preset = file.presets.front().first;
  }
  bool found = false;
  for (const auto& [name, m] : file.presets) found |= name == file.default_preset;
  if (!found)
    return Error::at(source, at_line(source, root["default"]) + ": default: no preset named '" +
                                 file.default_preset + "'");
  return file;
}

}  // namespace

Result<CostModelFile> parse_cost_model_file(const std::string& yaml, const std::string& source) {
  return parse_file_over(yaml, source, CostModel::builtin());
}

const CostModelFile& builtin_cost_models() {
  static const CostModelFile kFile = [] {
    auto f = parse_file_over(kBuiltinCostModelYaml, "configs/cost-model.yaml", CostModel{});
    LOOM_CHECK(f.ok()) << "the built-in cost model does not parse: " << f.error().message;
    // Nothing fills in for a built-in preset: each sets every value a plan divides by.
    for (const auto& [name, m] : f->presets) {
      for (const RealField& field : real_fields())
        LOOM_CHECK(!field.required || m.*field.field > 0)
            << "configs/cost-model.yaml: preset " << name << " does not set " << field.key;
      LOOM_CHECK(m.devices_per_node > 0)
          << "configs/cost-model.yaml: preset " << name << " does not set " << kDevicesPerNode;
    }
    return std::move(f).value();
  }();
  return kFile;
}

const CostModel& CostModel::builtin() {
  static const CostModel kDefault = [] {
    const CostModelFile& file = builtin_cost_models();
    for (const auto& [name, m] : file.presets)
      if (name == file.default_preset) {
        CostModel out = m;
        out.name = name + " from the built-in configs/cost-model.yaml";
        return out;
      }
    LOOM_CHECK(false) << "configs/cost-model.yaml: no default preset";
    return CostModel{};
  }();
  return kDefault;
}

Result<CostModel> resolve_cost_model(const Config& config) {
  const CostConfig& c = config.cost;
  CostModelFile from_file;
  std::string source = "the built-in configs/cost-model.yaml";
  if (!c.file.empty()) {
    auto text = read_text(c.file);
    if (!text.ok()) return config.error("cost.file", text.error().message);
    auto parsed = parse_cost_model_file(*text, c.file);
    if (!parsed.ok()) return config.error("cost.file", parsed.error().message);
    from_file = std::move(parsed).value();
    source = c.file;
  }
  const CostModelFile& file = c.file.empty() ? builtin_cost_models() : from_file;
  const std::string preset = c.preset.empty() ? file.default_preset : c.preset;
  const CostModel* chosen = nullptr;
  std::vector<std::string> names;
  for (const auto& [name, m] : file.presets) {
    names.push_back(name);
    if (name == preset) chosen = &m;
  }
  if (!chosen) {
    std::string msg =
        "no cost-model preset '" + preset + "' in " + source + "; presets: " + join(names, ", ");
    const std::string close = closest_match(preset, names);
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return config.error("cost.preset", msg);
  }
  CostModel m = *chosen;
  m.name = preset + " from " + source;
  std::vector<std::string> changed;
  for (const auto& f : real_fields())
    if (const double v = c.*f.override; v > 0) {
      m.*f.field = v;
      changed.push_back(f.key);
    }
  if (c.devices_per_node > 0) {
    m.devices_per_node = c.devices_per_node;
    changed.push_back(kDevicesPerNode);
  }
  if (!changed.empty()) m.name += " with cost." + join(changed, ", cost.") + " set";
  return m;
}

}  // namespace loom
