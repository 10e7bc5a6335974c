#pragma once
// The typed static graph: an SSA list of nodes, each with an op name, inputs, attributes and a
// result type. Nodes are appended in topological order, so the node list is a valid schedule.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "meganeura/error.hpp"
#include "meganeura/types.hpp"

namespace mg {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

// Attributes sorted by name, so equal attribute sets compare equal (CSE relies on it).
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(std::string name, AttrValue value);
  bool has(std::string_view name) const;
  // Getters throw mg::Error naming the attribute when it is missing or of another kind.
  int64_t get_int(std::string_view name) const;
  int64_t get_int(std::string_view name, int64_t fallback) const;
  double get_float(std::string_view name) const;  // accepts an int attribute too
  double get_float(std::string_view name, double fallback) const;
  const std::vector<int64_t>& get_ints(std::string_view name) const;
  std::vector<int64_t> get_ints(std::string_view name, std::vector<int64_t> fallback) const;
  const std::string& get_string(std::string_view name) const;
  std::string get_string(std::string_view name, std::string fallback) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string to_string() const;  // "axis=1, eps=1e-05"
  bool operator==(const Attrs&) const = default;

 private:
  const AttrValue* find(std::string_view name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// Leaves are nodes too: op "input" (fed each run), "parameter" (trainable, persistent),
// "state" (persistent, not trainable: optimizer moments, running statistics) and "constant".
struct Node {
  std::string op;
  std::vector<ValueId> inputs;
  Attrs attrs;
  TensorType type;
  std::string name;  // leaves: their unique name (Hugging Face style for parameters)
  std::shared_ptr<const std::vector<double>> data;  // constants with explicit values

  bool is_leaf() const;
  // A constant whose every element is attrs "value" (no explicit data): passes fold it and
  // kernels inline it as a literal.
  bool is_uniform_constant() const;
};

// How a parameter or state leaf is initialised before training.
struct Init {
  enum class Kind { zeros, ones, fill, uniform, normal } kind = Kind::zeros;
  double a = 0;  // fill value; uniform low; normal mean
  double b = 0;  // uniform high; normal standard deviation

  static Init zeros() { return {}; }
  static Init ones() { return {Kind::ones, 0, 0}; }
  static Init fill(double value) { return {Kind::fill, value, 0}; }
  static Init uniform(double low, double high) { return {Kind::uniform, low, high}; }
  static Init normal(double mean, double stddev) { return {Kind::normal, mean, stddev}; }
};

Init leaf_init(const Node& leaf);  // reads the init attributes written by parameter()/state()

class Graph {
 public:
  // Appends a node; the op's shape inference checks the inputs and throws mg::Error naming the
  // op and the input types when they do not fit.
  ValueId add(std::string_view op, std::vector<ValueId> inputs, Attrs attrs = {});
  // Appends a node whose type is already known (used by passes that rebuild graphs).
  ValueId add_typed(Node node);

  ValueId input(std::string name, TensorType type);
  ValueId parameter(std::string name, TensorType type, Init init);
  ValueId state(std::string name, TensorType type, Init init = Init::zeros());
  ValueId constant(double value, TensorType type);  // every element equals `value`
  ValueId constant(std::vector<double> values, TensorType type);

  // Named results that a session can fetch (e.g. "loss", "logits").
  void set_output(std::string name, ValueId value);
  // After each run, persistent leaf `target` takes the value `value` (optimizer updates,
  // running statistics). Types must match.
  void assign(ValueId target, ValueId value);
  // Replaces the value an earlier assign gave `target` (the optimizer keeps the running
  // statistics of a step it drops); throws mg::Error where `target` has no update.
  void reassign(ValueId target, ValueId value);

  const Node& node(ValueId id) const {
    if (id < 0 || static_cast<size_t>(id) >= nodes_.size()) throw_foreign_value(id, "node");
    return nodes_[id];
  }
  const TensorType& type(ValueId id) const { return node(id).type; }
  size_t size() const { return nodes_.size(); }
  // Room for `nodes` nodes, so that a pass rebuilding a graph does not grow it node by node.
  void reserve(size_t nodes) { nodes_.reserve(nodes); }
  const std::vector<Node>& nodes() const { return nodes_; }
  // The nodes of a graph about to be discarded, moved out: a pass rebuilding a graph it owns
  // reuses their strings and vectors instead of copying them.
  std::vector<Node> release_nodes() && { return std::move(nodes_); }
  const std::vector<std::pair<std::string, ValueId>>& outputs() const { return outputs_; }
  const std::vector<std::pair<ValueId, ValueId>>& updates() const { return updates_; }

  ValueId find_leaf(std::string_view name) const;          // kNoValue when absent
  ValueId output(std::string_view name) const;             // throws mg::Error when absent
  std::vector<ValueId> leaves(std::string_view op) const;  // all leaves of one kind, in order

  // Text form, one node a line: "%7 = matmul(%3, %5) {transpose_b=1} : f32[64, 10]".
  std::string to_string() const;

 private:
  ValueId add_leaf(std::string_view op, std::string name, TensorType type, Attrs attrs);
  void check_value(ValueId id, std::string_view context) const {
    if (id < 0 || static_cast<size_t>(id) >= nodes_.size()) throw_foreign_value(id, context);
  }
  [[noreturn]] void throw_foreign_value(ValueId id, std::string_view context) const;

  std::vector<Node> nodes_;
  std::vector<std::pair<std::string, ValueId>> outputs_;
  std::vector<std::pair<ValueId, ValueId>> updates_;
  std::vector<bool> updated_;  // by value: a target of updates_ (assign refuses a second update)
};

// Checks SSA order, input ids, re-infers every type, unique leaf names, output and assignment
// targets. Throws mg::Error describing the first problem.
void verify(const Graph& graph);

}  // namespace mg
