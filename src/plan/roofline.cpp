#include "plan/roofline.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "ir/op_names.hpp"

namespace mg::plan {

namespace {

double elements(const Graph& graph, ValueId value) {
  return static_cast<double>(graph.type(value).elements());
}

// Elements of `shape` past its first axis: a convolution weight's taps per output channel.
double per_output_channel(const Shape& shape) {
  double product = 1;
  for (size_t i = 1; i < shape.size(); ++i) product *= static_cast<double>(shape[i]);
  return product;
}

double product_flops(const Graph& graph, const Node& node, ValueId result) {
  const Shape& a = graph.type(node.inputs[0]).shape;
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const double k = static_cast<double>(a.size() < 2 ? 1 : a[a.size() - (transpose_a ? 2 : 1)]);
  // Split-K partials: each of the `splits` slices of the result covers 1/splits of K.
  const double splits =
      static_cast<double>(std::max<int64_t>(1, node.attrs.get_int("k_splits", 1)));
  return 2 * elements(graph, result) * k / splits;
}

double convolution_flops(const Graph& graph, const Node& node, ValueId result) {
  const std::string_view op = node.op;
  if (op == op::conv2d_grad_weight) {
    // x [N, C, H, W], grad_out [N, O, OH, OW] -> w [O, C/g, KH, KW]
    // Split over K, the result's leading axis holds the `k_splits` partials, each of which
    // covers 1/k_splits of the batch's positions.
    const Shape& grad_out = graph.type(node.inputs[1]).shape;
    const double splits =
        static_cast<double>(std::max<int64_t>(1, node.attrs.get_int("k_splits", 1)));
    return 2 * elements(graph, result) * elements(graph, node.inputs[1]) /
           static_cast<double>(grad_out.size() > 1 ? grad_out[1] : 1) / splits;
  }
  // conv2d(x, w): the result; conv2d_grad_input(grad_out, w) and conv_transpose2d(x, w): the
  // input that has the forward output's shape.
  const ValueId output_shaped = op == op::conv2d ? result : node.inputs[0];
  return 2 * elements(graph, output_shaped) * per_output_channel(graph.type(node.inputs[1]).shape);
}

double attention_flops(const Graph& graph, const Node& node) {
  // q [B, H, Sq, D], k [B, Hkv, Sk, D]: the scores and their product with v.
  const Shape& q = graph.type(node.inputs[0]).shape;
  const Shape& k = graph.type(node.inputs[1]).shape;
  if (q.size() < 2 || k.size() < 2) return 0;
  const double scores = elements(graph, node.inputs[0]) * static_cast<double>(k[k.size() - 2]);
  const bool forward = node.op == op::scaled_dot_product_attention;
  return (forward ? 4 : 6) * scores;
}

}  // namespace

LaunchCost launch_cost(const Program& program, const PlannedLaunch& launch) {
  const Graph& graph = program.graph;
  LaunchCost cost;
  std::set<ValueId> bound;
  ValueId written = kNoValue;
  double written_elements = 0;
  for (const target::Operand& operand : launch.launch.operands) {
    if (operand.value == kNoValue) continue;
    if (bound.insert(operand.value).second)
      cost.bytes += static_cast<double>(graph.type(operand.value).bytes());
    if (operand.write) {
      if (written == kNoValue) written = operand.value;
      written_elements += elements(graph, operand.value);
    }
  }
  if (written == kNoValue) return cost;
  // A fused launch writes its last op's result ("matmul %5 + fused 2 ops -> relu %7"); the label
  // starts with the node that does the arithmetic.
  ValueId root = written;
  const std::string& label = launch.launch.label;
  if (const size_t mark = label.find(" %"); mark != std::string::npos) {
    const std::string op_name = label.substr(0, mark);
    char* end = nullptr;
    const long id = std::strtol(label.c_str() + mark + 2, &end, 10);
    if (end != label.c_str() + mark + 2 && id >= 0 && static_cast<size_t>(id) < graph.size() &&
        graph.node(static_cast<ValueId>(id)).op == op_name)
      root = static_cast<ValueId>(id);
  }
  const Node& node = graph.node(root);
  const std::string_view op = node.op;
  if (op == op::matmul || op == op::half_matmul) {
    cost.flops = product_flops(graph, node, root);
  } else if (op == op::conv2d || op == op::conv2d_grad_input || op == op::conv2d_grad_weight ||
             op == op::conv_transpose2d) {
    cost.flops = convolution_flops(graph, node, root);
  } else if (op == op::scaled_dot_product_attention || op == op::attention_grad_q ||
             op == op::attention_grad_k || op == op::attention_grad_v) {
    cost.flops = attention_flops(graph, node);
  } else {
    cost.flops = written_elements;
  }
  return cost;
}

std::vector<LaunchCost> launch_costs(const Program& program) {
  std::vector<LaunchCost> costs;
  costs.reserve(program.launches.size());
  for (const PlannedLaunch& launch : program.launches)
    costs.push_back(launch_cost(program, launch));
  return costs;
}

}  // namespace mg::plan
