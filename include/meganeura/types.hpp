#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg {

enum class DType : uint8_t { f32, f16, bf16, i32, u32 };

std::string_view dtype_name(DType dtype);  // "f32", "f16", "bf16", "i32", "u32"
size_t dtype_bytes(DType dtype);
bool is_floating(DType dtype);
// f16 or bf16: stored in 16 bits, computed in f32. Inline, for layers that do not link the IR
// (weight files).
constexpr bool is_half_dtype(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16;
}
// Parses a name as printed by dtype_name; throws mg::Error on an unknown name.
DType parse_dtype(std::string_view name);

// A static, row-major N-D shape. Rank 0 is a scalar.
using Shape = std::vector<int64_t>;

int64_t element_count(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[2, 3, 4]"
// Row-major strides in elements.
std::vector<int64_t> row_major_strides(const Shape& shape);
// NumPy broadcasting of two shapes; throws mg::Error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;

  int64_t elements() const { return element_count(shape); }
  size_t bytes() const { return static_cast<size_t>(elements()) * dtype_bytes(dtype); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool operator==(const TensorType&) const = default;
};

std::string type_string(const TensorType& type);  // "f32[2, 3]"

}  // namespace mg
