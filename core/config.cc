#include "core/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "core/strings.h"

namespace loom {
namespace {

// A check returns "" when the value is acceptable, else what is wrong with it.
template <class T>
using Check = std::function<std::string(const T&)>;

Check<int64_t> positive() {
  return [](const int64_t& v) { return v > 0 ? "" : "must be positive, got " + std::to_string(v); };
}
Check<int64_t> non_negative() {
  return [](const int64_t& v) {
    return v >= 0 ? "" : "must be zero or positive, got " + std::to_string(v);
  };
}
Check<double> positive_real() {
  return [](const double& v) {
    std::ostringstream os;
    os << "must be positive, got " << v;
    return v > 0 ? std::string() : os.str();
  };
}
Check<double> non_negative_real() {
  return [](const double& v) {
    std::ostringstream os;
    os << "must be zero or positive, got " << v;
    return v >= 0 ? std::string() : os.str();
  };
}
Check<std::string> one_of(std::vector<std::string> choices) {
  return [choices](const std::string& v) -> std::string {
    for (const auto& c : choices)
      if (c == v) return "";
    std::string msg = "must be one of " + join(choices, ", ") + "; got '" + v + "'";
    std::string close = closest_match(v, choices);
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return msg;
  };
}
Check<std::string> non_empty() {
  return [](const std::string& v) { return v.empty() ? "must not be empty" : ""; };
}

// The cost model's keys (cost.*), part of the table below.
template <class V>
void visit_cost_fields(Config& c, V& v) {
  v("cost", "preset", c.cost.preset, Check<std::string>());
  v("cost", "file", c.cost.file, Check<std::string>());
  v("cost", "device_flops_per_s", c.cost.device_flops_per_s, non_negative_real());
  v("cost", "device_memory_bytes", c.cost.device_memory_bytes, non_negative_real());
  v("cost", "intra_alpha_s", c.cost.intra_alpha_s, non_negative_real());
  v("cost", "intra_beta_s_per_byte", c.cost.intra_beta_s_per_byte, non_negative_real());
  v("cost", "inter_alpha_s", c.cost.inter_alpha_s, non_negative_real());
  v("cost", "inter_beta_s_per_byte", c.cost.inter_beta_s_per_byte, non_negative_real());
  v("cost", "local_beta_s_per_byte", c.cost.local_beta_s_per_byte, non_negative_real());
  v("cost", "node_flops_per_s", c.cost.node_flops_per_s, non_negative_real());
  v("cost", "intra_send_recv_alpha_s", c.cost.intra_send_recv_alpha_s, non_negative_real());
  v("cost", "intra_send_recv_beta_s_per_byte", c.cost.intra_send_recv_beta_s_per_byte,
    non_negative_real());
  v("cost", "intra_all_reduce_alpha_s", c.cost.intra_all_reduce_alpha_s, non_negative_real());
  v("cost", "intra_all_reduce_beta_s_per_byte", c.cost.intra_all_reduce_beta_s_per_byte,
    non_negative_real());
  v("cost", "intra_all_gather_alpha_s", c.cost.intra_all_gather_alpha_s, non_negative_real());
  v("cost", "intra_all_gather_beta_s_per_byte", c.cost.intra_all_gather_beta_s_per_byte,
    non_negative_real());
  v("cost", "intra_reduce_scatter_alpha_s", c.cost.intra_reduce_scatter_alpha_s,
    non_negative_real());
  v("cost", "intra_reduce_scatter_beta_s_per_byte", c.cost.intra_reduce_scatter_beta_s_per_byte,
    non_negative_real());
  v("cost", "intra_all_to_all_alpha_s", c.cost.intra_all_to_all_alpha_s, non_negative_real());
  v("cost", "intra_all_to_all_beta_s_per_byte", c.cost.intra_all_to_all_beta_s_per_byte,
    non_negative_real());
  v("cost", "devices_per_node", c.cost.devices_per_node, non_negative());
}

// The data's and validation's keys (data.*, eval.*), part of the table below.
template <class V>
void visit_data_fields(Config& c, V& v) {
  v("data", "type", c.data.type, one_of({"synthetic", "tokens", "indexed"}));
  v("data", "path", c.data.path, Check<std::string>());
  v("data", "token_bytes", c.data.token_bytes, Check<int64_t>([](int64_t b) {
      if (b == 2 || b == 4) return std::string();
      return "must be 2 (uint16 ids) or 4 (uint32 ids), got " + std::to_string(b);
    }));
  v("data", "blend", c.data.blend, Check<std::vector<BlendEntry>>([](const auto& blend) {
      for (size_t i = 0; i < blend.size(); ++i) {
        if (!(blend[i].weight > 0) || !std::isfinite(blend[i].weight))
          return "entry " + std::to_string(i) + ": the weight must be a positive number";
        if (blend[i].path.empty()) return "entry " + std::to_string(i) + ": no dataset prefix";
      }
      return std::string();
    }));
  v("data", "seed", c.data.seed, Check<int64_t>([](int64_t s) {
      return s >= -1 ? std::string() : "must be -1 (run.seed) or a seed, got " + std::to_string(s);
    }));
  v("data", "shuffle", c.data.shuffle, Check<bool>());

  v("eval", "every", c.eval.every, non_negative());
  v("eval", "steps", c.eval.steps, positive());
  v("eval", "data", c.eval.data, Check<std::string>());
  v("eval", "split", c.eval.split, Check<double>([](double f) {
      std::ostringstream os;
      os << "must be a fraction of the documents in [0, 1), got " << f;
      return f >= 0 && f < 1 ? std::string() : os.str();
    }));
}

// parallel.*, a section of the one table of config fields (visit_fields).
template <class V>
void visit_parallel_fields(Config& c, V& v) {
  v("parallel", "dp", c.parallel.dp, positive());
  v("parallel", "tp", c.parallel.tp, positive());
  v("parallel", "pp", c.parallel.pp, positive());
  v("parallel", "cp", c.parallel.cp, positive());
  // p2p (ring: the same) lays the sequence in zigzag order (planner/context_parallel.h),
  // p2p-contiguous in order.
  v("parallel", "cp_kind", c.parallel.cp_kind,
    one_of({"p2p", "ring", "p2p-contiguous", "all-to-all"}));
  v("parallel", "ep", c.parallel.ep, positive());
  v("parallel", "sp", c.parallel.sp, Check<bool>());
  v("parallel", "schedule", c.parallel.schedule,
    one_of({"gpipe", "1f1b", "interleaved", "chimera", "looped-bfs", "zb-h1", "search", "search-zb",
            "csv"}));
  v("parallel", "schedule_csv", c.parallel.schedule_csv, Check<std::string>());
  v("parallel", "chunks", c.parallel.chunks, positive());
  v("parallel", "policy", c.parallel.policy, non_empty());
  v("parallel", "recompute", c.parallel.recompute, one_of({"none", "selective", "full"}));
  v("parallel", "zero", c.parallel.zero, Check<int64_t>([](int64_t z) {
      if (z == 0 || z == 1 || z == 3) return std::string();
      return "must be 0, 1 or 3, got " + std::to_string(z);
    }));
  v("parallel", "stages", c.parallel.stages, Check<std::vector<std::vector<int64_t>>>());
  v("parallel", "memory_limit_gb", c.parallel.memory_limit_gb, non_negative_real());
}

// The one table of config fields. Reading, writing and the list of known keys all walk it.
template <class V>
void visit_fields(Config& c, V& v) {
  v("run", "name", c.run.name, non_empty());
  v("run", "output_dir", c.run.output_dir, non_empty());
  v("run", "seed", c.run.seed, non_negative());
  v("run", "steps", c.run.steps, positive());
  v("run", "device", c.run.device, one_of({"cpu", "cuda"}));
  v("run", "precision", c.run.precision, one_of({"fp32", "bf16", "fp8"}));
  v("run", "deterministic", c.run.deterministic, Check<bool>());
  v("run", "overwrite", c.run.overwrite, Check<bool>());
  v("fp8", "scaling", c.fp8.scaling, one_of({"tensorwise", "rowwise"}));

  v("model", "type", c.model.type, non_empty());
  v("model", "preset", c.model.preset, non_empty());
  v("model", "from_hf", c.model.from_hf, Check<std::string>());

  visit_parallel_fields(c, v);

  v("batch", "global", c.batch.global, positive());
  v("batch", "micro", c.batch.micro, positive());

  v("optimizer", "type", c.optimizer.type, one_of({"adamw", "sgd"}));
  v("optimizer", "lr", c.optimizer.lr, positive_real());
  v("optimizer", "betas", c.optimizer.betas, Check<std::vector<double>>([](const auto& b) {
      if (b.size() != 2) return std::string("must be a list of two numbers, e.g. [0.9, 0.999]");
      for (double x : b)
        if (!(x >= 0 && x < 1)) return std::string("each beta must be in [0, 1)");
      return std::string();
    }));
  v("optimizer", "eps", c.optimizer.eps, positive_real());
  v("optimizer", "weight_decay", c.optimizer.weight_decay, non_negative_real());
  v("optimizer", "momentum", c.optimizer.momentum, non_negative_real());
  v("optimizer", "clip_grad_norm", c.optimizer.clip_grad_norm, non_negative_real());
  v("optimizer", "warmup_steps", c.optimizer.warmup_steps, non_negative());
  v("optimizer", "schedule", c.optimizer.schedule, one_of({"constant", "cosine", "linear"}));
  v("optimizer", "min_lr", c.optimizer.min_lr, non_negative_real());

  visit_data_fields(c, v);

  v("logging", "every", c.logging.every, positive());
  v("logging", "level", c.logging.level, one_of({"debug", "info", "warn", "error"}));
  v("logging", "tensorboard", c.logging.tensorboard, Check<std::string>());
  v("logging", "trace_steps", c.logging.trace_steps,
    Check<std::vector<int64_t>>([](const std::vector<int64_t>& steps) {
      for (int64_t s : steps)
        if (s < 1)
          return "each step must be positive (steps count from 1), got " + std::to_string(s);
      return std::string();
    }));

  v("comm", "backend", c.comm.backend, one_of({"auto", "gloo", "mpi", "nccl", "local"}));
  v("comm", "timeout_s", c.comm.timeout_s, positive_real());
  v("comm", "bucket_mb", c.comm.bucket_mb, positive_real());
  v("comm", "shared_memory", c.comm.shared_memory, Check<bool>());

  v("checkpoint", "dir", c.checkpoint.dir, Check<std::string>());
  v("checkpoint", "every", c.checkpoint.every, non_negative());
  v("checkpoint", "keep", c.checkpoint.keep, positive());
  v("checkpoint", "async", c.checkpoint.async, Check<bool>());
  v("checkpoint", "resume", c.checkpoint.resume, non_empty());
  v("checkpoint", "init_from", c.checkpoint.init_from, Check<std::string>());
  visit_cost_fields(c, v);
}

std::string type_name(const int64_t*) { return "an integer"; }
std::string type_name(const double*) { return "a number"; }
std::string type_name(const bool*) { return "true or false"; }
std::string type_name(const std::string*) { return "a string"; }
std::string type_name(const std::vector<double>*) { return "a list of numbers"; }
std::string type_name(const std::vector<int64_t>*) { return "a list of integers, e.g. [3, 10]"; }
std::string type_name(const std::vector<BlendEntry>*) {
  return "a list of [weight, PREFIX] pairs, e.g. [[0.7, data/web], [0.3, data/code]]";
}
std::string type_name(const std::vector<std::vector<int64_t>>*) {
  return "a list of [first, last] layer pairs";
}

// An empty value (`key:`, `~`, `null`, `key=`) is the empty string for a text key, which the
// key's check then judges; for any other key it is no value, and refused rather than read as
// the default.
template <class T>
bool decode(const YAML::Node& node, T& out) {
  try {
    if constexpr (std::is_same_v<T, std::string>) {
      if (node.IsNull()) {
        out.clear();
        return true;
      }
      if (!node.IsScalar()) return false;
      out = node.Scalar();
    } else if constexpr (std::is_same_v<T, std::vector<BlendEntry>>) {
      if (!node.IsSequence()) return false;
      out.clear();
      for (const auto& entry : node) {
        if (!entry.IsSequence() || entry.size() != 2 || !entry[0].IsScalar() ||
            !entry[1].IsScalar())
          return false;
        out.push_back(BlendEntry{entry[0].as<double>(), entry[1].Scalar()});
      }
    } else if constexpr (std::is_same_v<T, std::vector<double>> ||
                         std::is_same_v<T, std::vector<int64_t>> ||
                         std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
      if (!node.IsSequence()) return false;
      out = node.as<T>();
    } else {
      if (!node.IsScalar()) return false;
      out = node.as<T>();
    }
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "an empty value";
}

std::string line_of(const std::string& source, const YAML::Node& node) {
  return source + ":" + std::to_string(node.Mark().line + 1);
}

// Where `key: value` of a mapping is: the value's line, or the key's when the value is empty
// (an empty value's mark is that of the token after it, often on the next line).
std::string entry_line(const std::string& source, const YAML::Node& key, const YAML::Node& value) {
  return line_of(source, value.IsNull() ? key : value);
}

// The key node of `name` in `map`, for entry_line; `name` is there.
YAML::Node key_of(const YAML::Node& map, const std::string& name) {
  for (const auto& kv : map)
    if (kv.first.Scalar() == name) return kv.first;
  return YAML::Node();
}

struct Reader {
  const YAML::Node& root;
  Config& config;
  const std::map<std::string, std::string>& override_where;
  std::optional<Error> error;

  template <class T>
  void operator()(const char* section, const char* key, T& field, const Check<T>& check) {
    if (error) return;
    std::string full = std::string(section) + "." + key;
    YAML::Node sec = root[section];
    // Undefined when the key is not given (a plain YAML::Node() is a given null).
    YAML::Node node = sec ? sec[key] : YAML::Node(YAML::NodeType::Undefined);
    if (!node) {
      config.where_[full] = "default";
    } else {
      auto o = override_where.find(full);
      config.where_[full] =
          o != override_where.end() ? o->second : entry_line(config.source, key_of(sec, key), node);
      T value{};
      if (!decode(node, value)) {
        error = config.error(full, "expected " + type_name(&field) + ", got " + describe(node));
        return;
      }
      field = std::move(value);
    }
    if (check) {
      std::string problem = check(field);
      if (!problem.empty()) error = config.error(full, problem);
    }
  }
};

struct Writer {
  YAML::Node root;
  template <class T>
  void operator()(const char* section, const char* key, T& field, const Check<T>&) {
    if constexpr (std::is_same_v<T, std::vector<BlendEntry>>) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const BlendEntry& e : field) {
        YAML::Node pair(YAML::NodeType::Sequence);
        pair.push_back(e.weight);
        pair.push_back(e.path);
        pair.SetStyle(YAML::EmitterStyle::Flow);
        list.push_back(pair);
      }
      root[section][key] = list;
    } else {
      root[section][key] = field;
    }
  }
};

struct KeyLister {
  std::vector<std::string> keys;
  template <class T>
  void operator()(const char* section, const char* key, T&, const Check<T>&) {
    keys.push_back(std::string(section) + "." + key);
  }
};

std::vector<std::string> sections() {
  return {"run",  "fp8",  "model",   "parallel", "batch",      "optimizer",
          "data", "eval", "logging", "comm",     "checkpoint", "cost"};
}

// Rejects keys the loader does not know, suggesting the closest known one.
Status check_unknown_keys(const YAML::Node& root, const Config& config,
                          const std::vector<std::string>& known) {
  std::set<std::string> known_set(known.begin(), known.end());
  // A complex key (`? {a: 1}: ...`) is no name; reading it as text would throw.
  auto not_a_name = [&](const YAML::Node& key) {
    return Error::at(config.source, line_of(config.source, key) +
                                        ": a key must be a plain name, got " + describe(key));
  };
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) return not_a_name(kv.first);
    std::string sec = kv.first.as<std::string>();
    auto secs = sections();
    if (std::find(secs.begin(), secs.end(), sec) == secs.end()) {
      std::string msg = line_of(config.source, kv.first) + ": unknown section '" + sec + "'";
      std::string close = closest_match(sec, secs);
      if (!close.empty()) msg += " (did you mean '" + close + "'?)";
      return Error::at(sec, msg);
    }
    if (kv.second.IsNull()) continue;
    if (!kv.second.IsMap())
      return Error::at(sec, line_of(config.source, kv.second) + ": " + sec +
                                ": expected a mapping of keys, got " + describe(kv.second));
    for (const auto& field : kv.second) {
      if (!field.first.IsScalar()) return not_a_name(field.first);
      std::string full = sec + "." + field.first.as<std::string>();
      if (full == "model.args") {
        if (!field.second.IsNull() && !field.second.IsMap())
          return Error::at(full, line_of(config.source, field.second) +
                                     ": model.args: expected a mapping, got " +
                                     describe(field.second));
        for (const auto& arg : field.second)
          if (!arg.first.IsScalar()) return not_a_name(arg.first);
        continue;
      }
      if (known_set.count(full)) continue;
      std::vector<std::string> candidates = known;
      candidates.push_back("model.args");
      std::string msg = line_of(config.source, field.first) + ": unknown key '" + full + "'";
      std::string close = closest_match(full, candidates);
      if (!close.empty()) msg += " (did you mean '" + close + "'?)";
      return Error::at(full, msg);
    }
  }
  return Status::success();
}

// A mapping that names a key twice: yaml-cpp's lookup would keep the first and drop the other
// without a word. `prefix` is what names the mapping's keys in the message ("run.").
Status check_no_repeats(const YAML::Node& map, const std::string& prefix,
                        const std::string& source) {
  std::map<std::string, int> first_line;
  for (const auto& kv : map) {
    const std::string name = prefix + kv.first.Scalar();
    const int line = kv.first.Mark().line + 1;
    auto [first, fresh] = first_line.emplace(name, line);
    if (!fresh)
      return Error::at(name, source + ":" + std::to_string(line) + ": " + name +
                                 ": given twice, on lines " + std::to_string(first->second) +
                                 " and " + std::to_string(line) +
                                 " (only the first would be read)");
  }
  return Status::success();
}

// Sections, the keys of each and model.args, each named once. Runs after check_unknown_keys,
// which makes every key a plain name.
Status check_repeated_keys(const YAML::Node& root, const std::string& source) {
  LOOM_TRY(check_no_repeats(root, "", source));
  for (const auto& kv : root) {
    const YAML::Node& section = kv.second;
    if (!section.IsMap()) continue;
    const std::string name = kv.first.Scalar();
    LOOM_TRY(check_no_repeats(section, name + ".", source));
    if (name == "model" && section["args"] && section["args"].IsMap())
      LOOM_TRY(check_no_repeats(section["args"], "model.args.", source));
  }
  return Status::success();
}

// Applies "a.b=c" overrides to the YAML tree; records each key's origin.
Status apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                       const std::vector<std::string>& known,
                       std::map<std::string, std::string>& where) {
  for (const auto& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0)
      return Error::at(text, "override '" + text + "' is not of the form key=value");
    std::string key(trim(text.substr(0, eq)));
    std::string value(trim(text.substr(eq + 1)));
    auto parts = split(key, '.');
    // model.args.NAME, or model.args.GROUP.NAME for a nested mapping (model.args.moe.experts).
    bool is_arg = (parts.size() == 3 || parts.size() == 4) && parts[0] == "model" &&
                  parts[1] == "args" &&
                  std::none_of(parts.begin() + 2, parts.end(),
                               [](const std::string& x) { return x.empty(); });
    if (!is_arg && std::find(known.begin(), known.end(), key) == known.end()) {
      std::string msg = "command line override '" + text + "': unknown key '" + key + "'";
      std::string close = closest_match(key, known);
      if (!close.empty()) msg += " (did you mean '" + close + "'?)";
      return Error::at(key, msg);
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception&) {
      parsed = YAML::Node(value);
    }
    if (!root[parts[0]] || !root[parts[0]].IsMap())
      root[parts[0]] = YAML::Node(YAML::NodeType::Map);
    if (is_arg) {
      YAML::Node sec = root[parts[0]];
      if (!sec["args"] || !sec["args"].IsMap()) sec["args"] = YAML::Node(YAML::NodeType::Map);
      YAML::Node args = sec["args"];
      if (parts.size() == 4) {
        if (!args[parts[2]] || !args[parts[2]].IsMap())
          args[parts[2]] = YAML::Node(YAML::NodeType::Map);
        YAML::Node group = args[parts[2]];
        group[parts[3]] = parsed;
      } else {
        args[parts[2]] = parsed;
      }
    } else {
      YAML::Node sec = root[parts[0]];
      sec[parts[1]] = parsed;
    }
    where[key] = "command line (" + text + ")";
  }
  return Status::success();
}

Error malformed_yaml(const std::string& source, const YAML::Exception& e) {
  const std::string at = e.mark.is_null() ? source : source + ":" + std::to_string(e.mark.line + 1);
  return Error::at(source, at + ": malformed YAML: " + e.msg);
}

// The events of a YAML text, document by document: notes where a second document with content
// begins, and a parser that no longer moves (yaml-cpp makes empty documents at one place
// forever after some malformed text, such as a `,` at block level, which is why
// YAML::LoadAll is not used).
class DocumentWalk : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> second;  // the first content of the second document
  std::optional<YAML::Mark> stuck;   // where a document began where the one before did

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (start_ && start_->pos == mark.pos) stuck = mark;
    start_ = mark;
    ++documents_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { content(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    content(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    content(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    content(mark);
  }
  void OnMapEnd() override {}

 private:
  void content(const YAML::Mark& mark) {
    if (documents_ > 1 && !second) second = mark;
  }
  std::optional<YAML::Mark> start_;
  int documents_ = 0;
};

// A config is one YAML document: the text after a second `---` would be dropped by a load, so
// a second document with content is refused (an empty one loses nothing).
Status check_one_document(const std::string& yaml, const std::string& source) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentWalk walk;
  try {
    while (!walk.second && !walk.stuck && parser.HandleNextDocument(walk)) {
    }
  } catch (const YAML::Exception& e) {
    return malformed_yaml(source, e);
  }
  if (walk.stuck)
    return Error::at(source, source + ":" + std::to_string(walk.stuck->line + 1) +
                                 ": malformed YAML: the text from here on cannot be read");
  if (walk.second)
    return Error::at(source, source + ":" + std::to_string(walk.second->line + 1) +
                                 ": a second YAML document (after `---`); a config is one "
                                 "document, so move these sections into the first");
  return Status::success();
}

// The YAML document of `yaml` as a mapping of sections.
Result<YAML::Node> parse_document(const std::string& yaml, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return malformed_yaml(source, e);
  }
  LOOM_TRY(check_one_document(yaml, source));
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    return Error::at(source,
                     source + ": expected a mapping of sections (run, model, parallel, ...)");
  return root;
}

// model.args as text, each value's origin recorded. A nested mapping (moe: {experts: 8}) is
// read as keys "moe.experts"; deeper nesting and lists are refused.
Status read_model_args(const YAML::Node& root,
                       const std::map<std::string, std::string>& override_where, Config& config) {
  YAML::Node args = root["model"] ? root["model"]["args"] : YAML::Node();
  if (!args || !args.IsMap()) return Status::success();
  auto read = [&](const std::string& name, const YAML::Node& key, const YAML::Node& value,
                  bool nested) -> Status {
    std::string full = "model.args." + name;
    auto o = override_where.find(full);
    config.where_[full] =
        o != override_where.end() ? o->second : entry_line(config.source, key, value);
    if (value.IsMap() && !nested) return Status::success();
    if (!value.IsScalar())
      return config.error(full, "expected a single value, got " + describe(value));
    config.model.args[name] = value.Scalar();
    return Status::success();
  };
  for (const auto& kv : args) {
    const std::string name = kv.first.as<std::string>();
    LOOM_TRY(read(name, kv.first, kv.second, false));
    if (!kv.second.IsMap()) continue;
    for (const auto& inner : kv.second)
      LOOM_TRY(read(name + "." + inner.first.as<std::string>(), inner.first, inner.second, true));
  }
  return Status::success();
}

// data.* and eval.* together: what reads which file.
Status check_data(const Config& config) {
  const DataConfig& d = config.data;
  const EvalConfig& e = config.eval;
  if (d.type == "tokens" && d.path.empty())
    return config.error("data.path", "data.type is 'tokens' but no data.path is given");
  if (d.type == "indexed" && d.path.empty() && d.blend.empty())
    return config.error("data.path",
                        "data.type is 'indexed' but neither data.path (a dataset PREFIX, its "
                        "PREFIX.bin and PREFIX.idx) nor data.blend is given");
  if (d.type == "indexed" && !d.path.empty() && !d.blend.empty())
    return config.error("data.blend",
                        "data.path and data.blend are both given; a blend names every dataset");
  if (d.type == "synthetic" && !d.path.empty())
    return config.error("data.path",
                        "a data file is given but data.type is 'synthetic', which reads none; set "
                        "data.type: tokens (a flat token file) or indexed (PREFIX.bin/.idx)");
  if (d.type != "indexed" && !d.blend.empty())
    return config.error("data.blend",
                        "data.blend mixes indexed datasets; data.type is '" + d.type + "'");
  const bool asked = !e.data.empty() || e.split > 0;
  if (e.every == 0 && asked)
    return config.error(e.data.empty() ? "eval.split" : "eval.data",
                        "validation data is given but eval.every is 0; set eval.every to the "
                        "steps between validations");
  if (!e.data.empty() && e.split > 0)
    return config.error("eval.split",
                        "eval.data and eval.split are both given; validate on one of them");
  if (e.every > 0 && d.type == "synthetic" && asked)
    return config.error(e.data.empty() ? "eval.split" : "eval.data",
                        "data.type synthetic validates on synthetic samples of their own; "
                        "eval.data and eval.split need data.type tokens or indexed");
  if (e.every > 0 && d.type == "tokens" && e.split > 0)
    return config.error("eval.split",
                        "eval.split holds out documents of an indexed dataset; a flat token file "
                        "has none (give eval.data, a token file of its own)");
  if (e.every > 0 && d.type != "synthetic" && !asked)
    return config.error("eval.every",
                        "eval.every is set but there is no validation data: give eval.data (a "
                        "dataset of its own) or eval.split (a fraction of the documents held out)");
  return Status::success();
}

// Relations between keys, once each key is valid on its own.
Status check_relations(const Config& config) {
  const auto& b = config.batch;
  const auto& p = config.parallel;
  int64_t product = 0;
  if (__builtin_mul_overflow(p.dp, p.tp, &product) ||
      __builtin_mul_overflow(product, p.pp, &product) ||
      __builtin_mul_overflow(product, p.cp, &product) ||
      __builtin_mul_overflow(b.micro, p.dp, &product))
    return config.error("parallel.dp",
                        "parallel.dp x cp x tp x pp, or batch.micro x parallel.dp, is too large");
  if (b.global % (b.micro * p.dp) != 0)
    return config.error("batch.global", "batch.global (" + std::to_string(b.global) +
                                            ") must be divisible by batch.micro (" +
                                            std::to_string(b.micro) + ") x parallel.dp (" +
                                            std::to_string(p.dp) + ")");
  if (p.dp % p.ep != 0)
    return config.error("parallel.ep", "expert parallelism " + std::to_string(p.ep) +
                                           " is carved out of the data-parallel ranks and must "
                                           "divide parallel.dp (" +
                                           std::to_string(p.dp) + ")");
  // Sequence parallelism splits over the tensor-parallel ranks what tp leaves replicated.
  if (p.sp && p.tp == 1)
    return config.error("parallel.sp",
                        "sequence parallelism needs parallel.tp > 1; parallel.tp is 1 (" +
                            config.where("parallel.tp") + ")");
  LOOM_TRY(check_data(config));
  if (config.run.overwrite && config.checkpoint.resume != "none")
    return config.error("run.overwrite",
                        "run.overwrite starts the run over, but checkpoint.resume continues one");
  if (p.schedule == "csv" && p.schedule_csv.empty())
    return config.error("parallel.schedule_csv",
                        "parallel.schedule is 'csv' but no parallel.schedule_csv file is given");
  if (p.schedule != "csv" && !p.schedule_csv.empty())
    return config.error("parallel.schedule_csv",
                        "a schedule file is given but parallel.schedule is '" + p.schedule +
                            "'; set parallel.schedule: csv to run it");
  for (size_t i = 0; i < p.stages.size(); ++i)
    if (p.stages[i].size() != 2)
      return config.error("parallel.stages",
                          "entry " + std::to_string(i) + " must be [first_layer, last_layer]");
  return Status::success();
}

}  // namespace

std::string ParallelConfig::degrees() const {
  std::string out = "parallel.dp (" + std::to_string(dp) + ")";
  if (ep > 1) out += " (parallel.ep " + std::to_string(ep) + " within)";
  if (cp > 1) out += " x parallel.cp (" + std::to_string(cp) + ")";
  return out + " x parallel.tp (" + std::to_string(tp) + ") x parallel.pp (" + std::to_string(pp) +
         ")";
}

std::string Config::where(const std::string& key) const {
  auto it = where_.find(key);
  if (it != where_.end()) return it->second;
  return source.empty() ? "config" : source;
}

Error Config::error(const std::string& key, const std::string& message) const {
  return Error{where(key) + ": " + key + ": " + message, key};
}

Error Config::locate(Error error) const {
  if (error.key.empty()) return error;
  if (error.message.rfind(where(error.key) + ": ", 0) == 0) return error;  // located already
  return this->error(error.key, error.message);
}

std::vector<std::string> known_config_keys() {
  Config c;
  KeyLister lister;
  visit_fields(c, lister);
  return lister.keys;
}

Result<Config> parse_config(const std::string& yaml, const std::string& source,
                            const std::vector<std::string>& overrides) {
  Config config;
  config.source = source;
  config.overrides = overrides;
  LOOM_ASSIGN_OR_RETURN(YAML::Node root, parse_document(yaml, source));

  const std::vector<std::string> known = known_config_keys();
  LOOM_TRY(check_unknown_keys(root, config, known));
  LOOM_TRY(check_repeated_keys(root, source));
  std::map<std::string, std::string> override_where;
  LOOM_TRY(apply_overrides(root, overrides, known, override_where));

  Reader reader{root, config, override_where, std::nullopt};
  visit_fields(config, reader);
  if (reader.error) return *reader.error;
  LOOM_TRY(read_model_args(root, override_where, config));
  LOOM_TRY(check_relations(config));
  return config;
}

Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return Error::at(path, "cannot read config file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  // A file with no sections (0 bytes, only comments, or a bare `~`) is a mistake, not a request
  // for every default: training GPT tiny on defaults would hide it.
  // A second document or unreadable text after an empty first one is parse_config's to report.
  bool empty = false;
  try {
    empty = YAML::Load(text.str()).IsNull() && check_one_document(text.str(), path).ok();
  } catch (const YAML::Exception&) {
    // parse_config reports the malformed YAML with its line.
  }
  if (empty)
    return Error::at(path, path +
                               ": the config is empty (no sections such as run, model, "
                               "parallel); write at least `model: {type: gpt}`");
  return parse_config(text.str(), path, overrides);
}

std::string to_yaml(const Config& config) {
  Config copy = config;
  Writer writer;
  visit_fields(copy, writer);
  if (!config.model.args.empty()) {
    YAML::Node model = writer.root["model"];
    for (const auto& [k, v] : config.model.args) model["args"][k] = YAML::Load(v);
  }
  YAML::Emitter out;
  out << writer.root;
  return std::string(out.c_str()) + "\n";
}

// ---- ModelArgs ----

namespace {
template <class T>
Result<T> get_arg(const Config& config, const std::string& name, T fallback, const char* what) {
  auto it = config.model.args.find(name);
  if (it == config.model.args.end()) return fallback;
  try {
    return YAML::Load(it->second).as<T>();
  } catch (const YAML::Exception&) {
    return config.error("model.args." + name,
                        std::string("expected ") + what + ", got '" + it->second + "'");
  }
}
}  // namespace

Result<int64_t> ModelArgs::get_int(const std::string& name, int64_t fallback) const {
  return get_arg<int64_t>(config_, name, fallback, "an integer");
}
Result<double> ModelArgs::get_double(const std::string& name, double fallback) const {
  return get_arg<double>(config_, name, fallback, "a number");
}
Result<bool> ModelArgs::get_bool(const std::string& name, bool fallback) const {
  return get_arg<bool>(config_, name, fallback, "true or false");
}
Result<std::string> ModelArgs::get_string(const std::string& name,
                                          const std::string& fallback) const {
  auto it = config_.model.args.find(name);
  return it == config_.model.args.end() ? fallback : it->second;
}

Status ModelArgs::check_known(const std::vector<std::string>& known) const {
  for (const auto& [name, value] : config_.model.args) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string msg = "unknown argument for model '" + config_.model.type + "'";
    std::string close = closest_match(name, known);
    if (!close.empty()) msg += " (did you mean 'model.args." + close + "'?)";
    msg += "; known: " + join(known, ", ");
    return config_.error("model.args." + name, msg);
  }
  return Status::success();
}

}  // namespace loom
