#pragma once
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

// Evaluates every node; the values of f16 nodes (leaves too) are rounded to f16. Throws mg::Error
// when a leaf is missing or has the wrong shape.
std::vector<HostTensor> evaluate(const Graph& graph, const Environment& environment);

// Evaluates, then applies the graph's assignments to `environment` (one training step).
std::vector<HostTensor> step(const Graph& graph, Environment& environment);

}  // namespace mg
