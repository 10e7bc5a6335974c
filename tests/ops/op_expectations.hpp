#pragma once
// Shared test support for op families: evaluating a small graph on given values, comparing
// against hand-derived numbers, and checking that misuse raises mg::Error with a useful message.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/ops.hpp"
#include "ops/interpreter.hpp"

namespace mg::testing {

// Builds `build` over inputs x0, x1, ... holding `values` (dtypes default to f32) and returns the
// reference value of its result.
inline HostTensor evaluate_op(const std::vector<HostTensor>& values,
                              const std::function<Tensor(std::vector<Tensor>&)>& build,
                              const std::vector<DType>& dtypes = {}) {
  Graph graph;
  Environment environment;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    inputs.push_back(input(graph, name, values[i].shape, dtypes.empty() ? DType::f32 : dtypes[i]));
    environment.leaves[name] = values[i];
  }
  const Tensor result = build(inputs);
  verify(graph);
  return evaluate(graph, environment)[result.id()];
}

// The reference value of `op` applied to one input holding `x`.
inline HostTensor evaluate_unary(const HostTensor& x, const std::function<Tensor(Tensor)>& op) {
  return evaluate_op({x}, [&](std::vector<Tensor>& in) { return op(in[0]); });
}

inline void expect_values(const HostTensor& actual, const Shape& shape,
                          const std::vector<double>& expected, double tolerance = 1e-12) {
  ASSERT_EQ(shape_string(actual.shape), shape_string(shape));
  ASSERT_EQ(actual.data.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_NEAR(actual.data[k], expected[k], tolerance) << "element " << k;
  }
}

// A tensor of `shape` holding first, first + step, first + 2 * step, ... in row-major order.
inline HostTensor counting(Shape shape, double first = 1, double step = 1) {
  HostTensor tensor(std::move(shape));
  for (int64_t i = 0; i < tensor.elements(); ++i) {
    tensor.data[i] = first + step * static_cast<double>(i);
  }
  return tensor;
}

// `action` must throw mg::Error whose message contains every fragment.
inline void expect_error(const std::function<void()>& action,
                         const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "expected mg::Error containing '" << fragments.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
  }
}

}  // namespace mg::testing
