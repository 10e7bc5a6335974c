#include "runtime/index_checks.hpp"

#include "ir/op_names.hpp"
#include "meganeura/error.hpp"

namespace mg::runtime {
namespace {

// The input leaf that `value` is, looking through reshapes; kNoValue for anything computed.
ValueId input_behind(const Graph& graph, ValueId value) {
  while (graph.node(value).op == op::reshape) value = graph.node(value).inputs[0];
  return graph.node(value).op == op::input ? value : kNoValue;
}

}  // namespace

std::map<std::string, std::vector<IndexRule>, std::less<>> index_rules(const Graph& graph) {
  std::map<std::string, std::vector<IndexRule>, std::less<>> rules;
  for (const Node& node : graph.nodes()) {
    IndexRule rule{node.op, "", 0, false, 0};
    if (node.op == op::gather || node.op == op::scatter_add) {
      rule.limit = graph.type(node.inputs[0]).shape[0];
      rule.what = "a table of " + std::to_string(rule.limit) + " rows";
    } else if (node.op == op::cross_entropy || node.op == op::cross_entropy_grad) {
      rule.limit = graph.type(node.inputs[0]).shape[1];
      rule.what = std::to_string(rule.limit) + " classes";
      rule.has_ignored = true;
      rule.ignored = node.attrs.get_int("ignore_index", -100);
    } else {
      continue;
    }
    const ValueId leaf = input_behind(graph, node.inputs[1]);
    if (leaf != kNoValue) rules[graph.node(leaf).name].push_back(rule);
  }
  return rules;
}

void check_indices(std::string_view input, std::span<const int32_t> values,
                   const std::vector<IndexRule>& rules) {
  for (const IndexRule& rule : rules) {
    for (size_t position = 0; position < values.size(); ++position) {
      const int32_t value = values[position];
      if ((value >= 0 && value < rule.limit) || (rule.has_ignored && value == rule.ignored)) {
        continue;
      }
      throw Error("input '" + std::string(input) + "' feeds " + rule.op + " over " + rule.what +
                  ", but holds " + std::to_string(value) + " at position " +
                  std::to_string(position) + ", outside [0, " + std::to_string(rule.limit) + ")" +
                  (rule.has_ignored ? " and not the ignored label " + std::to_string(rule.ignored)
                                    : std::string()));
    }
  }
}

}  // namespace mg::runtime
