#include "backends/vulkan/kernels/pointwise.hpp"

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "ir/op_names.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

namespace mg::kernels {
std::string partials_sum_glsl(const std::string& view, const std::string& index, int64_t partials,
                              int64_t stride) {
  std::string sum;
  for (int64_t s = 0; s < partials; ++s) {
    if (s > 0) sum += " + ";
    sum += view + "[" + index + (s == 0 ? "" : " + " + glsl_uint(s * stride)) + "]";
  }
  return "(" + sum + ")";
}

namespace {

constexpr uint32_t kLocalSize = 256;

// Numerics GLSL lacks or defines loosely: erf, a tanh that stays finite, pow of negative bases.
constexpr std::string_view kPointwiseFunctions = R"glsl(
float mg_erf(float x) {
  // Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7, near f32 rounding.
  float t = 1.0 / (1.0 + 0.3275911 * abs(x));
  float y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t +
                   0.254829592) * t * exp(-x * x);
  return sign(x) * y;
}
float mg_tanh(float x) { return tanh(clamp(x, -15.0, 15.0)); }
float mg_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float mg_pow(float a, float b) {
  if (b == round(b)) {
    float r = pow(abs(a), b);
    return (a < 0.0 && mod(abs(b), 2.0) == 1.0) ? -r : r;
  }
  return pow(a, b);
}
// x rounded to the nearest f16 (ties to even), held as an f32: fused kernels round each f16
// result in registers (round_to_f16). In integer arithmetic, because a driver may take
// float(float16_t(x)) for x itself: NVIDIA's does, dropping every rounding of a fused chain. Below f16's smallest normal (2^-14) the steps are 2^-24, where the scaling by
// 2^24 and back is exact; above 65504 the value rounds to infinity.
float mg_round_f16(float x) {
  if (isnan(x)) return x;
  if (abs(x) < 6.103515625e-05) return roundEven(x * 16777216.0) * 5.9604644775390625e-08;
  uint bits = floatBitsToUint(x);
  bits = (bits + 0xFFFu + ((bits >> 13) & 1u)) & 0xFFFFE000u;
  if (abs(uintBitsToFloat(bits)) > 65504.0) bits = (bits & 0x80000000u) | 0x7F800000u;
  return uintBitsToFloat(bits);
}
// x rounded to the nearest bfloat16 (ties to even), held as an f32: its upper 16 bits. Past the
// largest bfloat16 the carry gives infinity; a NaN stays a quiet NaN.
float mg_round_bf16(float x) {
  if (isnan(x)) return uintBitsToFloat(0x7FC00000u);
  uint bits = floatBitsToUint(x);
  return uintBitsToFloat((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
}
// bfloat16 values are stored as their bit patterns (uint16_t elements, or uvec2 for four), which
// only needs 16-bit storage: no 16-bit variable is declared.
float mg_widen_bf16(uint bits) { return uintBitsToFloat(bits << 16); }
uint mg_bf16_bits(float x) { return floatBitsToUint(mg_round_bf16(x)) >> 16; }
vec4 mg_widen_bf16x4(uvec2 pair) {
  return vec4(uintBitsToFloat(pair.x << 16), uintBitsToFloat(pair.x & 0xFFFF0000u),
              uintBitsToFloat(pair.y << 16), uintBitsToFloat(pair.y & 0xFFFF0000u));
}
uvec2 mg_bf16x4(vec4 v) {
  return uvec2(mg_bf16_bits(v.x) | (mg_bf16_bits(v.y) << 16),
               mg_bf16_bits(v.z) | (mg_bf16_bits(v.w) << 16));
}
const float kSqrtHalf = 0.70710678118654752;
const float kSqrt2OverPi = 0.79788456080286536;
float mg_gelu(float x) { return 0.5 * x * (1.0 + mg_erf(x * kSqrtHalf)); }
float mg_gelu_tanh(float x) {
  return 0.5 * x * (1.0 + mg_tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
float mg_gelu_grad(float x) {
  return 0.5 * (1.0 + mg_erf(x * kSqrtHalf)) + x * 0.39894228040143268 * exp(-0.5 * x * x);
}
float mg_gelu_tanh_grad(float x) {
  float inner = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  float t = mg_tanh(inner);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 0.134145 * x * x);
}
)glsl";

// GLSL for each op, with $0, $1, $2 standing for the arguments.
const std::map<std::string_view, std::string_view>& expressions() {
  static const std::map<std::string_view, std::string_view> table = {
      {op::add, "$0 + $1"},
      {op::sub, "$0 - $1"},
      {op::mul, "$0 * $1"},
      {op::div, "$0 / $1"},
      {op::pow, "mg_pow($0, $1)"},
      {op::maximum, "max($0, $1)"},
      {op::minimum, "min($0, $1)"},
      {op::equal, "float($0 == $1)"},
      {op::less, "float($0 < $1)"},
      {op::less_equal, "float($0 <= $1)"},
      {op::greater, "float($0 > $1)"},
      {op::greater_equal, "float($0 >= $1)"},
      {op::where, "($0 != 0.0) ? $1 : $2"},
      {op::neg, "-$0"},
      {op::abs, "abs($0)"},
      {op::exp, "exp($0)"},
      {op::log, "log($0)"},
      {op::sqrt, "sqrt($0)"},
      {op::rsqrt, "inversesqrt($0)"},
      {op::recip, "1.0 / $0"},
      {op::square, "$0 * $0"},
      {op::sin, "sin($0)"},
      {op::cos, "cos($0)"},
      {op::relu, "max($0, 0.0)"},
      {op::silu, "$0 * mg_sigmoid($0)"},
      {op::sigmoid, "mg_sigmoid($0)"},
      {op::tanh, "mg_tanh($0)"},
      {op::broadcast_to, "$0"},
      {op::cast, "$0"},
  };
  return table;
}

std::string expression_for(const PointwiseStatement& statement) {
  // The conversions of the f16 storage and half activations passes, fused: the value rounded
  // to f16 (bfloat16) where it is one (a DAG converts its 16-bit inputs as it loads them and its
  // 16-bit results as it stores them, so widening is the value itself).
  if (statement.op == op::round_to_f16) return "mg_round_f16($0)";
  if (statement.op == op::round_to_bf16) return "mg_round_bf16($0)";
  if (statement.op == op::widen_f16 || statement.op == op::widen_bf16) return "$0";
  if (statement.op == op::gelu) {
    return statement.attrs.get_string("approximate", "none") == "tanh" ? "mg_gelu_tanh($0)"
                                                                       : "mg_gelu($0)";
  }
  if (statement.op == op::gelu_grad) {
    return statement.attrs.get_string("approximate", "none") == "tanh"
               ? "mg_gelu_tanh_grad($0) * $1"
               : "mg_gelu_grad($0) * $1";
  }
  auto it = expressions().find(statement.op);
  if (it == expressions().end())
    throw Error("internal: no pointwise expression for " + statement.op);
  return std::string(it->second);
}

std::string substitute(const std::string& expression, const std::vector<std::string>& arguments) {
  std::string text;
  for (size_t i = 0; i < expression.size(); ++i) {
    if (expression[i] == '$' && i + 1 < expression.size()) {
      text += "(" + arguments.at(expression[++i] - '0') + ")";
    } else {
      text += expression[i];
    }
  }
  return text;
}

}  // namespace

bool is_pointwise_op(std::string_view op) {
  return expressions().count(op) > 0 || op == op::gelu || op == op::gelu_grad ||
         is_half_conversion_op(op);
}

bool is_half_conversion_op(std::string_view op) {
  return is_half_rounding_op(op) || is_half_widening_op(op);
}

bool is_half_rounding_op(std::string_view op) {
  return op == op::round_to_f16 || op == op::round_to_bf16;
}

bool is_half_widening_op(std::string_view op) {
  return op == op::widen_f16 || op == op::widen_bf16;
}

bool converts_half(const PointwiseDag& dag) {
  return std::any_of(
      dag.statements.begin(), dag.statements.end(),
      [](const PointwiseStatement& statement) { return is_half_conversion_op(statement.op); });
}

bool launch_needs_f16(const Graph& graph, const std::vector<Operand>& operands,
                      const std::vector<const PointwiseDag*>& dags, const std::string& label,
                      const DeviceTraits& device) {
  const bool needs =
      std::any_of(
          operands.begin(), operands.end(),
          [&](const Operand& operand) { return is_half_dtype(graph.type(operand.value).dtype); }) ||
      std::any_of(dags.begin(), dags.end(),
                  [](const PointwiseDag* dag) { return dag && converts_half(*dag); });
  if (needs) require_f16_tensors(label, "reads or writes", device);
  return needs;
}

std::string_view pointwise_functions_glsl() {
  return kPointwiseFunctions;
}

std::string pointwise_statements_glsl(const PointwiseDag& dag,
                                      const std::vector<std::string>& input_expressions) {
  std::string text;
  for (size_t s = 0; s < dag.statements.size(); ++s) {
    const PointwiseStatement& statement = dag.statements[s];
    std::vector<std::string> arguments;
    for (int argument : statement.arguments) {
      arguments.push_back(argument >= 0 ? input_expressions.at(argument)
                                        : pointwise_value_glsl(-1 - argument));
    }
    text += "  float " + pointwise_value_glsl(s) + " = " +
            substitute(expression_for(statement), arguments) + ";\n";
  }
  return text;
}

std::string pointwise_value_glsl(size_t statement) {
  return "t" + std::to_string(statement);
}

std::string pointwise_result_glsl(const PointwiseDag& dag) {
  return pointwise_value_glsl(dag.statements.size() - 1);
}

namespace {

// Each thread computes this many consecutive elements (one vec4) when the inputs allow it, and
// otherwise this many elements kLocalSize apart (coalesced scalar accesses).
constexpr uint32_t kElementsPerThread = 4;

// How a kernel reads one DAG input.
enum class InputKind {
  constant,   // a uniform constant: a literal in the source
  full,       // the output's element count: read at the output's linear index
  single,     // one element, broadcast everywhere
  broadcast,  // anything else: indexed through output coordinates
  partials,   // `partials` times the output's element count: split partial results, summed
};

struct InputAccess {
  InputKind kind = InputKind::constant;
  std::string name;  // the buffer's array ("in3"), or the literal for constants
  DType dtype = DType::f32;
  uint32_t binding = 0;       // operand index, for the vector view of the same buffer
  std::vector<bool> present;  // broadcast inputs: varies along each collapsed output axis
  int64_t partials = 0;       // partials inputs: how many
  // Full inputs read through a transpose (PointwiseDag::read_through): the function that takes
  // an element's index to its place in the bound transpose input ("in0_from").
  std::string moved_from;
  // Whether the transpose moves whole vec4s (its innermost axis, which it keeps in place, a
  // multiple of four long): a vec4 of the result is then one vec4 of the bound input.
  bool moved_in_vec4s = false;
};

// Whether transpose `transpose` moves its input's elements in whole vec4s.
bool moves_vec4s(const Graph& graph, ValueId transpose) {
  return graph.type(graph.node(transpose).inputs[0]).shape.back() % 4 == 0;
}

// Element `index` of a full input (or vec4 `index` / 4 of its vector view `view`).
std::string full_element(const InputAccess& input, const std::string& view,
                         const std::string& index) {
  return input.moved_from.empty() ? view + "[" + index + "]"
                                  : view + "[" + input.moved_from + "(" + index + ")]";
}

// The functions that take an element of `dag`'s result to its place in each input read from a
// transpose's memory: `uint <moved_from>(uint i)`.
std::string moved_from_functions(const Graph& graph, const PointwiseDag& dag,
                                 const std::vector<InputAccess>& inputs) {
  std::string text;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].moved_from.empty()) continue;
    const TransposedRead& read = dag.read_through.at(dag.inputs[k]);
    text +=
        transpose_index_function(graph, read.transpose, inputs[k].moved_from, read.stored_moved);
  }
  return text;
}

// The sum of a partials input's results at linear element `index` (or vec4 `index` of its
// vector view).
std::string partials_sum(const InputAccess& input, const std::string& view,
                         const std::string& index, int64_t stride) {
  return partials_sum_glsl(view, index, input.partials, stride);
}

// The output shape with extent-1 axes dropped and neighbouring axes merged wherever every
// broadcast input either varies along both or along neither, so that coordinates need as few
// divisions as possible. Fills each broadcast input's `present`.
std::vector<int64_t> collapse_axes(const Graph& graph, const PointwiseDag& dag, const Shape& shape,
                                   std::vector<InputAccess>& inputs) {
  std::vector<int64_t> extents;
  std::vector<bool> previous;  // which broadcast inputs vary along the last collapsed axis
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] == 1) continue;
    std::vector<bool> varies;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].kind != InputKind::broadcast) continue;
      const auto viewed = dag.viewed_as.find(dag.inputs[k]);
      const Shape& input_shape =
          viewed != dag.viewed_as.end() ? viewed->second : graph.type(dag.inputs[k]).shape;
      const size_t offset = shape.size() - input_shape.size();
      varies.push_back(axis >= offset && input_shape[axis - offset] != 1);
    }
    if (!extents.empty() && varies == previous) {
      extents.back() *= shape[axis];
      continue;
    }
    extents.push_back(shape[axis]);
    size_t b = 0;
    for (InputAccess& input : inputs) {
      if (input.kind == InputKind::broadcast) input.present.push_back(varies[b++]);
    }
    previous = std::move(varies);
  }
  return extents;
}

// Flat index into a broadcast input from the collapsed coordinates `prefix`0, `prefix`1, ...
std::string broadcast_index(const InputAccess& input, const std::vector<int64_t>& extents,
                            const std::string& prefix) {
  std::string index;
  int64_t stride = 1;
  for (size_t axis = extents.size(); axis-- > 0;) {
    if (!input.present[axis]) continue;
    const std::string term =
        prefix + std::to_string(axis) + (stride == 1 ? std::string() : " * " + glsl_uint(stride));
    index = index.empty() ? term : term + " + " + index;
    stride *= extents[axis];
  }
  return index.empty() ? "0u" : index;
}

std::string as_float(const std::string& load, DType dtype) {
  if (dtype == DType::bf16) return "mg_widen_bf16(uint(" + load + "))";
  return dtype == DType::f32 ? load : "float(" + load + ")";
}

// The element type of a buffer's vector view: four elements.
std::string vector_type(DType dtype) {
  switch (dtype) {
    case DType::i32:
      return "ivec4";
    case DType::u32:
      return "uvec4";
    case DType::f16:
      return "f16vec4";
    case DType::bf16:
      return "uvec2";
    default:
      return "vec4";
  }
}

// `load`, four elements of a vector view of a `dtype` buffer, as a vec4.
std::string vector_as_float(const std::string& load, DType dtype) {
  if (dtype == DType::bf16) return "mg_widen_bf16x4(" + load + ")";
  return dtype == DType::f32 ? load : "vec4(" + load + ")";
}

// `lanes`, a vec4, as four elements of a vector view of a `dtype` buffer.
std::string vector_stored_as(const std::string& lanes, DType dtype) {
  if (dtype == DType::bf16) return "mg_bf16x4(" + lanes + ")";
  return dtype == DType::f32 ? lanes : vector_type(dtype) + "(" + lanes + ")";
}

std::string scalar_type(DType dtype) {
  switch (dtype) {
    case DType::i32:
      return "int";
    case DType::u32:
      return "uint";
    case DType::f16:
      return "float16_t";
    default:
      return "float";
  }
}

// `value` (an f32 expression) as an element of a `dtype` buffer takes it.
std::string stored_as(const std::string& value, DType dtype) {
  if (dtype == DType::bf16) return "uint16_t(mg_bf16_bits(" + value + "))";
  return dtype == DType::f32 ? value : scalar_type(dtype) + "(" + value + ")";
}

// The dtypes of `dag`'s extra outputs, in order.
std::vector<DType> extra_dtypes(const Graph& graph, const PointwiseDag& dag) {
  std::vector<DType> dtypes;
  for (const PointwiseExtraOutput& extra : dag.extra_outputs)
    dtypes.push_back(graph.type(extra.value).dtype);
  return dtypes;
}

// The vector view `name`_x4 of operand `binding`.
std::string vector_view(const std::string& name, DType dtype, uint32_t binding, bool write) {
  return vector_buffer_view(name + "_x4", binding, write, vector_type(dtype));
}

// The statements of one element, its result stored to `store` and extra output k to
// `extra_stores[k]`, an element of a buffer of `extra_dtypes[k]` (f32 where none is given: a
// vector lane in registers).
std::string element_glsl(const PointwiseDag& dag, const std::vector<std::string>& input_expressions,
                         DType output_dtype, const std::string& store,
                         const std::vector<std::string>& extra_stores,
                         const std::vector<DType>& extra_dtypes = {}) {
  std::string text = pointwise_statements_glsl(dag, input_expressions) + "  " + store + " = " +
                     stored_as(pointwise_result_glsl(dag), output_dtype) + ";\n";
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k) {
    const DType dtype = k < extra_dtypes.size() ? extra_dtypes[k] : DType::f32;
    text += "  " + extra_stores[k] + " = " +
            stored_as(pointwise_value_glsl(dag.extra_outputs[k].statement), dtype) + ";\n";
  }
  return text;
}

// Extra output k's store target: `name`<k> followed by `suffix` ("[i]", ".x", ...).
std::vector<std::string> extra_stores(const PointwiseDag& dag, const std::string& name,
                                      const std::string& suffix) {
  std::vector<std::string> stores;
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k)
    stores.push_back(name + std::to_string(k) + suffix);
  return stores;
}

// How `dag` reads each input (a result of `count` elements), each but uniform constants bound as
// the next of `operands`, named `prefix`in<k>. Input `given`, where there is one, is not read:
// the GLSL variable `value` holds it.
std::vector<InputAccess> input_accesses(const Graph& graph, const PointwiseDag& dag, int64_t count,
                                        std::vector<Operand>& operands,
                                        const std::string& prefix = "",
                                        std::optional<size_t> given = std::nullopt) {
  std::vector<InputAccess> inputs(dag.inputs.size());
  for (size_t k = 0; k < dag.inputs.size(); ++k) {
    const Node& input_node = graph.node(dag.inputs[k]);
    InputAccess& input = inputs[k];
    if (given == k) {
      input.name = "value";
      continue;
    }
    if (input_node.is_uniform_constant()) {
      input.name = glsl_float(input_node.attrs.get_float("value"));
      continue;
    }
    const int64_t elements = input_node.type.elements();
    // Only a fused split-K sum gives a DAG an input larger than its result (fusion.cpp).
    input.kind = elements == count                           ? InputKind::full
                 : elements > count && elements % count == 0 ? InputKind::partials
                 : elements == 1                             ? InputKind::single
                                                             : InputKind::broadcast;
    if (input.kind == InputKind::partials) input.partials = elements / count;
    input.name = prefix + "in" + std::to_string(k);
    input.dtype = input_node.type.dtype;
    input.binding = static_cast<uint32_t>(operands.size());
    ValueId bound = dag.inputs[k];
    if (auto it = dag.read_through.find(bound); it != dag.read_through.end()) {
      if (input.kind != InputKind::full)
        throw std::logic_error("a DAG reads the transpose %" +
                               std::to_string(it->second.transpose) +
                               " other than element for element");
      input.moved_from = input.name + "_from";
      input.moved_in_vec4s = moves_vec4s(graph, it->second.transpose);
      bound = it->second.stored_moved ? it->second.transpose
                                      : graph.node(it->second.transpose).inputs[0];
    }
    operands.push_back({input.name, bound, false});
  }
  return inputs;
}

// Each input's value at element i (scalar loads; broadcast inputs at the collapsed coordinates
// c0, c1, ... of `extents`).
std::vector<std::string> scalar_inputs_glsl(const std::vector<InputAccess>& inputs,
                                            const std::vector<int64_t>& extents, int64_t count) {
  std::vector<std::string> element_inputs;
  for (const InputAccess& input : inputs) {
    switch (input.kind) {
      case InputKind::constant:
        element_inputs.push_back(input.name);
        break;
      case InputKind::full:
        element_inputs.push_back(as_float(full_element(input, input.name, "i"), input.dtype));
        break;
      case InputKind::single:
        element_inputs.push_back(as_float(input.name + "[0]", input.dtype));
        break;
      case InputKind::broadcast:
        element_inputs.push_back(
            as_float(input.name + "[" + broadcast_index(input, extents, "c") + "]", input.dtype));
        break;
      case InputKind::partials:
        element_inputs.push_back(partials_sum(input, input.name, "i", count));
        break;
    }
  }
  return element_inputs;
}

bool any_broadcast(const std::vector<InputAccess>& inputs) {
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const InputAccess& in) { return in.kind == InputKind::broadcast; });
}

}  // namespace

Launch pointwise_launch(const Graph& graph, const PointwiseDag& dag, const DeviceTraits& device,
                        std::string label) {
  const TensorType& output_type = graph.type(dag.output);
  const int64_t count = output_type.elements();
  const DType output_dtype = output_type.dtype;

  Launch launch;
  launch.label = std::move(label);
  // A result stored, or inputs read, where a transpose moves them take no input's place (the
  // planner's in-place choice is for "pointwise", which reads and writes each element at once).
  const bool moved = dag.moved_to != kNoValue;
  launch.kernel = moved || !dag.read_through.empty() ? "pointwise_moved" : "pointwise";
  std::vector<InputAccess> inputs = input_accesses(graph, dag, count, launch.operands);
  // Extra outputs bind before the result, which stays the last operand (the planner's in-place
  // choice writes only the result over a dying input).
  const uint32_t first_extra_binding = static_cast<uint32_t>(launch.operands.size());
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k)
    launch.operands.push_back({"extra" + std::to_string(k), dag.extra_outputs[k].value, true});
  const uint32_t result_binding = static_cast<uint32_t>(launch.operands.size());
  launch.operands.push_back({"result", moved ? dag.moved_to : dag.output, true});
  launch.f16_operands = launch_needs_f16(graph, launch.operands, {&dag}, launch.label, device);
  // Where element i of the result is stored: at i, or at its place in the transpose.
  std::string store_functions;
  const auto stored_at = [&](const std::string& index) {
    return moved ? "moved_index(" + index + ")" : index;
  };
  if (moved) store_functions = transpose_index_function(graph, dag.moved_to, "moved_index", true);

  const std::vector<int64_t> extents = collapse_axes(graph, dag, output_type.shape, inputs);
  const bool has_broadcast = any_broadcast(inputs);
  // Groups of four consecutive elements share every broadcast input's coordinates except along
  // the innermost axis, so they load as one vec4 or one splatted scalar.
  const bool has_partials = std::any_of(inputs.begin(), inputs.end(), [](const InputAccess& in) {
    return in.kind == InputKind::partials;
  });
  // A partials input's vec4s line up with the result's only where the count is a multiple of 4.
  const bool vectorised = count >= kElementsPerThread &&
                          (!has_broadcast || extents.back() % kElementsPerThread == 0) &&
                          (!has_partials || count % kElementsPerThread == 0);

  std::string body = std::string(pointwise_functions_glsl()) + store_functions +
                     moved_from_functions(graph, dag, inputs);
  const std::string local = std::to_string(kLocalSize);
  if (vectorised) {
    const int64_t groups = count / kElementsPerThread;
    for (const InputAccess& input : inputs) {
      const bool vector_load =
          (input.kind == InputKind::full && (input.moved_from.empty() || input.moved_in_vec4s)) ||
          input.kind == InputKind::partials ||
          (input.kind == InputKind::broadcast && input.present.back());
      if (vector_load) body += vector_view(input.name, input.dtype, input.binding, false);
    }
    body += vector_view("result", output_dtype, result_binding, true);
    for (size_t k = 0; k < dag.extra_outputs.size(); ++k) {
      body += vector_view("extra" + std::to_string(k), graph.type(dag.extra_outputs[k].value).dtype,
                          first_extra_binding + static_cast<uint32_t>(k), true);
    }
    body += "layout(local_size_x = " + local + ") in;\nvoid main() {\n";
    body += "  uint g = linear_workgroup() * " + local + "u + gl_LocalInvocationID.x;\n";
    body += "  if (g < " + glsl_uint(groups) + ") {\n";
    if (has_broadcast) body += coordinates_glsl(extents, "g * 4u");
    for (size_t k = 0; k < inputs.size(); ++k) {
      const InputAccess& input = inputs[k];
      const std::string value = "  vec4 a" + std::to_string(k) + " = ";
      if (input.kind == InputKind::full && !input.moved_from.empty() && !input.moved_in_vec4s) {
        // Four elements where the transpose took them.
        std::string lanes;
        for (int lane = 0; lane < 4; ++lane) {
          lanes +=
              (lane ? ", " : "") +
              as_float(full_element(input, input.name, "g * 4u + " + std::to_string(lane) + "u"),
                       input.dtype);
        }
        body += value + "vec4(" + lanes + ");\n";
      } else if (input.kind == InputKind::full) {
        const std::string load = input.moved_from.empty()
                                     ? input.name + "_x4[g]"
                                     : input.name + "_x4[" + input.moved_from + "(g * 4u) / 4u]";
        body += value + vector_as_float(load, input.dtype) + ";\n";
      } else if (input.kind == InputKind::partials) {
        body += value + partials_sum(input, input.name + "_x4", "g", count / kElementsPerThread) +
                ";\n";
      } else if (input.kind == InputKind::single) {
        body += value + "vec4(" + as_float(input.name + "[0]", input.dtype) + ");\n";
      } else if (input.kind == InputKind::broadcast) {
        const std::string index = broadcast_index(input, extents, "c");
        body += value +
                (input.present.back()
                     ? vector_as_float(input.name + "_x4[(" + index + ") / 4u]", input.dtype)
                     : "vec4(" + as_float(input.name + "[" + index + "]", input.dtype) + ")") +
                ";\n";
      }
    }
    // Lanes are computed into r, of the result's vector type where it can be declared (a
    // bfloat16 result is packed from an f32 vec4 as it is stored).
    const DType lane_dtype = output_dtype == DType::bf16 ? DType::f32 : output_dtype;
    const bool packs_result = lane_dtype != output_dtype;
    body += "  " + vector_type(lane_dtype) + " r;\n";
    for (size_t k = 0; k < dag.extra_outputs.size(); ++k)
      body += "  vec4 e" + std::to_string(k) + ";\n";
    for (const char* lane : {"x", "y", "z", "w"}) {
      std::vector<std::string> lane_inputs;
      for (size_t k = 0; k < inputs.size(); ++k) {
        lane_inputs.push_back(inputs[k].kind == InputKind::constant
                                  ? inputs[k].name
                                  : "a" + std::to_string(k) + "." + lane);
      }
      body += "  {\n" +
              element_glsl(dag, lane_inputs, lane_dtype, std::string("r.") + lane,
                           extra_stores(dag, "e", std::string(".") + lane)) +
              "  }\n";
    }
    if (moved && !moves_vec4s(graph, dag.moved_to)) {
      // Each element where the transpose moves it.
      for (int lane = 0; lane < 4; ++lane)
        body += "  result[moved_index(g * 4u + " + std::to_string(lane) + "u)] = " +
                (packs_result ? stored_as(std::string("r.") + "xyzw"[lane], output_dtype)
                              : std::string("r.") + "xyzw"[lane]) +
                ";\n";
    } else {
      body += "  result_x4[" + (moved ? "moved_index(g * 4u) / 4u" : std::string("g")) +
              "] = " + (packs_result ? vector_stored_as("r", output_dtype) : "r") + ";\n";
    }
    for (size_t k = 0; k < dag.extra_outputs.size(); ++k) {
      const DType dtype = graph.type(dag.extra_outputs[k].value).dtype;
      const std::string lanes = "e" + std::to_string(k);
      body += "  extra" + std::to_string(k) + "_x4[g] = " + vector_stored_as(lanes, dtype) + ";\n";
    }
    body += "  }\n";
    if (count % kElementsPerThread != 0) {
      // The last few elements, without broadcast or partials inputs (those imply a multiple of
      // four).
      std::vector<std::string> tail_inputs;
      for (const InputAccess& input : inputs) {
        tail_inputs.push_back(input.kind == InputKind::constant ? input.name
                              : input.kind == InputKind::single
                                  ? as_float(input.name + "[0]", input.dtype)
                                  : as_float(full_element(input, input.name, "i"), input.dtype));
      }
      body += "  if (g == " + glsl_uint(groups) + ") {\n";
      body += "  for (uint i = " + glsl_uint(groups * kElementsPerThread) + "; i < " +
              glsl_uint(count) + "; ++i) {\n";
      body += element_glsl(dag, tail_inputs, output_dtype, "result[" + stored_at("i") + "]",
                           extra_stores(dag, "extra", "[i]"), extra_dtypes(graph, dag)) +
              "  }\n  }\n";
    }
    body += "}\n";
    launch.groups = grid_for(static_cast<uint64_t>(groups + (count % kElementsPerThread != 0)),
                             kLocalSize, device);
  } else {
    const std::vector<std::string> element_inputs = scalar_inputs_glsl(inputs, extents, count);
    body += "layout(local_size_x = " + local + ") in;\nvoid main() {\n";
    body += "  uint first = linear_workgroup() * " +
            glsl_uint(int64_t{kLocalSize} * kElementsPerThread) + " + gl_LocalInvocationID.x;\n";
    body += "  for (uint j = 0u; j < " + glsl_uint(kElementsPerThread) + "; ++j) {\n";
    body += "  uint i = first + j * " + local + "u;\n";
    body += "  if (i >= " + glsl_uint(count) + ") return;\n";
    if (has_broadcast) body += coordinates_glsl(extents, "i");
    body += element_glsl(dag, element_inputs, output_dtype, "result[" + stored_at("i") + "]",
                         extra_stores(dag, "extra", "[i]"), extra_dtypes(graph, dag)) +
            "  }\n}\n";
    launch.groups =
        grid_for((static_cast<uint64_t>(count) + kElementsPerThread - 1) / kElementsPerThread,
                 kLocalSize, device);
  }
  launch.body = std::move(body);
  return launch;
}

std::string pointwise_element_function_glsl(const Graph& graph, const PointwiseDag& dag,
                                            const std::string& function,
                                            std::vector<Operand>& operands,
                                            const std::vector<size_t>& exported,
                                            const std::string& prefix) {
  const Shape& shape = graph.type(dag.output).shape;
  const int64_t count = graph.type(dag.output).elements();
  std::vector<InputAccess> inputs = input_accesses(graph, dag, count, operands, prefix);
  const std::vector<int64_t> extents = collapse_axes(graph, dag, shape, inputs);
  const std::vector<std::string> element_inputs = scalar_inputs_glsl(inputs, extents, count);
  std::string text = moved_from_functions(graph, dag, inputs);
  for (size_t k = 0; k < exported.size(); ++k) text += "float exported" + std::to_string(k) + ";\n";
  text += "float " + function + "(uint i) {\n";
  if (any_broadcast(inputs)) text += coordinates_glsl(extents, "i");
  text += pointwise_statements_glsl(dag, element_inputs);
  for (size_t k = 0; k < exported.size(); ++k)
    text += "  exported" + std::to_string(k) + " = " + pointwise_value_glsl(exported[k]) + ";\n";
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k) {
    const std::string name = prefix + "extra" + std::to_string(k);
    const ValueId extra = dag.extra_outputs[k].value;
    operands.push_back({name, extra, true});
    text +=
        "  " + name + "[i] = " +
        stored_as(pointwise_value_glsl(dag.extra_outputs[k].statement), graph.type(extra).dtype) +
        ";\n";
  }
  return text + "  return " + pointwise_result_glsl(dag) + ";\n}\n";
}

std::string pointwise_store_function_glsl(const Graph& graph, const PointwiseDag& dag, size_t given,
                                          const std::string& function,
                                          std::vector<Operand>& operands,
                                          const std::string& prefix) {
  const Shape& shape = graph.type(dag.output).shape;
  const int64_t count = graph.type(dag.output).elements();
  std::vector<InputAccess> inputs = input_accesses(graph, dag, count, operands, prefix, given);
  const std::vector<int64_t> extents = collapse_axes(graph, dag, shape, inputs);
  const std::vector<std::string> element_inputs = scalar_inputs_glsl(inputs, extents, count);
  const std::string result = prefix + "result";
  operands.push_back({result, dag.output, true});
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k)
    operands.push_back({prefix + "extra" + std::to_string(k), dag.extra_outputs[k].value, true});
  std::string text =
      moved_from_functions(graph, dag, inputs) + "void " + function + "(uint i, float value) {\n";
  if (any_broadcast(inputs)) text += coordinates_glsl(extents, "i");
  return text +
         element_glsl(dag, element_inputs, graph.type(dag.output).dtype, result + "[i]",
                      extra_stores(dag, prefix + "extra", "[i]"), extra_dtypes(graph, dag)) +
         "}\n";
}

namespace {

void lower_single_pointwise(LoweringContext& context) {
  const Node& node = context.node();
  PointwiseDag dag;
  dag.inputs = node.inputs;
  dag.output = context.id();
  PointwiseStatement statement{node.op, node.attrs, {}};
  for (size_t k = 0; k < node.inputs.size(); ++k)
    statement.arguments.push_back(static_cast<int>(k));
  dag.statements.push_back(std::move(statement));
  context.emit(pointwise_launch(context.graph(), dag, context.device(), context.label()));
}

}  // namespace

std::vector<LoweringEntry> pointwise_lowerings() {
  std::vector<LoweringEntry> entries;
  for (const auto& [op, unused] : expressions()) entries.push_back({op, lower_single_pointwise});
  entries.push_back({op::gelu, lower_single_pointwise});
  entries.push_back({op::gelu_grad, lower_single_pointwise});
  entries.push_back({op::widen_bf16, lower_single_pointwise});
  return entries;
}

std::string transpose_index_function(const Graph& graph, ValueId transpose,
                                     const std::string& function, bool forward) {
  const Node& node = graph.node(transpose);
  return transpose_index_function_glsl(node.attrs.get_ints("permutation"),
                                       graph.type(node.inputs[0]).shape, node.type.shape, function,
                                       forward);
}

}  // namespace mg::kernels
