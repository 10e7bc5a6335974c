#pragma once
// The conformance cases (op_cases.cpp): one small graph per registered op that the device runs
// against the f64 reference interpreter (conformance_test.cpp), in the spirit of ggml's
// test-backend-ops. A new op needs a case here, and the test says so.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/ops.hpp"
#include "ops/interpreter.hpp"

namespace mg::conformance {

struct CaseInput {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  double low = -1.0, high = 1.0;  // drawn uniformly; i32 inputs draw integers in [low, high)
  bool whole = false;             // f32 values that are whole numbers in [low, high)
};

// The graph of a case and the inputs it draws.
class CaseGraph {
 public:
  explicit CaseGraph(DType dtype) : dtype_(dtype) {}

  // A float input of the case's dtype drawn from [low, high).
  Tensor in(std::string name, Shape shape, double low = -1.0, double high = 1.0);
  // An f32 input whatever the case's dtype.
  Tensor in_f32(std::string name, Shape shape, double low = -1.0, double high = 1.0);
  // An f16 input whatever the case's dtype.
  Tensor in_f16(std::string name, Shape shape, double low = -1.0, double high = 1.0);
  // f32 whole numbers in [low, high).
  Tensor whole(std::string name, Shape shape, int64_t low, int64_t high);
  // i32 indices in [0, rows).
  Tensor indices(std::string name, Shape shape, int64_t rows);
  void out(Tensor value);  // the case's output, "y"

  DType dtype() const { return dtype_; }
  Graph graph;
  std::vector<CaseInput> inputs;

 private:
  DType dtype_;
};

struct OpCase {
  std::string_view op;  // an op::* constant: the op the case must dispatch
  std::function<void(CaseGraph&)> build;
  double tolerance = 1e-5;  // normalised L2 error against the reference
  // The dtypes of the case's float inputs (CaseGraph::in); f16 tensors run through the f16
  // storage pass, on devices that have f16 storage and arithmetic.
  std::vector<DType> dtypes = {DType::f32};
  // Only the cooperative-matrix GEMM runs it (fast precision, on devices that have them).
  bool needs_cooperative_matrices = false;
};

// Every case, one or more per registered op other than the leaves.
const std::vector<OpCase>& op_cases();

// Seeded values of a case's inputs, as the device stores them (f32 values; whole numbers where
// asked; f16 inputs are rounded by the reference and the device alike).
Environment draw_inputs(const CaseGraph& built, uint64_t seed);

}  // namespace mg::conformance
