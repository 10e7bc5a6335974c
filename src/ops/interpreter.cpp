#include "ops/interpreter.hpp"

#include <random>

#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg {

namespace {

// Draws a leaf's initial values from its Init (random kinds advance `generator`).
void draw_initial(const Init& init, std::span<double> values, std::mt19937_64& generator) {
  std::uniform_real_distribution<double> uniform(init.a, init.b);
  std::normal_distribution<double> normal(init.a, init.b > 0 ? init.b : 1.0);
  for (double& value : values) {
    switch (init.kind) {
      case Init::Kind::zeros:
        value = 0;
        break;
      case Init::Kind::ones:
        value = 1;
        break;
      case Init::Kind::fill:
        value = init.a;
        break;
      case Init::Kind::uniform:
        value = uniform(generator);
        break;
      case Init::Kind::normal:
        value = normal(generator);
        break;
    }
  }
}

bool is_initialised_leaf(const Node& node) {
  return node.op == op::parameter || node.op == op::state;
}

}  // namespace

void initialise_leaves(const Graph& graph, Environment& environment, uint64_t seed) {
  std::mt19937_64 generator(seed);
  for (const Node& node : graph.nodes()) {
    if (!is_initialised_leaf(node) || environment.leaves.count(node.name)) continue;
    HostTensor tensor(node.type.shape);
    draw_initial(leaf_init(node), tensor.data, generator);
    environment.leaves.emplace(node.name, std::move(tensor));
  }
}

void visit_initial_leaves(const Graph& graph, uint64_t seed, bool skip_weights,
                          const std::function<bool(const Node&)>& wanted,
                          const std::function<void(const Node&, std::span<const double>)>& visit) {
  std::mt19937_64 generator(seed);
  std::vector<double> values;
  for (const Node& node : graph.nodes()) {
    if (!is_initialised_leaf(node) || (skip_weights && node.op == op::parameter)) continue;
    const Init init = leaf_init(node);
    const bool random = init.kind == Init::Kind::uniform || init.kind == Init::Kind::normal;
    if (skip_weights && random) continue;
    const bool visited = wanted(node);
    if (!visited && !random) continue;
    values.resize(static_cast<size_t>(node.type.elements()));
    draw_initial(init, values, generator);
    if (visited) visit(node, values);
  }
}

namespace {

// An f16 (bf16) tensor holds only f16 (bfloat16) values, whatever its producer computed or its
// caller gave.
void hold_in_dtype(const TensorType& type, HostTensor& tensor) {
  if (is_half_dtype(type.dtype))
    for (double& value : tensor.data) value = round_to_dtype(type.dtype, value);
}

}  // namespace

std::vector<HostTensor> evaluate(const Graph& graph, const Environment& environment) {
  std::vector<HostTensor> values(graph.size());
  std::vector<const HostTensor*> inputs;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.op == op::input || node.op == op::parameter || node.op == op::state) {
      auto it = environment.leaves.find(node.name);
      if (it == environment.leaves.end()) {
        throw Error("no value given for " + node.op + " '" + node.name + "' of type " +
                    type_string(node.type));
      }
      if (it->second.shape != node.type.shape) {
        throw Error(node.op + " '" + node.name + "' expects shape " +
                    shape_string(node.type.shape) + " but was given " +
                    shape_string(it->second.shape));
      }
      values[i] = it->second;
      hold_in_dtype(node.type, values[i]);
      continue;
    }
    const OpDef& def = op_def(node.op);
    if (!def.reference) throw Error("op '" + node.op + "' has no reference evaluation");
    inputs.clear();
    for (ValueId input : node.inputs) inputs.push_back(&values[input]);
    values[i] = def.reference(node, inputs);
    if (values[i].shape != node.type.shape ||
        values[i].elements() != element_count(node.type.shape)) {
      throw Error("internal: reference of '" + node.op + "' produced shape " +
                  shape_string(values[i].shape) + " for type " + type_string(node.type));
    }
    hold_in_dtype(node.type, values[i]);
  }
  return values;
}

std::vector<HostTensor> step(const Graph& graph, Environment& environment) {
  std::vector<HostTensor> values = evaluate(graph, environment);
  for (const auto& [target, value] : graph.updates()) {
    environment.leaves[graph.node(target).name] = values[value];
  }
  return values;
}

}  // namespace mg
