#include "core/shape.h"

#include "core/check.h"

namespace loom {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int64_t bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "f32", 4}, {DType::kFloat16, "f16", 2}, {DType::kBFloat16, "bf16", 2},
    {DType::kInt64, "i64", 8},   {DType::kInt32, "i32", 4},   {DType::kUInt16, "u16", 2},
};
const DTypeInfo& info(DType dtype) {
  for (const auto& i : kDTypes)
    if (i.dtype == dtype) return i;
  LOOM_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
  return kDTypes[0];  // unreachable
}
}  // namespace

int64_t size_bytes(DType dtype) { return info(dtype).bytes; }
bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}
std::string_view to_string(DType dtype) { return info(dtype).name; }
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kDTypes)
    if (i.name == name) return i.dtype;
  return std::nullopt;
}

}  // namespace loom
