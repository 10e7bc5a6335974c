#pragma once
// The generated pointwise archetype: one thread per output element evaluates a small DAG of
// elementwise ops over broadcast inputs. A single elementwise node is a DAG of one statement;
// the fusion pass hands over longer chains.
#include <map>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"

namespace mg::kernels {

struct PointwiseStatement {
  std::string op;
  Attrs attrs;
  // Arguments: >= 0 is an input index, < 0 is statement (-1 - index) of this DAG.
  std::vector<int> arguments;
};

// A value of the DAG that its kernel writes besides the result: statement `statement`, which
// has the result's shape (a value the graph keeps, fused into its consumer's kernel).
struct PointwiseExtraOutput {
  ValueId value = kNoValue;
  size_t statement = 0;
};

// How a DAG input lives in a transpose's memory: the transpose's result (through reshapes), which
// has no launch, read from the transpose's input where the transpose took each element; or, where
// `stored_moved`, the transpose's input (through reshapes), which its producer stored only where
// the transpose moves each element, read from there.
struct TransposedRead {
  ValueId transpose = kNoValue;
  bool stored_moved = false;
};

struct PointwiseDag {
  std::vector<ValueId> inputs;
  std::vector<PointwiseStatement> statements;  // the last one is the result
  ValueId output = kNoValue;
  std::vector<PointwiseExtraOutput> extra_outputs;  // each of its value's dtype: f32, f16, bf16
  // Inputs read as if reshaped (the inputs of a small DAG that the DAG evaluates through a
  // reshape of its result, fusion.cpp): the shape that broadcasts them, by input.
  std::map<ValueId, Shape> viewed_as;
  // A transpose of the result (through reshapes, its innermost axis kept in place) that the
  // launch writes instead of the result, each element where the transpose moves it (fusion.cpp).
  ValueId moved_to = kNoValue;
  // Inputs read, element for element, from a transpose's memory (fusion.cpp; the transpose keeps
  // the innermost axis in place), by input.
  std::map<ValueId, TransposedRead> read_through;
  // Some of its nodes reach the result through reshapes that prepend unit axes (fusion.cpp), so
  // not all of them have the result's rank: kernels that index the DAG's inputs by the result's
  // coordinates (a pointwise launch, a norm's prologue) read them as broadcast from the right;
  // those that index them by other coordinates (a GEMM's store) do not take it.
  bool through_unit_axes = false;
};

bool is_pointwise_op(std::string_view op);
// round_to_f16, widen_f16, round_to_bf16 and widen_bf16: pointwise for fusion (a fused DAG
// converts at its loads, stores and in registers), but a launch of their own runs the vectorised
// conversion kernel (backends/vulkan/kernels/gemm_workgroup.cpp), widen_bf16's a pointwise one.
bool is_half_conversion_op(std::string_view op);
bool is_half_rounding_op(std::string_view op);  // round_to_f16, round_to_bf16
bool is_half_widening_op(std::string_view op);  // widen_f16, widen_bf16
// Whether `dag` rounds to or widens from f16 or bf16 (fused conversions of the f16 storage and
// half activations passes).
bool converts_half(const PointwiseDag& dag);
// Whether a launch binding `operands` and evaluating `dags` (null entries skipped) needs f16
// buffers and arithmetic: an f16 operand, or a DAG that converts (a rounding in registers only
// needs them alike, as its unfused conversions would); throws as require_f16_tensors, naming
// `label`, where the device lacks them.
bool launch_needs_f16(const Graph& graph, const std::vector<Operand>& operands,
                      const std::vector<const PointwiseDag*>& dags, const std::string& label,
                      const DeviceTraits& device);

// GLSL helpers (mg_erf, mg_gelu, ...) that the statements below call; once per shader.
std::string_view pointwise_functions_glsl();

// transpose_index_function_glsl of transpose node `transpose` (its input's shape, its own).
std::string transpose_index_function(const Graph& graph, ValueId transpose,
                                     const std::string& function, bool forward);

// Statements `float t<s> = ...;` that evaluate `dag`, given one float-valued GLSL expression
// per DAG input; shared by pointwise_launch and the matmul epilogue (gemm_epilogue.hpp).
std::string pointwise_statements_glsl(const PointwiseDag& dag,
                                      const std::vector<std::string>& input_expressions);
// The variable that holds statement `statement`'s value after those statements.
std::string pointwise_value_glsl(size_t statement);
// The variable that holds the DAG's result after those statements.
std::string pointwise_result_glsl(const PointwiseDag& dag);
// The sum of `partials` split partial results at element `index` of `view`, partial s at
// `index` + s * `stride`, added in their order as the reduction it replaces adds them.
std::string partials_sum_glsl(const std::string& view, const std::string& index, int64_t partials,
                              int64_t stride);

Launch pointwise_launch(const Graph& graph, const PointwiseDag& dag, const DeviceTraits& device,
                        std::string label);

// `float <function>(uint i)`: the value of `dag` at element i of its result, for a kernel that
// evaluates the DAG where it would read its result (a reduction's prologue, fusion.cpp), once
// for each element. Reads each input but uniform constants as an operand named in<k> and writes
// each extra output at element i as extra<k>, appended to `operands` in that order; the value of
// statement `exported`[k] is left in the global `float exported<k>`. Operand names start with
// `prefix`, so that one kernel can evaluate two DAGs. The DAG reads no f16 values.
std::string pointwise_element_function_glsl(const Graph& graph, const PointwiseDag& dag,
                                            const std::string& function,
                                            std::vector<Operand>& operands,
                                            const std::vector<size_t>& exported = {},
                                            const std::string& prefix = "");

// `void <function>(uint i, float value)`: evaluates `dag` at element i of its result with input
// `given` taken as `value`, for a kernel that computes that input and evaluates its pointwise
// reader as it stores each element (a normalisation's epilogue, norm.cpp). Reads the other inputs
// but uniform constants as operands named `prefix`in<k>, then writes the result as
// `prefix`result and each extra output as `prefix`extra<k>, appended to `operands` in that order.
// The DAG reads no f16 values and its result is f32.
std::string pointwise_store_function_glsl(const Graph& graph, const PointwiseDag& dag, size_t given,
                                          const std::string& function,
                                          std::vector<Operand>& operands,
                                          const std::string& prefix);

// A reduction's prologue (fusion.cpp): the pointwise DAG that a sum or mean evaluates as it
// reads each element instead of reading the DAG's result from memory, and where one exists a
// sibling, a second sum or mean over the same rows of one of the DAG's values, which the same
// launch computes beside the first.
struct ReductionPrologue {
  PointwiseDag dag;
  ValueId sibling = kNoValue;
  size_t sibling_statement = 0;  // the statement of `dag` whose value the sibling reduces
};

// The launch of reduction `id` (a sum, mean or max of f32 values, reduction.cpp) with
// `prologue`.
Launch reduction_with_prologue(const Graph& graph, ValueId id, const ReductionPrologue& prologue,
                               const DeviceTraits& device);

}  // namespace mg::kernels
