#pragma once
// Shared test support: checks an op's VJP against central finite differences of the f64
// reference. The op is wrapped as L = sum(op(inputs) * R) with a fixed random R, so every
// output element contributes with its own weight.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "ops/interpreter.hpp"

namespace mg::testing {

inline HostTensor random_tensor(const Shape& shape, std::mt19937_64& generator, double low = -1.0,
                                double high = 1.0) {
  std::uniform_real_distribution<double> distribution(low, high);
  HostTensor tensor(shape);
  for (double& value : tensor.data) value = distribution(generator);
  return tensor;
}

struct GradientCase {
  std::vector<Shape> shapes;         // one f32 input per shape, named x0, x1, ...
  std::vector<bool> differentiable;  // empty = all
  std::vector<HostTensor> values;    // optional explicit values (e.g. integer indices)
  std::vector<DType> dtypes;         // empty = all f32
  double low = -1.0, high = 1.0;     // range of random inputs
  double step = 1e-6;
  double tolerance = 1e-6;  // relative, on the whole gradient (L2)
};

// `build` receives the input tensors and returns the op's result.
inline void expect_gradients_match(const GradientCase& spec,
                                   const std::function<Tensor(std::vector<Tensor>&)>& build,
                                   uint64_t seed = 1234) {
  std::mt19937_64 generator(seed);
  Graph graph;
  std::vector<Tensor> inputs;
  Environment environment;
  for (size_t i = 0; i < spec.shapes.size(); ++i) {
    const DType dtype = spec.dtypes.empty() ? DType::f32 : spec.dtypes[i];
    const std::string name = "x" + std::to_string(i);
    inputs.push_back(input(graph, name, spec.shapes[i], dtype));
    environment.leaves[name] = i < spec.values.size() && !spec.values[i].data.empty()
                                   ? spec.values[i]
                                   : random_tensor(spec.shapes[i], generator, spec.low, spec.high);
  }
  const Tensor result = build(inputs);
  const HostTensor weights = random_tensor(result.shape(), generator);
  const Tensor weight_input = input(graph, "weights", result.shape());
  environment.leaves["weights"] = weights;
  const Tensor loss = sum_all(result * weight_input);

  std::vector<ValueId> wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (spec.differentiable.empty() || spec.differentiable[i]) wrt.push_back(inputs[i].id());
  }
  const std::map<ValueId, ValueId> grads = gradients(graph, loss.id(), wrt);
  verify(graph);
  const std::vector<HostTensor> values = evaluate(graph, environment);

  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!spec.differentiable.empty() && !spec.differentiable[i]) continue;
    const std::string name = "x" + std::to_string(i);
    const HostTensor& analytic = values[grads.at(inputs[i].id())];
    HostTensor numeric(spec.shapes[i]);
    for (int64_t k = 0; k < numeric.elements(); ++k) {
      Environment shifted = environment;
      shifted.leaves[name].data[k] += spec.step;
      const double plus = evaluate(graph, shifted)[loss.id()].data[0];
      shifted.leaves[name].data[k] -= 2 * spec.step;
      const double minus = evaluate(graph, shifted)[loss.id()].data[0];
      numeric.data[k] = (plus - minus) / (2 * spec.step);
    }
    double difference = 0, norm = 0;
    for (int64_t k = 0; k < numeric.elements(); ++k) {
      difference += std::pow(analytic.data[k] - numeric.data[k], 2);
      norm += std::pow(numeric.data[k], 2);
    }
    const double relative = std::sqrt(difference) / std::max(std::sqrt(norm), 1e-12);
    EXPECT_LT(relative, spec.tolerance)
        << "gradient of input " << i << " (" << shape_string(spec.shapes[i])
        << "): relative L2 error " << relative << ", numeric norm " << std::sqrt(norm);
    EXPECT_GT(std::sqrt(norm), 0.0) << "input " << i << " got an all-zero numeric gradient";
  }
}

}  // namespace mg::testing
