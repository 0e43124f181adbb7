#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace loom {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // as the reference implementation

Error bad(const std::string& file, const std::string& what) {
  return Error::at(file, "'" + file + "' is not a valid safetensors file: " + what);
}

}  // namespace

int64_t safetensors_dtype_size(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

namespace {

// One tensor's entry of the header: its dtype, shape and data offsets, checked against the
// `data_size` bytes after the header.
Result<SafeTensor> parse_entry(const std::string& name, const json& v, uint64_t data_size,
                               const std::string& file) {
  const std::string where = "tensor '" + name + "': ";
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    return bad(file, where + "needs dtype, shape and data_offsets");
  SafeTensor t;
  t.name = name;
  if (!v["dtype"].is_string()) return bad(file, where + "dtype is not a string");
  t.dtype = v["dtype"].get<std::string>();
  const int64_t elem = safetensors_dtype_size(t.dtype);
  if (elem == 0) {
    // A dtype of the format loom does not read (F8_E4M3, F8_E5M2, ...): the file may be fine.
    static const char* kKnown[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",
                                   "F4",      "C64",     "I4",      "U4"};
    for (const char* known : kKnown)
      if (t.dtype == known)
        return Error::at(file, "'" + file + "': " + where + "dtype " + t.dtype +
                                   " is not supported by loom (it reads F64, F32, F16, BF16 "
                                   "and integer tensors)");
    return bad(file, where + "unknown dtype '" + t.dtype + "'");
  }
  const json& shape = v["shape"];
  if (!shape.is_array() || shape.size() > 64)
    return bad(file, where + "shape is not an array of dimensions");
  uint64_t count = 1;
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      return bad(file, where + "a dimension is not a non-negative integer");
    const auto dim = static_cast<uint64_t>(d.get<int64_t>());
    if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / dim)
      return bad(file, where + "shape is too large");
    count *= dim;
    t.shape.push_back(d.get<int64_t>());
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    return bad(file, where + "data_offsets is not [begin, end]");
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  if (t.begin > t.end)
    return bad(file, where + "data_offsets [" + std::to_string(t.begin) + ", " +
                         std::to_string(t.end) + "] end before they begin");
  if (t.end > data_size)
    return bad(file, where + "data_offsets [" + std::to_string(t.begin) + ", " +
                         std::to_string(t.end) + "] lie outside the " + std::to_string(data_size) +
                         " data bytes (truncated?)");
  if (t.end - t.begin != count * static_cast<uint64_t>(elem))
    return bad(file, where + "data_offsets hold " + std::to_string(t.end - t.begin) +
                         " bytes but shape " + to_string(t.shape) + " of " + t.dtype + " needs " +
                         std::to_string(count * static_cast<uint64_t>(elem)));
  return t;
}

// The header's JSON object, after its 8-byte length; `data_start` set.
Result<json> header_json(std::string_view head, uint64_t file_size, const std::string& file,
                         uint64_t& data_start) {
  if (head.size() < 8 || file_size < 8)
    return bad(file, "shorter than its 8-byte header length (truncated?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(head[static_cast<size_t>(i)]);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    return bad(file, "header length " + std::to_string(header_len) + " exceeds the file size " +
                         std::to_string(file_size) + " (truncated?)");
  if (header_len > head.size() - 8)
    return bad(file, "header length " + std::to_string(header_len) + " exceeds the " +
                         std::to_string(head.size() - 8) + " header bytes read (truncated?)");
  json header = json::parse(head.begin() + 8,
                            head.begin() + 8 + static_cast<std::ptrdiff_t>(header_len), nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return bad(file, "the header is not a JSON object");
  data_start = 8 + header_len;
  return header;
}

}  // namespace

Result<SafeTensorsHeader> SafeTensorsHeader::parse(std::string_view head, uint64_t file_size,
                                                   const std::string& file) {
  SafeTensorsHeader out;
  LOOM_ASSIGN_OR_RETURN(const json header, header_json(head, file_size, file, out.data_start));
  const uint64_t data_size = file_size - out.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad(file, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return bad(file, "__metadata__." + m.key() + " is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(SafeTensor t, parse_entry(name, v, data_size, file));
    out.tensors.push_back(std::move(t));
  }
  std::vector<const SafeTensor*> sorted;
  for (const auto& t : out.tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->begin < sorted[i - 1]->end)
      return bad(file,
                 "tensors '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
  return out;
}

Result<SafeTensorsHeader> SafeTensorsHeader::read(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!in || ec) return Error::at(file, "cannot read '" + file + "'");
  std::string head(8, '\0');
  if (size < 8 || !in.read(head.data(), 8))
    return bad(file, "shorter than its 8-byte header length (truncated?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(head[static_cast<size_t>(i)]);
  if (header_len > kMaxHeaderBytes || header_len > size - 8)
    return bad(file, "header length " + std::to_string(header_len) + " exceeds the file size " +
                         std::to_string(size) + " (truncated?)");
  head.resize(8 + header_len);
  if (!in.read(head.data() + 8, static_cast<std::streamsize>(header_len)))
    return Error::at(file, "cannot read the header of '" + file + "'");
  return parse(head, size, file);
}

const SafeTensor* SafeTensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<SafeTensorsFile> SafeTensorsFile::parse(std::string bytes, const std::string& file) {
  LOOM_ASSIGN_OR_RETURN(SafeTensorsHeader header,
                        SafeTensorsHeader::parse(bytes, bytes.size(), file));
  SafeTensorsFile out;
  out.data_start_ = static_cast<size_t>(header.data_start);
  out.tensors_ = std::move(header.tensors);
  out.metadata_ = std::move(header.metadata);
  out.bytes_ = std::move(bytes);
  return out;
}

const SafeTensor* SafeTensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::string_view SafeTensorsFile::data(const SafeTensor& t) const {
  return std::string_view(bytes_).substr(data_start_ + t.begin, t.end - t.begin);
}

void SafeTensorsWriter::add(const std::string& name, const std::string& dtype, const Shape& shape,
                            std::string_view bytes) {
  LOOM_CHECK(static_cast<int64_t>(bytes.size()) == numel(shape) * safetensors_dtype_size(dtype))
      << "safetensors tensor '" << name << "' has " << bytes.size() << " bytes for shape "
      << to_string(shape);
  SafeTensor t{name, dtype, shape, data_.size(), data_.size() + bytes.size()};
  data_.append(bytes);
  tensors_.push_back(std::move(t));
}

std::string safetensors_header(const std::vector<SafeTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : tensors)
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + text;
}

std::string SafeTensorsWriter::finish() const {
  return safetensors_header(tensors_, metadata_) + data_;
}

}  // namespace loom
