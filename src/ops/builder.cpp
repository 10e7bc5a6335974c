// Tensor handles, leaves and operator sugar of the builder API. Each op family file implements
// its own builder functions next to its op definitions.
#include "meganeura/ops.hpp"

namespace mg {

Graph& Tensor::graph() const {
  if (!graph_) throw Error("use of an empty Tensor (default-constructed, never assigned)");
  return *graph_;
}

int64_t Tensor::dim(int64_t axis) const {
  const int64_t r = rank();
  const int64_t normalized = axis < 0 ? axis + r : axis;
  if (normalized < 0 || normalized >= r) {
    throw Error("dim(" + std::to_string(axis) + ") of a tensor of type " + type_string(type()));
  }
  return shape()[normalized];
}

Tensor input(Graph& graph, std::string name, Shape shape, DType dtype) {
  return {&graph, graph.input(std::move(name), {dtype, std::move(shape)})};
}

Tensor parameter(Graph& graph, std::string name, Shape shape, Init init, DType dtype) {
  return {&graph, graph.parameter(std::move(name), {dtype, std::move(shape)}, init)};
}

Tensor scalar(Graph& graph, double value, DType dtype) {
  return {&graph, graph.constant(value, {dtype, {}})};
}

Tensor full(Graph& graph, Shape shape, double value, DType dtype) {
  return {&graph, graph.constant(value, {dtype, std::move(shape)})};
}

Tensor operator+(Tensor a, Tensor b) {
  return add(a, b);
}
Tensor operator-(Tensor a, Tensor b) {
  return sub(a, b);
}
Tensor operator*(Tensor a, Tensor b) {
  return mul(a, b);
}
Tensor operator/(Tensor a, Tensor b) {
  return div(a, b);
}
Tensor operator-(Tensor x) {
  return neg(x);
}
Tensor operator+(Tensor a, double b) {
  return add(a, scalar(a.graph(), b, a.dtype()));
}
Tensor operator-(Tensor a, double b) {
  return sub(a, scalar(a.graph(), b, a.dtype()));
}
Tensor operator*(Tensor a, double b) {
  return mul(a, scalar(a.graph(), b, a.dtype()));
}
Tensor operator/(Tensor a, double b) {
  return div(a, scalar(a.graph(), b, a.dtype()));
}
Tensor operator+(double a, Tensor b) {
  return add(scalar(b.graph(), a, b.dtype()), b);
}
Tensor operator-(double a, Tensor b) {
  return sub(scalar(b.graph(), a, b.dtype()), b);
}
Tensor operator*(double a, Tensor b) {
  return mul(scalar(b.graph(), a, b.dtype()), b);
}
Tensor operator/(double a, Tensor b) {
  return div(scalar(b.graph(), a, b.dtype()), b);
}

}  // namespace mg
