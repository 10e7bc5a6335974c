// Op conformance, in the spirit of ggml's test-backend-ops: every registered op (but the leaves)
// has a reference evaluation, a lowering on the device and a case (op_cases.cpp) that runs it
// there against the f64 reference interpreter, for each dtype its case lists (and, in
// gradient_test.cpp, its VJP against finite differences). An op added to the registry without
// one of them fails EveryOpHasALoweringAndACase with what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "meganeura/session.hpp"
#include "op_cases.hpp"
#include "ops/interpreter.hpp"
#include "ops/op.hpp"

namespace mg::conformance {
namespace {

bool is_leaf_op(std::string_view op) {
  return op == op::input || op == op::parameter || op == op::state || op == op::constant;
}

TEST(Conformance, EveryOpHasALoweringAndACase) {
  const std::vector<std::string> lowered = kernels::lowered_ops();
  std::set<std::string_view> with_case;
  for (const OpCase& c : op_cases()) {
    EXPECT_NE(find_op(c.op), nullptr)
        << "tests/conformance/op_cases.cpp has a case for '" << c.op << "', which is no op";
    with_case.insert(c.op);
  }
  for (const std::string& op : op_names()) {
    if (is_leaf_op(op)) continue;
    EXPECT_TRUE(op_def(op).reference)
        << "op '" << op << "' has no reference evaluation: give its OpDef a `reference` in its "
        << "family file under src/ops/ (the f64 oracle of every test)";
    EXPECT_TRUE(is_view_op(op) || std::find(lowered.begin(), lowered.end(), op) != lowered.end())
        << "op '" << op << "' has no lowering: give it a LoweringEntry in the kernel archetype "
        << "file that runs it (src/backends/vulkan/kernels/*.cpp, listed in lowering.cpp)";
    EXPECT_TRUE(with_case.count(op))
        << "op '" << op << "' has no conformance case: add one to tests/conformance/op_cases.cpp "
        << "(a small graph whose output needs the op)";
  }
}

// ||device - reference|| / ||reference||.
double normalized_error(const std::vector<float>& device, const HostTensor& reference) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < device.size(); ++i) {
    if (!std::isfinite(device[i])) return INFINITY;
    difference += std::pow(device[i] - reference.data[i], 2);
    norm += std::pow(reference.data[i], 2);
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-30);
}

// The report of a session with `options` over a graph that any device runs: whether the device
// runs cooperative matrices there.
BuildReport cooperative_matrix_probe(const SessionOptions& options) {
  Graph graph;
  graph.set_output("y", (input(graph, "x", {4}) * 2.0).id());
  return Session(graph, options).report();
}

// Runs `c` with float inputs of `dtype` on the device and on the reference.
void run_case(const OpCase& c, DType dtype, uint64_t seed) {
  CaseGraph built(dtype);
  c.build(built);
  const Graph& graph = built.graph;
  const Environment environment = draw_inputs(built, seed);
  const std::vector<HostTensor> reference = evaluate(graph, environment);

  SessionOptions options;
  options.validation = !c.needs_cooperative_matrices;  // Debian's layer predates KHR matrices
  options.guard_bytes = 64;
  // GPUs rewrite convolutions into im2col and a product (or Winograd's transforms): keep the
  // op's own kernel, which is what this case checks.
  Switches switches = Switches::from_environment();
  switches.im2col = false;
  switches.winograd_conv = false;
  switches.winograd_weight_grad = false;
  options.switches = switches;
  if (c.needs_cooperative_matrices) {
    options.precision = Precision::fast;
    const BuildReport probe = cooperative_matrix_probe(options);
    if (!probe.coop_matrix_available)
      GTEST_SKIP() << c.op << " runs only on cooperative matrices, which " << probe.device
                   << " lacks";
  }
  Session session(graph, options);
  for (const CaseInput& spec : built.inputs) {
    if (!session.has_input(spec.name)) continue;
    const std::vector<double>& data = environment.leaves.at(spec.name).data;
    if (spec.dtype == DType::i32) {
      const std::vector<int32_t> values(data.begin(), data.end());
      session.set_input(spec.name, values);
    } else {
      const std::vector<float> values(data.begin(), data.end());
      session.set_input(spec.name, values);
    }
  }
  session.run();
  for (const auto& [name, id] : graph.outputs()) {
    EXPECT_LT(normalized_error(session.output(name), reference[id]), c.tolerance)
        << "output '" << name << "' of type " << type_string(graph.type(id));
  }
  EXPECT_NO_THROW(session.check_guards());
  EXPECT_EQ(session.validation_messages(), 0u);
  // The op itself ran (f16 tensors run it fused between their conversions, views run nothing).
  if (dtype == DType::f32 && !is_view_op(c.op)) {
    EXPECT_NE(session.report().dispatch_list.find(std::string(c.op) + " %"), std::string::npos)
        << c.op << " was not dispatched:\n"
        << session.report().dispatch_list;
  }
}

struct CaseParameter {
  size_t index;  // into op_cases()
  DType dtype;
  std::string name;  // <op>_<dtype>, and _<k> for an op's k-th further case
};

// gtest prints a parameter by its name.
void PrintTo(const CaseParameter& parameter, std::ostream* stream) {
  *stream << parameter.name;
}

std::vector<CaseParameter> case_parameters() {
  std::vector<CaseParameter> parameters;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < op_cases().size(); ++i) {
    for (DType dtype : op_cases()[i].dtypes) {
      std::string name = std::string(op_cases()[i].op) + "_" + std::string(dtype_name(dtype));
      if (const int earlier = seen[name]++; earlier > 0) name += "_" + std::to_string(earlier);
      parameters.push_back({i, dtype, name});
    }
  }
  return parameters;
}

class OpConformance : public ::testing::TestWithParam<CaseParameter> {};

TEST_P(OpConformance, MatchesTheReference) {
  const OpCase& c = op_cases()[GetParam().index];
  run_case(c, GetParam().dtype, 1000 + GetParam().index);
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpConformance, ::testing::ValuesIn(case_parameters()),
                         [](const ::testing::TestParamInfo<CaseParameter>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace mg::conformance
