#include "meganeura/graph.hpp"

#include <unordered_set>

#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg {

bool Node::is_leaf() const {
  return op == op::input || op == op::parameter || op == op::state || op == op::constant;
}

bool Node::is_uniform_constant() const {
  return op == op::constant && !data && attrs.has("value");
}

Init leaf_init(const Node& leaf) {
  Init init;
  init.kind = static_cast<Init::Kind>(leaf.attrs.get_int("init", 0));
  init.a = leaf.attrs.get_float("init_a", 0);
  init.b = leaf.attrs.get_float("init_b", 0);
  return init;
}

void Graph::throw_foreign_value(ValueId id, std::string_view context) const {
  throw Error(std::string(context) + ": value %" + std::to_string(id) +
              " does not belong to this graph (it has " + std::to_string(nodes_.size()) +
              " values)");
}

ValueId Graph::add(std::string_view op, std::vector<ValueId> inputs, Attrs attrs) {
  const OpDef& def = op_def(op);
  for (ValueId input : inputs) check_value(input, op);
  Node node;
  node.op = op;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  node.type = def.infer(*this, node);
  nodes_.push_back(std::move(node));
  return static_cast<ValueId>(nodes_.size() - 1);
}

ValueId Graph::add_typed(Node node) {
  for (ValueId input : node.inputs) check_value(input, node.op);
  nodes_.push_back(std::move(node));
  return static_cast<ValueId>(nodes_.size() - 1);
}

ValueId Graph::add_leaf(std::string_view op, std::string name, TensorType type, Attrs attrs) {
  for (int64_t extent : type.shape) {
    if (extent <= 0) {
      throw Error(std::string(op) + " '" + name + "': shape " + shape_string(type.shape) +
                  " has a non-positive extent");
    }
  }
  if (!name.empty() && find_leaf(name) != kNoValue) {
    throw Error(std::string(op) + " '" + name + "': the graph already has a leaf of that name");
  }
  Node node;
  node.op = std::move(op);
  node.name = std::move(name);
  node.type = std::move(type);
  node.attrs = std::move(attrs);
  nodes_.push_back(std::move(node));
  return static_cast<ValueId>(nodes_.size() - 1);
}

static Attrs init_attrs(const Init& init) {
  return Attrs{{"init", static_cast<int64_t>(init.kind)}, {"init_a", init.a}, {"init_b", init.b}};
}

ValueId Graph::input(std::string name, TensorType type) {
  return add_leaf(op::input, std::move(name), std::move(type), {});
}

ValueId Graph::parameter(std::string name, TensorType type, Init init) {
  if (!is_floating(type.dtype)) {
    throw Error("parameter '" + name + "' has dtype " + std::string(dtype_name(type.dtype)) +
                "; parameters must be floating point");
  }
  return add_leaf(op::parameter, std::move(name), std::move(type), init_attrs(init));
}

ValueId Graph::state(std::string name, TensorType type, Init init) {
  return add_leaf(op::state, std::move(name), std::move(type), init_attrs(init));
}

ValueId Graph::constant(double value, TensorType type) {
  return add_leaf(op::constant, "", std::move(type), Attrs{{"value", value}});
}

ValueId Graph::constant(std::vector<double> values, TensorType type) {
  if (static_cast<int64_t>(values.size()) != type.elements()) {
    throw Error("constant of type " + type_string(type) + " given " +
                std::to_string(values.size()) + " values");
  }
  const ValueId id = add_leaf(op::constant, "", std::move(type), {});
  nodes_[id].data = std::make_shared<const std::vector<double>>(std::move(values));
  return id;
}

void Graph::set_output(std::string name, ValueId value) {
  check_value(value, "output '" + name + "'");
  for (auto& [existing, id] : outputs_) {
    if (existing == name) {
      id = value;
      return;
    }
  }
  outputs_.emplace_back(std::move(name), value);
}

void Graph::assign(ValueId target, ValueId value) {
  check_value(target, "assign");
  check_value(value, "assign");
  const Node& leaf = nodes_[target];
  if (leaf.op != op::parameter && leaf.op != op::state) {
    throw Error("assign: target %" + std::to_string(target) + " is a " + leaf.op +
                "; only parameters and state can be updated");
  }
  if (!(leaf.type == nodes_[value].type)) {
    throw Error("assign to '" + leaf.name + "': value type " + type_string(nodes_[value].type) +
                " differs from " + type_string(leaf.type));
  }
  const auto index = static_cast<size_t>(target);
  if (index < updated_.size() && updated_[index])
    throw Error("assign: '" + leaf.name + "' is already updated");
  if (index >= updated_.size()) updated_.resize(nodes_.size(), false);
  updated_[index] = true;
  updates_.emplace_back(target, value);
}

void Graph::reassign(ValueId target, ValueId value) {
  check_value(target, "reassign");
  check_value(value, "reassign");
  const Node& leaf = nodes_[target];
  if (!(leaf.type == nodes_[value].type)) {
    throw Error("reassign to '" + leaf.name + "': value type " + type_string(nodes_[value].type) +
                " differs from " + type_string(leaf.type));
  }
  for (auto& [existing, assigned] : updates_) {
    if (existing == target) {
      assigned = value;
      return;
    }
  }
  throw Error("reassign: '" + leaf.name + "' has no update to replace");
}

ValueId Graph::find_leaf(std::string_view name) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i].name.empty() && nodes_[i].name == name) return static_cast<ValueId>(i);
  }
  return kNoValue;
}

ValueId Graph::output(std::string_view name) const {
  for (const auto& [existing, id] : outputs_) {
    if (existing == name) return id;
  }
  std::string known;
  for (const auto& [existing, id] : outputs_) known += (known.empty() ? "" : ", ") + existing;
  throw Error("the graph has no output '" + std::string(name) + "' (outputs: " + known + ")");
}

std::vector<ValueId> Graph::leaves(std::string_view op) const {
  std::vector<ValueId> found;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].op == op) found.push_back(static_cast<ValueId>(i));
  }
  return found;
}

std::string Graph::to_string() const {
  std::string text;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    text += "%" + std::to_string(i) + " = " + node.op;
    if (!node.name.empty()) text += " \"" + node.name + "\"";
    if (!node.inputs.empty()) {
      text += "(";
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        text += (k ? ", %" : "%") + std::to_string(node.inputs[k]);
      }
      text += ")";
    }
    if (!node.attrs.items().empty()) text += " {" + node.attrs.to_string() + "}";
    text += " : " + type_string(node.type) + "\n";
  }
  for (const auto& [name, id] : outputs_)
    text += "output " + name + " = %" + std::to_string(id) + "\n";
  for (const auto& [target, value] : updates_) {
    text += "assign %" + std::to_string(target) + " <- %" + std::to_string(value) + "\n";
  }
  return text;
}

void verify(const Graph& graph) {
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    const std::string where = "verify: %" + std::to_string(i) + " (" + node.op + ")";
    for (ValueId input : node.inputs) {
      if (input < 0 || static_cast<size_t>(input) >= i) {
        throw Error(where + " uses %" + std::to_string(input) + ", which is not defined before it");
      }
    }
    if (!node.name.empty() && !names.insert(node.name).second) {
      throw Error(where + ": leaf name '" + node.name + "' is used twice");
    }
    if (!node.is_leaf()) {
      const TensorType inferred = op_def(node.op).infer(graph, node);
      if (!(inferred == node.type)) {
        throw Error(where + " has type " + type_string(node.type) + " but its inputs give " +
                    type_string(inferred));
      }
    }
  }
}

}  // namespace mg
