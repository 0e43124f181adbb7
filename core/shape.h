// Shapes and element types of logical tensors (no LibTorch here: the planner works on metadata).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
std::string to_string(const Shape& shape);  // "[2, 32, 64]"

enum class DType { kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kUInt16 };

int64_t size_bytes(DType dtype);
bool is_floating(DType dtype);                            // f32, f16, bf16
std::string_view to_string(DType dtype);                  // "f32", "i64", ...
std::optional<DType> parse_dtype(std::string_view name);  // inverse of to_string

}  // namespace loom
