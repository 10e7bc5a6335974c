// visit_initial_leaves (ops/interpreter.hpp), which a session's build draws its leaves with: the
// values of initialise_leaves one leaf at a time, and with skip_weights (SessionOptions::
// initialise_parameters = false, a model folder's weights written right after) no weight drawn,
// trained or frozen, while leaves of one value keep theirs.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"
#include "ops/interpreter.hpp"

namespace mg {
namespace {

Graph leaves_graph() {
  Graph graph;
  graph.parameter("trained", {DType::f32, {3, 4}}, Init::normal(0.0, 0.5));
  graph.state("frozen", {DType::f32, {5}}, Init::uniform(-1.0, 1.0));
  graph.state("moment", {DType::f32, {2, 2}}, Init::zeros());
  graph.state("scale", {DType::f32, {3}}, Init::ones());
  graph.parameter("second", {DType::f32, {6}}, Init::normal(1.0, 2.0));
  return graph;
}

std::map<std::string, std::vector<double>> visited(const Graph& graph, bool skip_weights) {
  std::map<std::string, std::vector<double>> values;
  visit_initial_leaves(
      graph, 7, skip_weights, [](const Node&) { return true; },
      [&](const Node& node, std::span<const double> drawn) {
        values[node.name].assign(drawn.begin(), drawn.end());
      });
  return values;
}

TEST(InitialLeaves, OneAtATimeAsInitialiseLeavesAndNoWeightsWhenSkipped) {
  const Graph graph = leaves_graph();
  Environment environment;
  initialise_leaves(graph, environment, 7);
  const std::map<std::string, std::vector<double>> all = visited(graph, false);
  ASSERT_EQ(all.size(), 5u);
  for (const auto& [name, values] : all)
    EXPECT_EQ(values, environment.leaves.at(name).data) << name;
  // Drawn, not constant: the random leaves differ element to element.
  EXPECT_NE(all.at("trained")[0], all.at("trained")[1]);
  EXPECT_NE(all.at("frozen")[0], all.at("frozen")[1]);

  const std::map<std::string, std::vector<double>> skipped = visited(graph, true);
  EXPECT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped.at("moment"), std::vector<double>(4, 0.0));
  EXPECT_EQ(skipped.at("scale"), std::vector<double>(3, 1.0));
}

}  // namespace
}  // namespace mg
