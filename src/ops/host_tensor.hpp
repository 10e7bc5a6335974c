#pragma once
// Double-precision host tensors: the values the reference interpreter computes with. Integer
// dtypes are held as exact doubles too.
#include <cstdint>
#include <vector>

#include "meganeura/types.hpp"

namespace mg {

struct HostTensor {
  Shape shape;
  std::vector<double> data;

  HostTensor() = default;
  explicit HostTensor(Shape s, double fill = 0.0)
      : shape(std::move(s)), data(static_cast<size_t>(element_count(shape)), fill) {}
  HostTensor(Shape s, std::vector<double> values) : shape(std::move(s)), data(std::move(values)) {}

  int64_t elements() const { return static_cast<int64_t>(data.size()); }
};

// Index of the element of a broadcast operand (shape `from`) that feeds flat output index
// `flat` of shape `to` (NumPy broadcasting, `from` right-aligned against `to`).
int64_t broadcast_source_index(const Shape& from, const Shape& to, int64_t flat);

}  // namespace mg
