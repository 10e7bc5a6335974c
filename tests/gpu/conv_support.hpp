#pragma once
// Helpers shared by the GPU tests of the convolution kernels (conv_pool_test.cpp and
// cpu_kernels_test.cpp).
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meganeura/autodiff.hpp"

namespace mg::testing {

inline int64_t conv_extent(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                           int64_t dilation) {
  return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// Sets y and the gradients of <y, seed> with respect to every input in `wrt` as outputs.
inline void output_with_gradients(Graph& graph, Tensor y, Tensor seed,
                                  const std::vector<Tensor>& wrt) {
  graph.set_output("y", y.id());
  std::vector<ValueId> ids;
  for (const Tensor& t : wrt) ids.push_back(t.id());
  const std::map<ValueId, ValueId> grads = gradients(graph, y.id(), ids, seed.id());
  for (size_t k = 0; k < wrt.size(); ++k) {
    graph.set_output("grad" + std::to_string(k), grads.at(wrt[k].id()));
  }
}

// conv2d forward plus gradients for x and w (conv2d_grad_input, conv2d_grad_weight).
inline void check_conv(const Shape& x, const Shape& w, const Conv2dOptions& options) {
  const Shape y{
      x[0], w[0],
      conv_extent(x[2], w[2], options.stride[0], options.padding[0], options.dilation[0]),
      conv_extent(x[3], w[3], options.stride[1], options.padding[1], options.dilation[1])};
  check_on_gpu({{"x", x}, {"w", w}, {"seed", y}}, [&](Graph& graph, std::vector<Tensor>& in) {
    output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, options), in[2],
                          {in[0], in[1]});
  });
}

}  // namespace mg::testing
