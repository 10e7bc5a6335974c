#include "meganeura/types.hpp"

#include <algorithm>

#include "meganeura/error.hpp"

namespace mg {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::u32:
      return "u32";
  }
  return "?";
}

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16:
      return 2;
    default:
      return 4;
  }
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || is_half_dtype(dtype);
}

DType parse_dtype(std::string_view name) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::u32}) {
    if (dtype_name(dtype) == name) return dtype;
  }
  throw Error("unknown dtype '" + std::string(name) + "' (expected f32, f16, bf16, i32 or u32)");
}

int64_t element_count(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::string shape_string(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<int64_t> row_major_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t ea = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t eb = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (ea != eb && ea != 1 && eb != 1) {
      throw Error(std::string(op) + ": shapes " + shape_string(a) + " and " + shape_string(b) +
                  " do not broadcast (axis " + std::to_string(i) + ": " + std::to_string(ea) +
                  " vs " + std::to_string(eb) + ")");
    }
    result[i] = ea == 1 ? eb : ea;
  }
  return result;
}

std::string type_string(const TensorType& type) {
  return std::string(dtype_name(type.dtype)) + shape_string(type.shape);
}

}  // namespace mg
