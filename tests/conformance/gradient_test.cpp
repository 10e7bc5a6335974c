// Every registered op with a vector-Jacobian product: the gradient it builds, evaluated on the
// f64 reference, against central finite differences of the reference, on the inputs of the op's
// conformance cases (op_cases.cpp). An op's VJP that is wrong fails here with the input named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "meganeura/autodiff.hpp"
#include "op_cases.hpp"
#include "ops/interpreter.hpp"
#include "ops/op.hpp"

namespace mg::conformance {
namespace {

struct GradientCase {
  size_t index;      // into op_cases()
  std::string name;  // the op, and _<k> for its k-th further case
};

// gtest prints a parameter by its name.
void PrintTo(const GradientCase& gradient_case, std::ostream* stream) {
  *stream << gradient_case.name;
}

// The cases whose op has a VJP.
std::vector<GradientCase> differentiable_cases() {
  std::vector<GradientCase> cases;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < op_cases().size(); ++i) {
    const OpCase& c = op_cases()[i];
    if (!op_def(c.op).vjp || c.needs_cooperative_matrices) continue;
    std::string name(c.op);
    if (const int earlier = seen[name]++; earlier > 0) name += "_" + std::to_string(earlier);
    cases.push_back({i, name});
  }
  return cases;
}

// sum(y * seed) for the case's output y on the reference.
double projected_output(const Graph& graph, ValueId y, const HostTensor& seed,
                        const Environment& environment) {
  const HostTensor value = evaluate(graph, environment)[y];
  double total = 0;
  for (size_t i = 0; i < value.data.size(); ++i) total += value.data[i] * seed.data[i];
  return total;
}

// The elements of each input whose derivative is checked: every one up to this many, else this
// many drawn at random (the reference evaluates the graph twice for each).
constexpr size_t kMostElementsPerInput = 48;

class OpGradients : public ::testing::TestWithParam<GradientCase> {};

TEST_P(OpGradients, MatchFiniteDifferences) {
  const size_t index = GetParam().index;
  const OpCase& c = op_cases()[index];
  CaseGraph built(DType::f32);
  c.build(built);
  const Graph forward = built.graph;
  const ValueId y = forward.output("y");
  if (forward.type(y).dtype != DType::f32) GTEST_SKIP() << c.op << "'s case has no f32 output";
  Environment environment = draw_inputs(built, 2000 + index);

  Graph graph = forward;
  const ValueId seed = graph.input("gradient_seed", graph.type(y));
  std::mt19937_64 generator(3000 + index);
  HostTensor seed_value(graph.type(y).shape);
  for (double& element : seed_value.data)
    element = std::uniform_real_distribution<double>(-1.0, 1.0)(generator);
  environment.leaves["gradient_seed"] = seed_value;
  std::vector<ValueId> wrt;
  for (const CaseInput& spec : built.inputs)
    if (spec.dtype == DType::f32 && !spec.whole) wrt.push_back(forward.find_leaf(spec.name));
  std::map<ValueId, ValueId> gradients_of;
  try {
    gradients_of = gradients(graph, y, wrt, seed);
  } catch (const Error& error) {
    // Ops that passes write after differentiation refuse a gradient, saying so.
    GTEST_SKIP() << error.what();
  }
  const std::vector<HostTensor> values = evaluate(graph, environment);

  size_t checked = 0;
  for (const ValueId leaf : wrt) {
    const Node& gradient = graph.node(gradients_of.at(leaf));
    // A VJP that gives this input no gradient (labels, running statistics, a stopped path).
    if (gradient.is_uniform_constant() && gradient.attrs.get_float("value") == 0.0) continue;
    const std::string& name = forward.node(leaf).name;
    const HostTensor& analytic = values[gradients_of.at(leaf)];
    std::vector<size_t> elements(analytic.data.size());
    for (size_t i = 0; i < elements.size(); ++i) elements[i] = i;
    std::shuffle(elements.begin(), elements.end(), generator);
    elements.resize(std::min(elements.size(), kMostElementsPerInput));
    double difference = 0, norm = 0;
    for (size_t i : elements) {
      const double kStep = 1e-6;
      Environment shifted = environment;
      shifted.leaves[name].data[i] += kStep;
      const double above = projected_output(forward, y, seed_value, shifted);
      shifted.leaves[name].data[i] -= 2 * kStep;
      const double below = projected_output(forward, y, seed_value, shifted);
      const double numeric = (above - below) / (2 * kStep);
      difference += std::pow(analytic.data[i] - numeric, 2);
      norm += std::pow(numeric, 2);
    }
    EXPECT_LT(std::sqrt(difference), 1e-5 * std::max(std::sqrt(norm), 1.0))
        << c.op << ": the gradient with respect to '" << name
        << "' differs from central finite differences of the reference";
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << c.op << "'s case passes no gradient to its inputs";
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpGradients, ::testing::ValuesIn(differentiable_cases()),
                         [](const ::testing::TestParamInfo<GradientCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace mg::conformance
