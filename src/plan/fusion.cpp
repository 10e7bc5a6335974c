#include "plan/fusion.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "kernels/pointwise.hpp"

namespace mg::plan {
namespace {

bool fusion_disabled() {
  const char* value = std::getenv("MEGANEURA_NO_FUSION");
  return value && std::strcmp(value, "0") != 0;
}

// Adds node `id` and, recursively, the producers fused into it to `dag`; returns the argument
// index that refers to `id`'s result.
int append_fused(const Graph& graph, ValueId id, const std::vector<bool>& fused_into_consumer,
                 kernels::PointwiseDag& dag, std::map<ValueId, int>& argument_of) {
  if (auto it = argument_of.find(id); it != argument_of.end()) return it->second;
  const Node& node = graph.node(id);
  kernels::PointwiseStatement statement{node.op, node.attrs, {}};
  for (ValueId input : node.inputs) {
    if (fused_into_consumer[input]) {
      statement.arguments.push_back(
          append_fused(graph, input, fused_into_consumer, dag, argument_of));
    } else {
      auto it = argument_of.find(input);
      if (it == argument_of.end()) {
        dag.inputs.push_back(input);
        it = argument_of.emplace(input, static_cast<int>(dag.inputs.size() - 1)).first;
      }
      statement.arguments.push_back(it->second);
    }
  }
  dag.statements.push_back(std::move(statement));
  const int reference = -static_cast<int>(dag.statements.size());
  argument_of[id] = reference;
  return reference;
}

}  // namespace

std::vector<kernels::Launch> lower_graph(const Graph& graph, const kernels::DeviceTraits& device,
                                         size_t* fused_away) {
  std::vector<int> consumers(graph.size(), 0);
  std::vector<ValueId> consumer_of(graph.size(), kNoValue);
  for (size_t i = 0; i < graph.size(); ++i) {
    for (ValueId input : graph.nodes()[i].inputs) {
      ++consumers[input];
      consumer_of[input] = static_cast<ValueId>(i);
    }
  }
  std::vector<bool> observed(graph.size(), false);  // outputs and assignments need their bytes
  for (const auto& [name, id] : graph.outputs()) observed[id] = true;
  for (const auto& [leaf, value] : graph.updates()) observed[value] = true;

  std::vector<bool> fused_into_consumer(graph.size(), false);
  if (!fusion_disabled()) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      const ValueId consumer = consumer_of[i];
      fused_into_consumer[i] = kernels::is_pointwise_op(node.op) && !observed[i] &&
                               consumers[i] == 1 && node.type.dtype == DType::f32 &&
                               kernels::is_pointwise_op(graph.node(consumer).op) &&
                               graph.node(consumer).type.shape == node.type.shape;
    }
  }

  // A fused kernel binds every distinct input of its DAG plus its result; when a consumer would
  // exceed the device's binding limit, its largest fused producers become kernels of their own.
  std::vector<uint32_t> bound_inputs(graph.size(), 1);
  const uint32_t input_limit = std::max<uint32_t>(2, device.max_storage_buffers) - 1;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (!kernels::is_pointwise_op(node.op)) continue;
    uint32_t count = 0;
    for (ValueId input : node.inputs) count += fused_into_consumer[input] ? bound_inputs[input] : 1;
    while (count > input_limit) {
      ValueId largest = kNoValue;
      for (ValueId input : node.inputs) {
        if (fused_into_consumer[input] &&
            (largest == kNoValue || bound_inputs[input] > bound_inputs[largest])) {
          largest = input;
        }
      }
      fused_into_consumer[largest] = false;
      count = count - bound_inputs[largest] + 1;
    }
    bound_inputs[i] = count;
  }

  if (fused_away)
    *fused_away = std::count(fused_into_consumer.begin(), fused_into_consumer.end(), true);
  std::vector<kernels::Launch> launches;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    const ValueId id = static_cast<ValueId>(i);
    if (node.is_leaf() || kernels::is_view_op(node.op) || fused_into_consumer[i]) continue;
    const bool has_fused_producer =
        kernels::is_pointwise_op(node.op) &&
        std::any_of(node.inputs.begin(), node.inputs.end(),
                    [&](ValueId input) { return fused_into_consumer[input]; });
    if (!has_fused_producer) {
      for (kernels::Launch& launch : kernels::lower_node(graph, id, device)) {
        launches.push_back(std::move(launch));
      }
      continue;
    }
    kernels::PointwiseDag dag;
    dag.output = id;
    std::map<ValueId, int> argument_of;
    append_fused(graph, id, fused_into_consumer, dag, argument_of);
    launches.push_back(kernels::pointwise_launch(graph, dag, device,
                                                 "fused " + std::to_string(dag.statements.size()) +
                                                     " ops -> " + node.op + " %" +
                                                     std::to_string(id)));
  }
  return launches;
}

}  // namespace mg::plan
