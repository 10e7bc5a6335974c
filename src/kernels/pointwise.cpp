#include "kernels/pointwise.hpp"

#include "kernels/index_codegen.hpp"

#include <map>

namespace mg::kernels {
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
      {"add", "$0 + $1"},
      {"sub", "$0 - $1"},
      {"mul", "$0 * $1"},
      {"div", "$0 / $1"},
      {"pow", "mg_pow($0, $1)"},
      {"maximum", "max($0, $1)"},
      {"minimum", "min($0, $1)"},
      {"equal", "float($0 == $1)"},
      {"less", "float($0 < $1)"},
      {"less_equal", "float($0 <= $1)"},
      {"greater", "float($0 > $1)"},
      {"greater_equal", "float($0 >= $1)"},
      {"where", "($0 != 0.0) ? $1 : $2"},
      {"neg", "-$0"},
      {"abs", "abs($0)"},
      {"exp", "exp($0)"},
      {"log", "log($0)"},
      {"sqrt", "sqrt($0)"},
      {"rsqrt", "inversesqrt($0)"},
      {"recip", "1.0 / $0"},
      {"square", "$0 * $0"},
      {"sin", "sin($0)"},
      {"cos", "cos($0)"},
      {"relu", "max($0, 0.0)"},
      {"silu", "$0 * mg_sigmoid($0)"},
      {"sigmoid", "mg_sigmoid($0)"},
      {"tanh", "mg_tanh($0)"},
      {"broadcast_to", "$0"},
      {"cast", "$0"},
  };
  return table;
}

std::string expression_for(const PointwiseStatement& statement) {
  if (statement.op == "gelu") {
    return statement.attrs.get_string("approximate", "none") == "tanh" ? "mg_gelu_tanh($0)"
                                                                       : "mg_gelu($0)";
  }
  if (statement.op == "gelu_grad") {
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
  return expressions().count(op) > 0 || op == "gelu" || op == "gelu_grad";
}

Launch pointwise_launch(const Graph& graph, const PointwiseDag& dag, const DeviceTraits& device,
                        std::string label) {
  const TensorType& output_type = graph.type(dag.output);
  const Shape& shape = output_type.shape;
  const int64_t count = output_type.elements();

  Launch launch;
  launch.label = std::move(label);
  launch.kernel = "pointwise";
  std::string body = std::string(kPointwiseFunctions);
  body += "layout(local_size_x = " + std::to_string(kLocalSize) + ") in;\nvoid main() {\n";
  body += "  uint i = linear_workgroup() * " + std::to_string(kLocalSize) +
          "u + gl_LocalInvocationID.x;\n";
  body += "  if (i >= " + std::to_string(count) + "u) return;\n";
  // Coordinates of element i, innermost first.
  body += "  uint rest = i;\n";
  for (size_t axis = shape.size(); axis-- > 0;) {
    body += "  uint c" + std::to_string(axis) + " = rest % " + std::to_string(shape[axis]) +
            "u; rest /= " + std::to_string(shape[axis]) + "u;\n";
  }

  std::vector<std::string> input_expressions;
  for (size_t k = 0; k < dag.inputs.size(); ++k) {
    const Node& input_node = graph.node(dag.inputs[k]);
    if (input_node.is_uniform_constant()) {
      input_expressions.push_back(glsl_float(input_node.attrs.get_float("value")));
      continue;
    }
    const std::string name = "in" + std::to_string(k);
    launch.operands.push_back({name, dag.inputs[k], false});
    const Shape& input_shape = input_node.type.shape;
    const std::vector<int64_t> strides = row_major_strides(input_shape);
    const size_t offset = shape.size() - input_shape.size();
    std::string index;
    for (size_t axis = 0; axis < input_shape.size(); ++axis) {
      if (input_shape[axis] == 1) continue;
      if (!index.empty()) index += " + ";
      index += "c" + std::to_string(axis + offset) + " * " + std::to_string(strides[axis]) + "u";
    }
    const std::string load = name + "[" + (index.empty() ? "0" : index) + "]";
    input_expressions.push_back(input_node.type.dtype == DType::f32 ? load : "float(" + load + ")");
  }

  for (size_t s = 0; s < dag.statements.size(); ++s) {
    const PointwiseStatement& statement = dag.statements[s];
    std::vector<std::string> arguments;
    for (int argument : statement.arguments) {
      arguments.push_back(argument >= 0 ? input_expressions.at(argument)
                                        : "t" + std::to_string(-1 - argument));
    }
    body += "  float t" + std::to_string(s) + " = " +
            substitute(expression_for(statement), arguments) + ";\n";
  }
  const std::string result = "t" + std::to_string(dag.statements.size() - 1);
  launch.operands.push_back({"result", dag.output, true});
  const DType output_dtype = output_type.dtype;
  body +=
      "  result[i] = " + (output_dtype == DType::f32 ? result : "int(" + result + ")") + ";\n}\n";
  launch.body = std::move(body);
  launch.groups = grid_for(static_cast<uint64_t>(count), kLocalSize, device);
  return launch;
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
  entries.push_back({"gelu", lower_single_pointwise});
  entries.push_back({"gelu_grad", lower_single_pointwise});
  return entries;
}

}  // namespace mg::kernels
