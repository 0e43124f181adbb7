#include "launch/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "checkpoint/hf_names.h"
#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/durable_file.h"
#include "models/gpt.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "models/model.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

// A loom parameter and its place in a Hugging Face tensor.
struct Part {
  std::string name;
  Shape shape;
  HfSource src;
};

// One Hugging Face tensor of the export: its shape and the parameters that make it; rows from
// `tail_from` on (GPT-2's positions past the run's seq) come from the imported folder's
// `tail_tensor`, which the run never held and so never changed.
struct HfTensor {
  Shape shape;
  std::vector<Part> parts;
  std::string tail_tensor;
  int64_t tail_from = 0;
};

// The Hugging Face folder the run was made from: checkpoint.init_from (its weights and
// config.json), else model.from_hf (config.json alone, the weights were loom's own).
struct Imported {
  std::optional<HfFolder> weights;
  nlohmann::json config;  // null: none could be read
};

// The rows of a loom parameter a Hugging Face tensor with `more_rows` gets from the checkpoint:
// the parameter's own (GPT-2's position table holds the run's seq positions; add_tails appends
// the imported folder's others).
Shape exported_shape(const HfSource& src, const Shape& loom) {
  Shape s = src.shape;
  if (src.more_rows) s[0] = src.transposed ? loom[1] : loom[0];
  return s;
}

// The folder the run imported, as far as it can still be read; what cannot is said in `note`
// (the export then writes what the run held: its seq positions, loom's own token ids).
Imported read_imported(const Config& config, std::string* note) {
  Imported out;
  auto say = [&](const std::string& what) {
    if (note) *note += (note->empty() ? "" : "; ") + what;
  };
  if (!config.checkpoint.init_from.empty()) {
    auto folder = HfFolder::open(config.checkpoint.init_from);
    if (folder.ok())
      out.weights = std::move(*folder);
    else
      say("checkpoint.init_from cannot be read (" + folder.error().message +
          "): the export has the run's positions alone and no token ids of the folder");
  }
  std::string text;
  if (out.weights) {
    text = out.weights->config_text();
  } else if (!config.model.from_hf.empty()) {
    auto read = read_whole_file(fs::path(config.model.from_hf) / "config.json");
    if (read.ok())
      text = *read;
    else
      say("model.from_hf cannot be read (" + read.error().message +
          "): the export has no token ids of the folder");
  }
  if (!text.empty()) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.config = std::move(j);
  }
  return out;
}

// Rows past the run's of each tensor the map lets hold more rows (GPT-2's wpe), from the
// imported weights, so the export keeps the folder's n_positions.
void add_tails(std::map<std::string, HfTensor>& tensors, const Imported& imported,
               const HfNameMap& names) {
  if (!imported.weights) return;
  for (auto& [name, t] : tensors) {
    if (t.parts.size() != 1 || !t.parts[0].src.more_rows || t.parts[0].src.transposed) continue;
    const std::string there = imported.weights->resolve(name, names.base_prefix);
    auto found = imported.weights->find(there);
    if (!found.ok()) continue;
    const Shape& have = found->second.shape;
    if (have.size() != t.shape.size() || have[0] <= t.shape[0] ||
        !std::equal(have.begin() + 1, have.end(), t.shape.begin() + 1))
      continue;
    t.tail_tensor = there;
    t.tail_from = t.shape[0];
    t.shape[0] = have[0];
  }
}

// The config.json loom writes for the run, with what the run took over unchanged from the folder
// it imported: the token ids (loom has none of its own) and the positions (n_positions as the
// exported wpe's rows; Llama's max_position_embeddings where its weights were imported).
Result<std::string> exported_config(const Config& config, const Imported& imported,
                                    const std::map<std::string, HfTensor>& tensors) {
  LOOM_ASSIGN_OR_RETURN(std::string text, models::hf_config_json(config));
  if (!imported.config.is_object()) return text;
  nlohmann::json j = nlohmann::json::parse(text);
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (imported.config.contains(id)) j[id] = imported.config[id];
  for (const auto& [name, t] : tensors)
    if (!t.tail_tensor.empty() && j.contains("n_positions")) j["n_positions"] = t.shape[0];
  const char* llama_positions = "max_position_embeddings";
  if (imported.weights && j.contains(llama_positions) &&
      imported.config.contains(llama_positions) &&
      imported.config[llama_positions].is_number_integer() &&
      imported.config[llama_positions].get<int64_t>() > j[llama_positions].get<int64_t>())
    j[llama_positions] = imported.config[llama_positions];
  return j.dump(2) + "\n";
}

// The model's vocabulary: the rows export-hf writes of an embedding padded for tensor
// parallelism.
Result<int64_t> model_vocab(const Config& config) {
  if (config.model.type == "gpt") {
    LOOM_ASSIGN_OR_RETURN(models::GptSpec spec, models::gpt_spec(config));
    return spec.vocab;
  }
  LOOM_ASSIGN_OR_RETURN(models::LlamaSpec spec, models::llama_spec(config));
  return spec.vocab;
}

// Which parameters make which Hugging Face tensor, from the checkpoint's manifest alone.
Result<std::map<std::string, HfTensor>> plan_tensors(const CheckpointReader& reader,
                                                     const Config& config, const HfNameMap& names) {
  LOOM_ASSIGN_OR_RETURN(int64_t vocab, model_vocab(config));
  std::map<std::string, HfTensor> out;
  for (const std::string& name : reader.tensors(kSliceParam)) {
    LOOM_ASSIGN_OR_RETURN(auto desc, reader.describe(name, kSliceParam));
    const auto& [shape, dtype] = desc;
    if (dtype != "F32")
      return Error::at(name, "parameter '" + name + "' is stored as " + dtype +
                                 "; export-hf reads float32 parameters");
    LOOM_ASSIGN_OR_RETURN(HfSource src, names.source(name, shape, vocab));
    HfTensor& t = out[src.tensor];
    const Shape want = exported_shape(src, shape);
    if (t.parts.empty()) t.shape = want;
    if (t.shape != want)
      return Error::at(name, "parameter '" + name + "' places Hugging Face tensor '" + src.tensor +
                                 "' as " + to_string(want) + ", another parameter as " +
                                 to_string(t.shape));
    t.parts.push_back({name, shape, src});
  }
  return out;
}

// The float32 values of Hugging Face tensor `hf_name`, assembled from its parameters.
Result<std::vector<float>> assemble(CheckpointReader& reader, const Imported& imported,
                                    const std::string& hf_name, const HfTensor& t) {
  std::vector<float> out(static_cast<size_t>(numel(t.shape)), 0.0f);
  std::vector<unsigned char> covered(out.size(), 0);
  SliceRanges whole;
  for (int64_t d : t.shape) whole.emplace_back(0, d);
  if (!t.tail_tensor.empty()) {
    SliceRanges tail = whole;
    tail[0].first = t.tail_from;
    LOOM_ASSIGN_OR_RETURN(std::vector<float> rows, imported.weights->read(t.tail_tensor, tail));
    copy_overlap(reinterpret_cast<const char*>(rows.data()), tail,
                 reinterpret_cast<char*>(out.data()), whole, 4, covered.data());
  }
  for (const Part& part : t.parts) {
    SliceRanges full;
    for (int64_t d : part.shape) full.emplace_back(0, d);
    LOOM_ASSIGN_OR_RETURN(std::string bytes, reader.read(part.name, kSliceParam, full));
    std::vector<float> values(bytes.size() / 4);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    for (size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        return Error::at(part.name, "parameter '" + part.name + "' (Hugging Face tensor '" +
                                        hf_name + "') holds a non-finite value (" +
                                        std::to_string(values[i]) + " at element " +
                                        std::to_string(i) +
                                        "): export-hf does not write non-finite weights; export "
                                        "a checkpoint saved before the run diverged");
    if (part.src.transposed) {  // to the Hugging Face layout: [cols, rows]
      const int64_t rows = part.shape[0], cols = part.shape[1];
      std::vector<float> flipped(values.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          flipped[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
      values = std::move(flipped);
    }
    const SliceRanges region = part.src.region(full);
    for (size_t d = part.src.padded_rows ? 1 : 0; d < region.size(); ++d)  // padding: cut
      if (region[d].second > t.shape[d])
        return Error::at(part.name, "parameter '" + part.name + "' " + to_string(part.shape) +
                                        " does not fit Hugging Face tensor '" + hf_name + "' " +
                                        to_string(t.shape));
    copy_overlap(reinterpret_cast<const char*>(values.data()), region,
                 reinterpret_cast<char*>(out.data()), whole, 4, covered.data());
  }
  for (unsigned char c : covered)
    if (!c)
      return Error::at(hf_name, "Hugging Face tensor '" + hf_name +
                                    "' is not covered by the checkpoint's parameters");
  return out;
}

// Writes `header` then each tensor as it is assembled, so the export holds one Hugging Face
// tensor at a time besides what the reader keeps; synced before it returns.
Status write_weights(CheckpointReader& reader, const Imported& imported,
                     const std::map<std::string, HfTensor>& tensors, const std::string& header,
                     const fs::path& path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error::at(file, "cannot create '" + file + "': " + std::strerror(errno));
  auto write_all = [&](const char* p, size_t n) -> Status {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Error::at(file, "cannot write '" + file + "': " + std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::success();
  };
  Status s = write_all(header.data(), header.size());
  for (auto it = tensors.begin(); s.ok() && it != tensors.end(); ++it) {
    auto values = assemble(reader, imported, it->first, it->second);
    if (!values.ok()) {
      s = values.error();
      break;
    }
    s = write_all(reinterpret_cast<const char*>(values->data()), values->size() * 4);
  }
  if (s.ok() && ::fsync(fd) != 0)
    s = Error::at(file, "cannot sync '" + file + "': " + std::strerror(errno));
  ::close(fd);
  return s;
}

Status check_out(const fs::path& out) {
  std::error_code ec;
  if (out.empty())
    return Error::at("OUT", "OUT is empty; give the folder to write, e.g. 'exported-hf'");
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    return Error::at(out.string(), "OUT '" + out.string() +
                                       "' exists; export-hf writes a new folder (remove it or "
                                       "name another)");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    return Error::at(out.string(), "cannot write OUT '" + out.string() + "': its folder '" +
                                       parent.string() + "' does not exist");
  return Status::success();
}

}  // namespace

Status export_hf(CheckpointReader& reader, const fs::path& out_arg, std::string* note) {
  fs::path out = out_arg;
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  LOOM_TRY(check_out(out));
  // A merged checkpoint is one file (a directory has its manifest.json besides): name it.
  const std::vector<fs::path> files = reader.files();
  const std::string source =
      (files.size() == 1 ? files[0] : reader.dir()).string() + " (the checkpoint's config)";
  LOOM_ASSIGN_OR_RETURN(Config config, parse_config(reader.manifest().config_yaml, source));
  const models::ModelRegistry zoo = models::ModelRegistry::with_builtin_models();
  LOOM_ASSIGN_OR_RETURN(const models::ModelType* type, zoo.of(config));
  if (type->hf_names.empty())
    return config.error("model.type", "model.type '" + config.model.type +
                                          "' has no Hugging Face name map (its model registry "
                                          "entry gives none)");
  LOOM_ASSIGN_OR_RETURN(auto tensors, plan_tensors(reader, config, type->hf_names));
  const Imported imported = read_imported(config, note);
  add_tails(tensors, imported, type->hf_names);
  LOOM_ASSIGN_OR_RETURN(std::string config_json, exported_config(config, imported, tensors));
  std::vector<SafeTensor> entries;  // in name order, as the map iterates and the data follows
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * 4;
    entries.push_back({name, "F32", t.shape, offset, offset + bytes});
    offset += bytes;
  }
  // "format": transformers reads the file as PyTorch weights.
  const std::string header = safetensors_header(entries, {{"format", "pt"}});

  fs::path tmp = out;
  tmp += ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a previous export that stopped halfway
  if (!fs::create_directory(tmp, ec))
    return Error::at(tmp.string(), "cannot create '" + tmp.string() + "': " + ec.message());
  Status written = write_file_durably(tmp / "config.json", config_json);
  if (written.ok())
    written = write_weights(reader, imported, tensors, header, tmp / "model.safetensors");
  if (!written.ok()) {
    fs::remove_all(tmp, ec);
    return written;
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    return Error::at(out.string(),
                     "cannot rename '" + tmp.string() + "' to '" + out.string() + "'");
  }
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  return sync_directory(parent);
}

}  // namespace loom::cli
