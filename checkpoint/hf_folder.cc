#include "checkpoint/hf_folder.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/durable_file.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

Error folder_error(const fs::path& file, const std::string& what) {
  return Error::at(file.string(), "'" + file.string() + "': " + what);
}

// The index's weight_map: tensor name -> shard file name (relative to the folder).
Result<std::map<std::string, std::string>> read_index(const fs::path& index) {
  LOOM_ASSIGN_OR_RETURN(std::string text, read_whole_file(index));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return folder_error(index, "is not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    return folder_error(index, "has no \"weight_map\" object (tensor name -> shard file)");
  std::map<std::string, std::string> out;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return folder_error(index, "weight_map entry '" + it.key() + "' is not a file name");
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || fs::path(shard).is_absolute() || shard.find("..") != std::string::npos)
      return folder_error(index, "weight_map entry '" + it.key() + "' names '" + shard +
                                     "', not a file inside the folder");
    out[it.key()] = shard;
  }
  return out;
}

// Element conversion of `n` elements of `dtype` at `src` into `dst`.
void to_float(const std::string& dtype, const char* src, int64_t n, float* dst) {
  if (dtype == "F32") {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = dtype == "BF16" ? bfloat16_to_float(bits) : half_to_float(bits);
  }
}

}  // namespace

float bfloat16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f = 0;
  std::memcpy(&f, &wide, 4);
  return f;
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t out = 0;
  if (exponent == 0x1F) {
    out = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    out = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  } else {
    out = sign;
  }
  float f = 0;
  std::memcpy(&f, &out, 4);
  return f;
}

Result<HfFolder> HfFolder::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Error::at(dir.string(), "'" + dir.string() + "' is not a Hugging Face model folder " +
                                       "(no such directory)");
  HfFolder out;
  out.dir_ = dir;
  if (!fs::is_regular_file(out.config_file(), ec))
    return folder_error(out.config_file(), "missing: a Hugging Face model folder has config.json");
  LOOM_ASSIGN_OR_RETURN(out.config_text_, read_whole_file(out.config_file()));
  if (json c = json::parse(out.config_text_, nullptr, false); c.is_discarded() || !c.is_object())
    return folder_error(out.config_file(), "is not a JSON object");

  const fs::path single = dir / kSingleFile;
  const fs::path index = dir / kIndexFile;
  std::map<std::string, std::string> wanted;  // tensor -> file name; empty: all of one file
  std::vector<std::string> names;
  if (fs::is_regular_file(index, ec)) {
    LOOM_ASSIGN_OR_RETURN(wanted, read_index(index));
    for (const auto& [tensor, file] : wanted)
      if (names.empty() || names.back() != file) names.push_back(file);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
  } else if (fs::is_regular_file(single, ec)) {
    names.push_back(kSingleFile);
  } else {
    return Error::at(dir.string(), "'" + dir.string() + "' holds neither " + kSingleFile + " nor " +
                                       kIndexFile + " (only safetensors weights are read)");
  }
  for (const std::string& name : names) {
    const fs::path path = dir / name;
    if (!fs::is_regular_file(path, ec))
      return folder_error(index, "names shard '" + name + "', which is missing");
    LOOM_ASSIGN_OR_RETURN(SafeTensorsHeader header, SafeTensorsHeader::read(path));
    const size_t file = out.files_.size();
    out.files_.push_back({path, header.data_start});
    for (auto& t : header.tensors) {
      if (!wanted.empty()) {
        auto it = wanted.find(t.name);
        if (it == wanted.end() || it->second != name) continue;  // the index puts it elsewhere
      }
      std::string key = t.name;
      out.tensors_[key] = Entry{file, std::move(t)};
    }
  }
  for (const auto& [tensor, file] : wanted)
    if (!out.tensors_.count(tensor))
      return folder_error(
          index, "maps tensor '" + tensor + "' to '" + file + "', whose header has no such tensor");
  return out;
}

std::string HfFolder::resolve(const std::string& tensor, const std::string& prefix) const {
  if (contains(tensor)) return tensor;
  if (tensor.rfind(prefix, 0) == 0 && contains(tensor.substr(prefix.size())))
    return tensor.substr(prefix.size());
  return tensor;
}

std::vector<std::string> HfFolder::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

Result<std::pair<fs::path, SafeTensor>> HfFolder::find(const std::string& tensor) const {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end())
    return Error::at(tensor, "tensor '" + tensor + "' is not in the Hugging Face folder '" +
                                 dir_.string() + "'");
  return std::make_pair(files_[it->second.file].path, it->second.tensor);
}

Result<std::vector<float>> HfFolder::read(const std::string& tensor,
                                          const SliceRanges& ranges) const {
  LOOM_ASSIGN_OR_RETURN(auto found, find(tensor));
  const auto& [path, t] = found;
  const std::string where = "tensor '" + tensor + "' in '" + path.string() + "'";
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    return Error::at(tensor, where + " is " + t.dtype + "; loom reads F32, BF16 or F16 weights");
  if (ranges.size() != t.shape.size())
    return Error::at(tensor, where + " has shape " + to_string(t.shape) + ", not " +
                                 std::to_string(ranges.size()) + " dimensions");
  int64_t count = 1;
  for (size_t d = 0; d < ranges.size(); ++d) {
    const auto [start, end] = ranges[d];
    if (start < 0 || end < start || end > t.shape[d])
      return Error::at(tensor, where + " has shape " + to_string(t.shape) + "; dimension " +
                                   std::to_string(d) + " has no rows [" + std::to_string(start) +
                                   ", " + std::to_string(end) + ")");
    count *= end - start;
  }
  std::vector<float> out(static_cast<size_t>(count));
  if (count == 0) return out;
  const int64_t elem = safetensors_dtype_size(t.dtype);
  const size_t n = ranges.size();
  // One read per run of contiguous bytes: the trailing dimensions read whole, and the last one
  // that is not, form one run; the dimensions before it are walked.
  size_t k = n;  // runs cover dimensions k-1 .. n-1 (k == 0: the whole region is one run)
  int64_t run = 1;
  while (k > 0) {
    const auto [start, end] = ranges[k - 1];
    run *= end - start;
    --k;
    if (start != 0 || end != t.shape[k]) break;
  }
  std::vector<int64_t> stride(n, 1);  // elements
  for (size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * t.shape[d];
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::at(tensor, "cannot read '" + path.string() + "' for " + where);
  const uint64_t base = files_[tensors_.at(tensor).file].data_start + t.begin;
  std::vector<int64_t> index(k, 0);  // position within the walked dimensions
  std::string bytes(static_cast<size_t>(run * elem), '\0');
  for (int64_t done = 0; done < count; done += run) {
    int64_t offset = 0;
    for (size_t d = 0; d < n; ++d) offset += (ranges[d].first + (d < k ? index[d] : 0)) * stride[d];
    in.seekg(static_cast<std::streamoff>(base + static_cast<uint64_t>(offset * elem)));
    if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
      return Error::at(tensor, "'" + path.string() + "' ended inside " + where + " (truncated?)");
    bytes_read_ += bytes.size();
    to_float(t.dtype, bytes.data(), run, out.data() + done);
    for (size_t d = k; d-- > 0;) {  // next position, last walked dimension fastest
      if (++index[d] < ranges[d].second - ranges[d].first) break;
      index[d] = 0;
    }
  }
  return out;
}

}  // namespace loom
