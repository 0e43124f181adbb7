#include "launch/hf_export.h"

#include <cstring>
#include <map>
#include <system_error>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/durable_file.h"
#include "models/hf_config.h"
#include "models/hf_names.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

// One Hugging Face tensor being assembled from the loom parameters the map places in it.
struct HfTensor {
  Shape shape;
  std::vector<float> values;
  std::vector<unsigned char> covered;  // one byte per element
};

// The rows of a loom parameter a Hugging Face tensor with `more_rows` gets: the parameter's own
// (GPT-2's position table exports the run's seq positions, and config.json says n_positions=seq).
Shape exported_shape(const models::HfSource& src, const Shape& loom) {
  Shape s = src.shape;
  if (src.more_rows) s[0] = src.transposed ? loom[1] : loom[0];
  return s;
}

Status place(const std::string& name, const Shape& loom_shape, const std::string& bytes,
             const models::HfSource& src, HfTensor& dst) {
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  SliceRanges loom_full;
  for (int64_t d : loom_shape) loom_full.emplace_back(0, d);
  if (src.transposed) {  // to the Hugging Face layout: [cols, rows]
    const int64_t rows = loom_shape[0], cols = loom_shape[1];
    std::vector<float> t(values.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        t[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
    values = std::move(t);
  }
  const SliceRanges region = src.region(loom_full);
  SliceRanges whole;
  for (int64_t d : dst.shape) whole.emplace_back(0, d);
  for (size_t d = 0; d < region.size(); ++d)
    if (region[d].second > dst.shape[d])
      return Error::at(name, "parameter '" + name + "' " + to_string(loom_shape) +
                                 " does not fit Hugging Face tensor '" + src.tensor + "' " +
                                 to_string(dst.shape));
  copy_overlap(reinterpret_cast<const char*>(values.data()), region,
               reinterpret_cast<char*>(dst.values.data()), whole, 4, dst.covered.data());
  return Status::success();
}

Status check_out(const fs::path& out) {
  std::error_code ec;
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

Status export_hf(CheckpointReader& reader, const fs::path& out_arg) {
  fs::path out = out_arg;
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  LOOM_TRY(check_out(out));
  const std::string source = reader.dir().string() + " (the checkpoint's config)";
  LOOM_ASSIGN_OR_RETURN(Config config, parse_config(reader.manifest().config_yaml, source));
  if (!models::has_hf_names(config.model.type))
    return config.error("model.type", "model.type '" + config.model.type +
                                          "' has no Hugging Face name map (gpt and llama have)");
  LOOM_ASSIGN_OR_RETURN(std::string config_json, models::hf_config_json(config));

  std::map<std::string, HfTensor> tensors;
  for (const std::string& name : reader.tensors(kSliceParam)) {
    LOOM_ASSIGN_OR_RETURN(auto desc, reader.describe(name, kSliceParam));
    const auto& [shape, dtype] = desc;
    if (dtype != "F32")
      return Error::at(name, "parameter '" + name + "' is stored as " + dtype +
                                 "; export-hf reads float32 parameters");
    LOOM_ASSIGN_OR_RETURN(models::HfSource src, models::hf_source(config.model.type, name, shape));
    SliceRanges full;
    for (int64_t d : shape) full.emplace_back(0, d);
    LOOM_ASSIGN_OR_RETURN(std::string bytes, reader.read(name, kSliceParam, full));
    HfTensor& dst = tensors[src.tensor];
    const Shape want = exported_shape(src, shape);
    if (dst.shape.empty()) {
      dst.shape = want;
      dst.values.assign(static_cast<size_t>(numel(want)), 0.0f);
      dst.covered.assign(static_cast<size_t>(numel(want)), 0);
    } else if (dst.shape != want) {
      return Error::at(name, "parameter '" + name + "' places Hugging Face tensor '" + src.tensor +
                                 "' as " + to_string(want) + ", another parameter as " +
                                 to_string(dst.shape));
    }
    LOOM_TRY(place(name, shape, bytes, src, dst));
  }
  SafeTensorsWriter writer;
  writer.set_metadata("format", "pt");  // transformers reads the file as PyTorch weights
  for (const auto& [name, t] : tensors) {
    for (unsigned char c : t.covered)
      if (!c)
        return Error::at(name, "Hugging Face tensor '" + name +
                                   "' is not covered by the checkpoint's parameters");
    writer.add(
        name, "F32", t.shape,
        std::string_view(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4));
  }
  const std::string weights = writer.finish();

  fs::path tmp = out;
  tmp += ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a previous export that stopped halfway
  if (!fs::create_directory(tmp, ec))
    return Error::at(tmp.string(), "cannot create '" + tmp.string() + "': " + ec.message());
  Status written = write_file_durably(tmp / "config.json", config_json);
  if (written.ok()) written = write_file_durably(tmp / "model.safetensors", weights);
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
