// Elementwise ops: binary arithmetic and comparisons with NumPy broadcasting, where, unary math
// and activations, cast and stop_gradient. Their VJPs are built from elementwise ops too (the
// fusion pass folds those chains into one kernel), except gelu's, which has its own op so that
// its backward stays one kernel whatever the approximation.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

// A rank-0 zero of x's dtype, broadcast against x by the ops that take it.
Tensor scalar_zero(Tensor x) {
  return scalar(x.graph(), 0.0, x.dtype());
}

void require_floating(const Graph& graph, const Node& node, const TensorType& type) {
  if (!is_floating(type.dtype)) {
    op_error(graph, node,
             "needs a floating-point input, got " + std::string(dtype_name(type.dtype)));
  }
}

// ---- binary ---------------------------------------------------------------------------------

using BinaryGradients = std::pair<Tensor, Tensor>;  // d/da, d/db at the broadcast shape

struct BinaryOp {
  std::string_view name;
  double (*apply)(double a, double b);
  bool floating_only;
  // Gradients given the operands, the result and its gradient; null for comparisons.
  BinaryGradients (*gradients)(Tensor a, Tensor b, Tensor y, Tensor g);
};

// maximum/minimum split the gradient evenly between tied operands (as PyTorch does), so that
// max(x, c) + min(x, c) keeps the derivative of x + c.
BinaryGradients selection_gradients(Tensor g, Tensor a_wins, Tensor tie) {
  const Tensor share_a = a_wins + tie * 0.5;
  return {g * share_a, g * (1.0 - share_a)};
}

const BinaryOp kBinaryOps[] = {
    {op::add, [](double a, double b) { return a + b; }, false,
     [](Tensor, Tensor, Tensor, Tensor g) {
       return BinaryGradients{g, g};
     }},
    {op::sub, [](double a, double b) { return a - b; }, false,
     [](Tensor, Tensor, Tensor, Tensor g) {
       return BinaryGradients{g, -g};
     }},
    {op::mul, [](double a, double b) { return a * b; }, false,
     [](Tensor a, Tensor b, Tensor, Tensor g) {
       return BinaryGradients{g * b, g * a};
     }},
    {op::div, [](double a, double b) { return a / b; }, false,
     [](Tensor, Tensor b, Tensor y, Tensor g) {
       return BinaryGradients{g / b, -(g * y / b)};
     }},
    // d/db a^b = a^b log a: defined for a > 0 (NaN elsewhere, as in PyTorch).
    {op::pow, [](double a, double b) { return std::pow(a, b); }, true,
     [](Tensor a, Tensor b, Tensor y, Tensor g) {
       return BinaryGradients{g * b * pow(a, b - 1.0), g * y * log(a)};
     }},
    {op::maximum, [](double a, double b) { return std::max(a, b); }, false,
     [](Tensor a, Tensor b, Tensor, Tensor g) {
       return selection_gradients(g, greater(a, b), equal(a, b));
     }},
    {op::minimum, [](double a, double b) { return std::min(a, b); }, false,
     [](Tensor a, Tensor b, Tensor, Tensor g) {
       return selection_gradients(g, less(a, b), equal(a, b));
     }},
    {op::equal, [](double a, double b) { return a == b ? 1.0 : 0.0; }, false, nullptr},
    {op::less, [](double a, double b) { return a < b ? 1.0 : 0.0; }, false, nullptr},
    {op::less_equal, [](double a, double b) { return a <= b ? 1.0 : 0.0; }, false, nullptr},
    {op::greater, [](double a, double b) { return a > b ? 1.0 : 0.0; }, false, nullptr},
    {op::greater_equal, [](double a, double b) { return a >= b ? 1.0 : 0.0; }, false, nullptr},
};

// Every binary op: inputs (a, b) of one dtype, broadcast together; no attributes. Comparisons
// give 1/0 in that dtype. Integer results are truncated toward zero (integer division).
void register_binary(std::vector<OpDef>& registry, const BinaryOp& op) {
  OpDef def{
      .name = op.name,
      .infer =
          [floating_only = op.floating_only](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 2) op_error(graph, node, "takes two inputs");
            const TensorType& a = graph.type(node.inputs[0]);
            const TensorType& b = graph.type(node.inputs[1]);
            if (a.dtype != b.dtype) op_error(graph, node, "operands have different dtypes");
            if (floating_only) require_floating(graph, node, a);
            return TensorType{a.dtype, broadcast_or_error(graph, node, a.shape, b.shape)};
          },
      .reference =
          [apply = op.apply](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& a = *in[0];
            const HostTensor& b = *in[1];
            HostTensor out(node.type.shape);
            const bool integer = !is_floating(node.type.dtype);
            for (int64_t k = 0; k < out.elements(); ++k) {
              const double value = apply(a.data[broadcast_source_index(a.shape, out.shape, k)],
                                         b.data[broadcast_source_index(b.shape, out.shape, k)]);
              out.data[k] = integer ? std::trunc(value) : value;
            }
            return out;
          },
  };
  if (op.gradients) {
    def.vjp = [gradients = op.gradients](Graph& graph, ValueId self, ValueId grad) {
      const Node node = graph.node(self);
      const Tensor a(&graph, node.inputs[0]);
      const Tensor b(&graph, node.inputs[1]);
      const Shape a_shape = a.shape();  // copies: appending nodes may move the graph's own
      const Shape b_shape = b.shape();
      const auto [grad_a, grad_b] = gradients(a, b, Tensor(&graph, self), Tensor(&graph, grad));
      return std::vector<ValueId>{reduce_to_shape(graph, grad_a.id(), a_shape),
                                  reduce_to_shape(graph, grad_b.id(), b_shape)};
    };
  }
  registry.push_back(std::move(def));
}

// where(condition, if_true, if_false): picks if_true where condition != 0. All three
// broadcast together; condition may have any dtype, the branches share theirs.
OpDef where_op() {
  return {
      .name = op::where,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 3) op_error(graph, node, "takes three inputs");
            const TensorType& condition = graph.type(node.inputs[0]);
            const TensorType& if_true = graph.type(node.inputs[1]);
            const TensorType& if_false = graph.type(node.inputs[2]);
            if (if_true.dtype != if_false.dtype) {
              op_error(graph, node, "branches have different dtypes");
            }
            const Shape branches = broadcast_or_error(graph, node, if_true.shape, if_false.shape);
            return TensorType{if_true.dtype,
                              broadcast_or_error(graph, node, condition.shape, branches)};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor out(node.type.shape);
            for (int64_t k = 0; k < out.elements(); ++k) {
              const auto source = [&](int i) {
                return in[i]->data[broadcast_source_index(in[i]->shape, out.shape, k)];
              };
              out.data[k] = source(0) != 0 ? source(1) : source(2);
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const Tensor condition(&graph, node.inputs[0]);
            const Shape true_shape = graph.type(node.inputs[1]).shape;
            const Shape false_shape = graph.type(node.inputs[2]).shape;
            const Tensor g(&graph, grad);
            const Tensor zero = scalar_zero(g);
            const Tensor grad_true = where(condition, g, zero);
            const Tensor grad_false = where(condition, zero, g);
            return std::vector<ValueId>{kNoValue,
                                        reduce_to_shape(graph, grad_true.id(), true_shape),
                                        reduce_to_shape(graph, grad_false.id(), false_shape)};
          },
  };
}

// ---- unary ----------------------------------------------------------------------------------

struct UnaryOp {
  std::string_view name;
  double (*apply)(double x);
  bool floating_only;
  // Gradient given the operand, the result and its gradient.
  Tensor (*gradient)(Tensor x, Tensor y, Tensor g);
};

double sigmoid_of(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

const UnaryOp kUnaryOps[] = {
    {op::neg, [](double x) { return -x; }, false, [](Tensor, Tensor, Tensor g) { return -g; }},
    // The derivative of |x| at 0 is taken as 0 (PyTorch's sign(0)).
    {op::abs, [](double x) { return std::abs(x); }, false,
     [](Tensor x, Tensor, Tensor g) {
       return g * (greater(x, scalar_zero(x)) - less(x, scalar_zero(x)));
     }},
    {op::exp, [](double x) { return std::exp(x); }, true,
     [](Tensor, Tensor y, Tensor g) { return g * y; }},
    {op::log, [](double x) { return std::log(x); }, true,
     [](Tensor x, Tensor, Tensor g) { return g / x; }},
    {op::sqrt, [](double x) { return std::sqrt(x); }, true,
     [](Tensor, Tensor y, Tensor g) { return g * 0.5 / y; }},
    {op::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, true,
     [](Tensor x, Tensor y, Tensor g) { return g * -0.5 * y / x; }},
    {op::recip, [](double x) { return 1.0 / x; }, true,
     [](Tensor, Tensor y, Tensor g) { return -(g * y * y); }},
    {op::square, [](double x) { return x * x; }, false,
     [](Tensor x, Tensor, Tensor g) { return g * 2.0 * x; }},
    {op::sin, [](double x) { return std::sin(x); }, true,
     [](Tensor x, Tensor, Tensor g) { return g * cos(x); }},
    {op::cos, [](double x) { return std::cos(x); }, true,
     [](Tensor x, Tensor, Tensor g) { return -(g * sin(x)); }},
    // The derivative at 0 is taken as 0, as in PyTorch. The gradient's mask reads the output,
    // positive exactly where the input is, which the graph keeps anyway for the next layer: the
    // input need not be kept for the backward.
    {op::relu, [](double x) { return x > 0 ? x : 0.0; }, false,
     [](Tensor, Tensor y, Tensor g) { return g * greater(y, scalar_zero(y)); }},
    {op::silu, [](double x) { return x * sigmoid_of(x); }, true,
     [](Tensor x, Tensor, Tensor g) {
       const Tensor s = sigmoid(x);
       return g * s * (1.0 + x * (1.0 - s));
     }},
    {op::sigmoid, sigmoid_of, true, [](Tensor, Tensor y, Tensor g) { return g * y * (1.0 - y); }},
    {op::tanh, [](double x) { return std::tanh(x); }, true,
     [](Tensor, Tensor y, Tensor g) { return g * (1.0 - y * y); }},
};

TensorType infer_unary(const Graph& graph, const Node& node, bool floating_only) {
  if (node.inputs.size() != 1) op_error(graph, node, "takes one input");
  const TensorType& x = graph.type(node.inputs[0]);
  if (floating_only) require_floating(graph, node, x);
  return x;
}

// Every unary op: one input, same type out, no attributes.
void register_unary(std::vector<OpDef>& registry, const UnaryOp& op) {
  registry.push_back(OpDef{
      .name = op.name,
      .infer = [floating_only = op.floating_only](
                   const Graph& graph,
                   const Node& node) { return infer_unary(graph, node, floating_only); },
      .reference =
          [apply = op.apply](const Node&, const std::vector<const HostTensor*>& in) {
            HostTensor out = *in[0];
            for (double& value : out.data) value = apply(value);
            return out;
          },
      .vjp =
          [gradient = op.gradient](Graph& graph, ValueId self, ValueId grad) {
            const Tensor x(&graph, graph.node(self).inputs[0]);
            return std::vector<ValueId>{
                gradient(x, Tensor(&graph, self), Tensor(&graph, grad)).id()};
          },
  });
}

// ---- gelu -----------------------------------------------------------------------------------

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

// The "approximate" attribute: "none" is the exact erf form, "tanh" the tanh approximation.
bool gelu_uses_tanh(const Graph& graph, const Node& node) {
  const std::string approximate = node.attrs.get_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    op_error(graph, node, "approximate must be \"none\" or \"tanh\", not \"" + approximate + "\"");
  }
  return approximate == "tanh";
}

bool gelu_uses_tanh(const Node& node) {
  return node.attrs.get_string("approximate", "none") == "tanh";
}

double gelu_value(double x, bool tanh_form) {
  if (tanh_form) {
    return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
  }
  return 0.5 * x * (1.0 + std::erf(x * std::numbers::sqrt2 / 2.0));
}

// Exact derivative of the chosen form.
double gelu_derivative(double x, bool tanh_form) {
  if (tanh_form) {
    const double t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
  }
  const double density = std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
  return 0.5 * (1.0 + std::erf(x * std::numbers::sqrt2 / 2.0)) + x * density;
}

// gelu(x) {approximate: "none" | "tanh"}.
// gelu_grad(x, g) {approximate}: g * gelu'(x); x and g of one type.
void register_gelu(std::vector<OpDef>& registry) {
  registry.push_back(OpDef{
      .name = op::gelu,
      .infer =
          [](const Graph& graph, const Node& node) {
            gelu_uses_tanh(graph, node);
            return infer_unary(graph, node, true);
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const bool tanh_form = gelu_uses_tanh(node);
            HostTensor out = *in[0];
            for (double& value : out.data) value = gelu_value(value, tanh_form);
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            return std::vector<ValueId>{
                graph.add(op::gelu_grad, {node.inputs[0], grad}, node.attrs)};
          },
  });
  registry.push_back(OpDef{
      .name = op::gelu_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            gelu_uses_tanh(graph, node);
            if (node.inputs.size() != 2) op_error(graph, node, "takes inputs (x, grad)");
            const TensorType& x = graph.type(node.inputs[0]);
            require_floating(graph, node, x);
            if (!(graph.type(node.inputs[1]) == x)) {
              op_error(graph, node, "x and grad must have one type");
            }
            return x;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const bool tanh_form = gelu_uses_tanh(node);
            HostTensor out(node.type.shape);
            for (int64_t k = 0; k < out.elements(); ++k) {
              out.data[k] = in[1]->data[k] * gelu_derivative(in[0]->data[k], tanh_form);
            }
            return out;
          },
  });
}

// ---- cast and stop_gradient -----------------------------------------------------------------

DType cast_target(const Graph& graph, const Node& node) {
  try {
    return parse_dtype(node.attrs.get_string("dtype"));
  } catch (const Error& error) {
    op_error(graph, node, error.what());
  }
}

// cast(x) {dtype: "f32" | "f16" | "bf16" | "i32" | "u32"}. Into an integer dtype values are
// truncated toward zero; the f64 reference keeps floating values exact whatever their dtype.
// stop_gradient(x): identity that passes no gradient back.
void register_conversions(std::vector<OpDef>& registry) {
  registry.push_back(OpDef{
      .name = op::cast,
      .infer =
          [](const Graph& graph, const Node& node) {
            TensorType type = infer_unary(graph, node, false);
            type.dtype = cast_target(graph, node);
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor out = *in[0];
            if (!is_floating(node.type.dtype)) {
              for (double& value : out.data) value = std::trunc(value);
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const DType source = graph.type(node.inputs[0]).dtype;
            if (!is_floating(source) || !is_floating(node.type.dtype)) {
              return std::vector<ValueId>{kNoValue};
            }
            return std::vector<ValueId>{cast(Tensor(&graph, grad), source).id()};
          },
  });
  registry.push_back(OpDef{
      .name = op::stop_gradient,
      .infer = [](const Graph& graph, const Node& node) { return infer_unary(graph, node, false); },
      .reference = [](const Node&, const std::vector<const HostTensor*>& in) { return *in[0]; },
  });
}

}  // namespace

void register_elementwise_ops(std::vector<OpDef>& registry) {
  for (const BinaryOp& op : kBinaryOps) register_binary(registry, op);
  registry.push_back(where_op());
  for (const UnaryOp& op : kUnaryOps) register_unary(registry, op);
  register_gelu(registry);
  register_conversions(registry);
}

// ---- builders -------------------------------------------------------------------------------

Tensor add(Tensor a, Tensor b) {
  return apply(op::add, {a, b});
}
Tensor sub(Tensor a, Tensor b) {
  return apply(op::sub, {a, b});
}
Tensor mul(Tensor a, Tensor b) {
  return apply(op::mul, {a, b});
}
Tensor div(Tensor a, Tensor b) {
  return apply(op::div, {a, b});
}
Tensor pow(Tensor a, Tensor b) {
  return apply(op::pow, {a, b});
}
Tensor maximum(Tensor a, Tensor b) {
  return apply(op::maximum, {a, b});
}
Tensor minimum(Tensor a, Tensor b) {
  return apply(op::minimum, {a, b});
}
Tensor equal(Tensor a, Tensor b) {
  return apply(op::equal, {a, b});
}
Tensor less(Tensor a, Tensor b) {
  return apply(op::less, {a, b});
}
Tensor less_equal(Tensor a, Tensor b) {
  return apply(op::less_equal, {a, b});
}
Tensor greater(Tensor a, Tensor b) {
  return apply(op::greater, {a, b});
}
Tensor greater_equal(Tensor a, Tensor b) {
  return apply(op::greater_equal, {a, b});
}
Tensor where(Tensor condition, Tensor if_true, Tensor if_false) {
  return apply(op::where, {condition, if_true, if_false});
}

Tensor neg(Tensor x) {
  return apply(op::neg, {x});
}
Tensor abs(Tensor x) {
  return apply(op::abs, {x});
}
Tensor exp(Tensor x) {
  return apply(op::exp, {x});
}
Tensor log(Tensor x) {
  return apply(op::log, {x});
}
Tensor sqrt(Tensor x) {
  return apply(op::sqrt, {x});
}
Tensor rsqrt(Tensor x) {
  return apply(op::rsqrt, {x});
}
Tensor recip(Tensor x) {
  return apply(op::recip, {x});
}
Tensor square(Tensor x) {
  return apply(op::square, {x});
}
Tensor sin(Tensor x) {
  return apply(op::sin, {x});
}
Tensor cos(Tensor x) {
  return apply(op::cos, {x});
}
Tensor relu(Tensor x) {
  return apply(op::relu, {x});
}
Tensor gelu(Tensor x, GeluApproximation approximation) {
  return apply(op::gelu, {x},
               {{"approximate", approximation == GeluApproximation::tanh ? "tanh" : "none"}});
}
Tensor silu(Tensor x) {
  return apply(op::silu, {x});
}
Tensor sigmoid(Tensor x) {
  return apply(op::sigmoid, {x});
}
Tensor tanh(Tensor x) {
  return apply(op::tanh, {x});
}
Tensor cast(Tensor x, DType dtype) {
  return apply(op::cast, {x}, {{"dtype", std::string(dtype_name(dtype))}});
}
Tensor stop_gradient(Tensor x) {
  return apply(op::stop_gradient, {x});
}

}  // namespace mg
