#pragma once
#include <functional>
#include <span>
// The reference interpreter: evaluates a graph in f64 on the CPU, node by node, with each op's
// reference function. It is the oracle every GPU result and every gradient is tested against.
#include <map>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"
#include "ops/host_tensor.hpp"

namespace mg {

// Values of leaves by name: inputs (required), parameters and state (required unless
// `initialise` fills them). Evaluation fills `values` for every node.
struct Environment {
  std::map<std::string, HostTensor> leaves;
};

// Draws initial values for every parameter/state leaf not yet in `environment`, from each
// leaf's Init, with a seeded generator (same seed, same values).
void initialise_leaves(const Graph& graph, Environment& environment, uint64_t seed);

// The same values as initialise_leaves on an empty environment, one leaf at a time in graph order
// (so that no more than one leaf is held): `visit` gets each parameter/state leaf that `wanted`
// accepts. Random leaves that are not wanted are still drawn, so the others keep their values;
// with `skip_weights` the model's weights, parameters and the state leaves drawn at random
// (frozen weights), are neither drawn nor visited.
void visit_initial_leaves(const Graph& graph, uint64_t seed, bool skip_weights,
                          const std::function<bool(const Node&)>& wanted,
                          const std::function<void(const Node&, std::span<const double>)>& visit);

// Evaluates every node; the values of f16 nodes (leaves too) are rounded to f16. Throws mg::Error
// when a leaf is missing or has the wrong shape.
std::vector<HostTensor> evaluate(const Graph& graph, const Environment& environment);

// Evaluates, then applies the graph's assignments to `environment` (one training step).
std::vector<HostTensor> step(const Graph& graph, Environment& environment);

}  // namespace mg
