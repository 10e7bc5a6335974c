// The memory planner on the classifier programs (no device needed: planning is pure).
#include <gtest/gtest.h>

#include "models/classifier.hpp"
#include "plan/program.hpp"

namespace mg {
namespace {

plan::Program plan_for(const Graph& graph, bool reuse = true) {
  plan::PlanOptions options;
  options.reuse_memory = reuse;
  return plan::build_program(graph, kernels::DeviceTraits{}, options);
}

double saving(const plan::Program& program) {
  return 1.0 - static_cast<double>(program.memory.physical_transient_bytes) /
                   static_cast<double>(program.memory.logical_transient_bytes);
}

TEST(Planner, TrainingReusesAtLeastFortyPercent) {
  const plan::Program program =
      plan_for(models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{}));
  EXPECT_GT(saving(program), 0.40) << plan::describe_memory(program);
}

TEST(Planner, InferenceReusesAtLeastSeventyPercent) {
  const plan::Program program = plan_for(models::build_classifier(models::ClassifierConfig{}, 64));
  EXPECT_GT(saving(program), 0.70) << plan::describe_memory(program);
}

TEST(Planner, NoReuseMeansPhysicalEqualsLogicalUpToAlignment) {
  const plan::Program program =
      plan_for(models::build_classifier(models::ClassifierConfig{"mlp", 28, 10}, 16), false);
  EXPECT_GE(program.memory.physical_transient_bytes, program.memory.logical_transient_bytes);
}

TEST(Planner, ValuesWithOverlappingLifetimesNeverShareBytes) {
  const plan::Program program =
      plan_for(models::build_classifier_training(models::ClassifierConfig{}, 8, OptimizerConfig{}));
  // Every launch's operands must occupy disjoint bytes: otherwise a kernel would read what it
  // is overwriting.
  for (const plan::PlannedLaunch& launch : program.launches) {
    for (size_t a = 0; a < launch.regions.size(); ++a) {
      for (size_t b = a + 1; b < launch.regions.size(); ++b) {
        const plan::Region& x = launch.regions[a];
        const plan::Region& y = launch.regions[b];
        if (launch.launch.operands[a].value == launch.launch.operands[b].value) continue;
        const bool overlap = x.arena == y.arena && x.offset < y.offset + y.bytes &&
                             y.offset < x.offset + x.bytes;
        EXPECT_FALSE(overlap) << launch.launch.label << " operands " << a << " and " << b;
      }
    }
  }
}

TEST(Planner, ArenasRespectTheBufferLimit) {
  plan::PlanOptions options;
  options.arena_limit = 1 << 20;
  const plan::Program program = plan::build_program(
      models::build_classifier_training(models::ClassifierConfig{}, 32, OptimizerConfig{}),
      kernels::DeviceTraits{}, options);
  EXPECT_GT(program.arenas.size(), 2u);
  for (const plan::Arena& arena : program.arenas) EXPECT_LE(arena.bytes, options.arena_limit);
}

}  // namespace
}  // namespace mg
