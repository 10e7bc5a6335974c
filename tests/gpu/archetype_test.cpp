#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "harness.hpp"
#include "ir/op_names.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;

// Runs timed as a whole (SessionOptions::time_runs, what `meganeura bench` uses) put a barrier
// before every dispatch and read one timestamp pair: independent and dependent dispatches still
// match the reference, and the timing API refuses what it cannot give.
TEST(GpuArchetypes, TimedRunsMatchTheReference) {
  SessionOptions timed;
  timed.time_runs = true;
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("softmax_product", softmax(matmul(x[0], x[1]), 1).id());
    graph.set_output("independent", gelu(x[2]).id());
  };
  check_on_gpu({{"a", {9, 13}}, {"b", {13, 7}}, {"c", {5, 11}}}, build, 1e-5, 3, timed);

  Graph graph;
  const Tensor x = input(graph, "x", {4, 6});
  graph.set_output("y", sum(exp(x), {1}).id());
  std::vector<float> values(24);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * static_cast<float>(i) - 1.0f;
  Session session(graph, timed);
  session.set_input("x", values);
  session.run();
  EXPECT_GE(session.last_run_gpu_ms(), 0.0);
  EXPECT_THROW(session.profile(), Error);

  Session untimed(graph);
  untimed.set_input("x", values);
  untimed.run();
  EXPECT_THROW(untimed.last_run_gpu_ms(), Error);
  SessionOptions both = timed;
  both.profile = true;
  EXPECT_THROW(Session(graph, both), Error);
}

TEST(GpuArchetypes, PointwiseChainWithBroadcast) {
  check_on_gpu({{"a", {3, 5, 7}}, {"b", {5, 1}}}, [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("y", (relu(x[0] * x[1] + 0.5) - exp(x[1])).id());
  });
}

// Transposes that keep their innermost axis copy a 16-byte vector a thread where that axis is a
// multiple of 4 (f32) and one value a thread where it is not; one that moves it reads across.
// Moves are exact: a normalised error under 1e-12.
TEST(GpuArchetypes, TransposesMoveRunsOfTheirInnermostAxis) {
  size_t dispatches = 0;
  check_on_gpu(
      {{"fours", {3, 5, 8}}, {"sixes", {2, 3, 6}}, {"moved", {4, 3, 7}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("fours_moved", transpose(x[0], {1, 0, 2}).id());
        graph.set_output("sixes_moved", transpose(x[1], {1, 0, 2}).id());
        graph.set_output("moved_moved", transpose(x[2], {2, 0, 1}).id());
      },
      1e-12, 7, {}, &dispatches);
  EXPECT_EQ(dispatches, 3u);
}

TEST(GpuArchetypes, MatmulOddSizesAndTransposes) {
  check_on_gpu({{"a", {2, 67, 33}}, {"b", {33, 70}}, {"c", {70, 33}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("plain", matmul(x[0], x[1]).id());
                 graph.set_output("transposed", matmul(x[0], x[2], false, true).id());
               });
}

TEST(GpuArchetypes, ReductionsShortAndLongRows) {
  check_on_gpu({{"x", {4, 300, 5}}}, [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("sum_long", sum(x[0], {1}).id());
    graph.set_output("mean_short", mean(x[0], {2}, true).id());
    graph.set_output("max_all", max(x[0], {0, 1, 2}).id());
    graph.set_output("argmax", argmax(x[0], 1).id());
    graph.set_output("softmax", softmax(x[0], 1).id());
    graph.set_output("log_softmax", log_softmax(x[0], -1).id());
  });
}

// Many short rows (batch norm's per-image planes) share a workgroup, a few lanes each, each lane
// reading up to 16 elements: a plane of 49 gets 8 lanes, one of 20 gets 4 and one of 300 gets
// 32, as many as keep four workgroups a compute unit busy (their last workgroup partly past the
// rows); fewer such rows, or rows over 1,024 elements, keep a workgroup each. Sums, a mean of a
// fused square, max and argmax match the reference on either side.
TEST(GpuArchetypes, ManyShortRowsShareAWorkgroup) {
  const auto lanes_of = [](const Shape& shape, int64_t axis) -> std::string {
    Graph graph;
    const Tensor x = input(graph, "x", shape);
    graph.set_output("s", sum(x, {axis}).id());
    const std::vector<kernels::Launch> launches =
        kernels::lower_node(graph, graph.output("s"), target::DeviceTraits{});
    const size_t at = launches.at(0).body.find("row_lane = lane % ");
    if (at == std::string::npos) return "workgroup";
    const size_t digits = at + std::string("row_lane = lane % ").size();
    return launches[0].body.substr(digits, launches[0].body.find('u', digits) - digits);
  };
  EXPECT_EQ(lanes_of({97, 89, 49}, 2), "8");
  EXPECT_EQ(lanes_of({3400, 5, 20}, 2), "4");
  EXPECT_EQ(lanes_of({97, 89, 300}, 2), "32");
  EXPECT_EQ(lanes_of({9, 89, 49}, 2), "workgroup");
  EXPECT_EQ(lanes_of({97, 89, 1100}, 2), "workgroup");

  check_on_gpu({{"x", {97, 89, 49}}, {"y", {3400, 5, 20}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("sum", sum(x[0], {2}).id());
                 graph.set_output("mean_square", mean(x[0] * x[0], {2}, true).id());
                 graph.set_output("max", max(x[0], {2}).id());
                 graph.set_output("argmax", argmax(x[0], 2).id());
                 graph.set_output("short_sum", sum(x[1], {2}).id());
                 graph.set_output("short_max_abs", max(abs(x[1]), {2}).id());
               });
}

// Softmax keeps rows of up to 32 elements a thread (4096) in registers and streams longer
// ones: both sides of that boundary, and a strided (non-innermost) axis.
TEST(GpuArchetypes, SoftmaxRowsInAndBeyondRegisters) {
  check_on_gpu({{"x", {3, 4100}, DType::f32, -4.0, 4.0},
                {"y", {2, 4096}, DType::f32, -4.0, 4.0},
                {"z", {300, 7}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("streamed", softmax(x[0], 1).id());
                 graph.set_output("streamed_log", log_softmax(x[0], 1).id());
                 graph.set_output("cached", softmax(x[1], 1).id());
                 graph.set_output("cached_log", log_softmax(x[1], 1).id());
                 graph.set_output("strided", softmax(x[2], 0).id());
               });
}

// Sums over leading axes with many outputs (split-K partial results) take one thread per output
// however long the column: 4100 outputs of 40 values each, and of 3 x 7 with a max.
TEST(GpuArchetypes, ReductionsOverLeadingAxes) {
  check_on_gpu({{"x", {40, 4100}}, {"y", {3, 7, 4100}}}, [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("column_sum", sum(x[0], {0}).id());
    graph.set_output("column_max", max(x[1], {0, 1}).id());
  });
}

// Sums around a kept axis with few outputs (a convolution's bias gradient) run in two steps on
// GPUs (passes/split_reductions.cpp, forced here on Lavapipe with MEGANEURA_SPLIT_K=1): the
// results match the reference, and each such sum costs one dispatch more than whole.
TEST(GpuArchetypes, SumsAroundAKeptAxisInTwoSteps) {
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("bias_gradient", sum(x[0], {0, 2, 3}, true).id());
    graph.set_output("dropped_axes", sum(x[1], {0, 2, 3}).id());
  };
  const std::vector<testing::HarnessInput> inputs{{"x", {8, 3, 20, 20}}, {"y", {5, 2, 9, 16}}};
  size_t split_dispatches = 0, whole_dispatches = 0;
  {
    const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    check_on_gpu(inputs, build, 1e-5, 5, {}, &split_dispatches);
  }
  const testing::ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  check_on_gpu(inputs, build, 1e-5, 5, {}, &whole_dispatches);
  EXPECT_EQ(split_dispatches, whole_dispatches + 2);
}

// The max of a few long rows (attention's per-head max |dO|) runs as chunk maxima, then each
// row's, on GPUs (passes/split_reductions.cpp, forced here on Lavapipe with MEGANEURA_SPLIT_K=1),
// the abs before it evaluated as the chunks are read (a prologue, as it is for the whole max):
// the results match the reference, in two dispatches against the whole max's one.
TEST(GpuArchetypes, MaxOfFewLongRowsInChunks) {
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("largest", max(abs(x[0]), {2, 3}, true).id());
  };
  const std::vector<testing::HarnessInput> inputs{{"x", {1, 3, 300, 64}, DType::f32, -2.0, 2.0}};
  size_t split_dispatches = 0, whole_dispatches = 0;
  {
    const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    check_on_gpu(inputs, build, 1e-6, 7, {}, &split_dispatches);
  }
  const testing::ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  check_on_gpu(inputs, build, 1e-6, 7, {}, &whole_dispatches);
  EXPECT_EQ(split_dispatches, 2u);
  EXPECT_EQ(whole_dispatches, 1u);
}

// Likewise a sum of a few rows from 262,144 elements each (clipping's gradient norm of a large
// parameter, the square evaluated as the chunks are read): chunk sums, then each row's, in two
// dispatches against the whole sum's one, matching the reference; a shorter one (a small
// parameter's) stays whole.
TEST(GpuArchetypes, LongSumsInChunks) {
  const std::vector<testing::HarnessInput> inputs{{"large", {640, 1024}}, {"small", {300, 300}}};
  const auto build_large = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("squares", sum_all(square(x[0])).id());
  };
  const auto build_small = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("squares", sum_all(square(x[1])).id());
  };
  size_t large_split = 0, large_whole = 0, small_split = 0;
  {
    const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    check_on_gpu(inputs, build_large, 1e-6, 3, {}, &large_split);
    check_on_gpu(inputs, build_small, 1e-6, 3, {}, &small_split);
  }
  const testing::ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  check_on_gpu(inputs, build_large, 1e-6, 3, {}, &large_whole);
  EXPECT_EQ(large_split, 2u);
  EXPECT_EQ(large_whole, 1u);
  EXPECT_EQ(small_split, 1u);
}

// Sums and means over leading axes (the slices of split partial results) with a multiple of 4
// outputs read one vec4 of adjacent outputs a thread; 4099 outputs take the scalar path. With
// few columns (planned for 132 compute units), threads share one (reduction.cpp): 2 of them
// over 5 and 7 positions (uneven shares), 4 over 12, 8 over 40, and none over 3, each against
// the reference.
TEST(GpuArchetypes, ColumnSumsOverLeadingAxes) {
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("slices", sum(x[0], {0}).id());
    graph.set_output("two_axes", mean(x[1], {0, 1}).id());
    graph.set_output("tail", sum(x[2], {0}).id());
    graph.set_output("short", sum(x[3], {0}, true).id());
    graph.set_output("eight_threads", sum(x[4], {0}).id());
    graph.set_output("one_thread", sum(x[5], {0}).id());
  };
  check_on_gpu({{"x", {5, 3, 2048}},
                {"y", {3, 4, 1032}},
                {"z", {3, 4099}},
                {"w", {7, 40}},
                {"u", {40, 1024}},
                {"v", {3, 1024}}},
               build, 1e-5, 6);
}

// A reduction's lanes load four elements of their row before they add them (reduction.cpp,
// kReductionUnroll), in the order of the plain loop, then the rest one at a time. Rows whose
// lengths leave every remainder, on each kind of row (one thread a row: 13; a workgroup a row:
// 2,000 and 378, the latter with a kept axis between reduced ones whose two contiguous axes index
// as one; a few lanes a row: 49), with a fused prologue and its sibling sum (the batch norm
// gradient's form: `sum(g * y)` and `sum(g)`, g written beside), against the reference; argmax
// over tied values keeps the first; plain sums, and column sums over a leading axis (two threads
// a column over 13 positions), equal those of MEGANEURA_REDUCTION_UNROLL=0 to the bit.
TEST(GpuArchetypes, ReductionRowsLoadFourElementsAStep) {
  const std::vector<testing::HarnessInput> inputs{
      {"short", {300, 13}},     {"long", {3, 2000}}, {"around", {6, 3, 7, 9}},
      {"planes", {97, 89, 49}}, {"y", {97, 89, 49}}, {"ties", {5, 2000}, DType::i32, 0.0, 3.0}};
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("short_sum", sum(x[0], {1}).id());
    graph.set_output("short_argmax", argmax(x[0], 1).id());
    graph.set_output("long_sum", sum(x[1], {1}).id());
    graph.set_output("long_max", max(x[1], {1}).id());
    graph.set_output("around_sum", sum(x[2], {0, 2, 3}).id());
    graph.set_output("around_mean_square", mean(x[2] * x[2], {0, 2, 3}).id());
    const Tensor g = x[3] * 0.5 + 1.0;
    graph.set_output("g_twice", (g * 2.0).id());
    graph.set_output("g_y_sum", sum(g * x[4], {2}).id());
    graph.set_output("g_sum", sum(g, {2}).id());
    graph.set_output("tied_argmax", argmax(cast(x[5], DType::f32), 1).id());
  };
  std::string dispatches;
  for (const char* unroll : {"1", "0"}) {
    const testing::ScopedSwitch switched("MEGANEURA_REDUCTION_UNROLL", unroll);
    check_on_gpu(inputs, build, 1e-5, 9, {}, nullptr, true, &dispatches);
  }
  // The prologue and its sibling in one launch, as in a batch norm's backward.
  EXPECT_NE(dispatches.find("+ sum"), std::string::npos) << dispatches;

  const auto sums_with = [](const char* unroll) {
    const testing::ScopedSwitch switched("MEGANEURA_REDUCTION_UNROLL", unroll);
    Graph graph;
    const Tensor x = input(graph, "x", {6, 3, 7, 9});
    const Tensor y = input(graph, "y", {3, 2000});
    const Tensor z = input(graph, "z", {13, 4096});
    graph.set_output("around", sum(x, {0, 2, 3}).id());
    graph.set_output("long", sum(y, {1}).id());
    graph.set_output("columns", sum(z, {0}).id());
    Session session(graph, testing::session_options());
    std::mt19937 random(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (const auto& [name, count] :
         {std::pair{"x", 6 * 3 * 7 * 9}, std::pair{"y", 3 * 2000}, std::pair{"z", 13 * 4096}}) {
      std::vector<float> values(count);
      for (float& value : values) value = uniform(random);
      session.set_input(name, values);
    }
    session.run();
    std::vector<float> results;
    for (const char* name : {"around", "long", "columns"}) {
      const std::vector<float> sums = session.output(name);
      results.insert(results.end(), sums.begin(), sums.end());
    }
    return results;
  };
  EXPECT_EQ(sums_with("1"), sums_with("0"));
}

// With more rows than one row of a grid holds (a device's maxComputeWorkGroupCount[0]: 65,535 on
// most GPUs that are not NVIDIA's), the kernels that give each row a workgroup run on a grid of
// two rows of workgroups, rounded up, and those past the last row return before they read or
// write anything. Lavapipe bounds every buffer access, so a run there would show nothing: the
// lowering for a device whose grid rows hold 16 workgroups is checked instead.
TEST(GpuArchetypes, WorkgroupsPastTheLastRowReturn) {
  target::DeviceTraits device;
  device.max_workgroup_count_x = 16;
  Graph graph;
  const Tensor x = input(graph, "x", {20, 2000});
  const Tensor rows = input(graph, "rows", {20, 8});
  graph.set_output("sum", sum(x, {1}).id());
  graph.set_output("softmax", softmax(rows, 1).id());
  graph.set_output("rms_norm", rms_norm(rows, std::nullopt, 1e-5).id());
  const Tensor largest = max(x, {1});
  graph.set_output("max_grad",
                   graph.add(op::max_grad, {x.id(), largest.id()}, graph.node(largest.id()).attrs));
  for (const char* name : {"sum", "softmax", "rms_norm", "max_grad"}) {
    const std::vector<kernels::Launch> launches =
        kernels::lower_node(graph, graph.output(name), device);
    ASSERT_EQ(launches.size(), 1u) << name;
    const kernels::Launch& launch = launches[0];
    EXPECT_EQ(launch.groups[0], 16u) << name;
    EXPECT_EQ(launch.groups[1], 2u) << name;
    std::string source = launch.body;
    for (const auto& [define, value] : launch.defines)
      source = kernels::replace_all(source, define, value);
    const bool returns_past_the_rows = source.find(">= 20u) return;") != std::string::npos;
    EXPECT_TRUE(returns_past_the_rows) << name << ":\n" << source;
  }
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The GPU GEMM picks 128, 64 or 32-wide tiles by problem size, and 64 x 64 tiles with 8 x 8 a
// thread for batches of products whose last 128 x 128 tiles would be at most half full along
// both extents (192 x 160 here); run each through the GPU kernel (on Lavapipe the CPU kernel
// would run otherwise).
TEST(GpuArchetypes, GemmTileSizes) {
  const testing::ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  testing::check_on_gpu({{"a", {1536, 24}},
                         {"b", {1600, 24}},
                         {"c", {40, 600}},
                         {"d", {40, 700}},
                         {"e", {100, 33}},
                         {"f", {33, 90}},
                         {"g", {36, 192, 72}},
                         {"h", {36, 160, 72}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("tile128", matmul(x[0], x[1], false, true).id());
                          graph.set_output("tile64", matmul(x[2], x[3], true, false).id());
                          graph.set_output("tile32", matmul(x[4], x[5]).id());
                          graph.set_output("quarter", matmul(x[6], x[7], false, true).id());
                        });
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The kill switch for pointwise fusion: one dispatch per elementwise op gives the same values.
TEST(GpuArchetypes, PointwiseChainUnfused) {
  const testing::ScopedSwitch unfused("MEGANEURA_NO_FUSION", "1");
  testing::check_on_gpu({{"a", {3, 5, 7}}, {"b", {5, 1}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("y", (relu(x[0] * x[1] + 0.5) - exp(x[1])).id());
                        });
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The pointwise kernel reads four consecutive elements as one vec4 when it can: an element
// count that is not a multiple of four leaves a scalar tail, and one-element inputs splat.
TEST(GpuArchetypes, PointwiseVectorisedWithTail) {
  testing::check_on_gpu({{"a", {1027}}, {"b", {1027}}, {"s", {1}}, {"row", {1, 12}}, {"c", {12}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("tail", (x[0] * x[1] + x[2] - 0.25).id());
                          graph.set_output("ranks", (x[3] * x[4]).id());
                          graph.set_output("three", (x[0] + x[2]).id());
                          graph.set_output("short", (sigmoid(x[4]) * x[2]).id());
                        });
}

// Broadcast inputs in the vectorised kernel: one that varies along the innermost axis loads a
// vec4, one that does not loads a scalar for all four lanes; merged axes keep the indexing right.
TEST(GpuArchetypes, PointwiseVectorisedBroadcasts) {
  testing::check_on_gpu(
      {{"a", {6, 5, 8}}, {"bias", {8}}, {"column", {5, 1}}, {"batch", {6, 1, 1}}, {"d", {6, 5, 1}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", (x[0] * x[1] + x[2] - x[3]).id());
        graph.set_output("merged", (x[0] * x[4]).id());
      });
}

// An innermost extent that is not a multiple of four with a broadcast input: the scalar kernel,
// four elements per thread, including a partly filled last workgroup.
TEST(GpuArchetypes, PointwiseScalarBroadcasts) {
  testing::check_on_gpu(
      {{"a", {2, 9, 6}}, {"b", {9, 1}}, {"c", {6}}, {"big", {3, 700, 3}}, {"e", {700, 1}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", (x[0] * x[1] - x[2]).id());
        graph.set_output("z", (tanh(x[3]) + x[4]).id());
      });
}

// i32 inputs and outputs through the vector views (ivec4) and the scalar tail.
TEST(GpuArchetypes, PointwiseIntegers) {
  testing::check_on_gpu({{"a", {1030}, DType::i32, -50, 50},
                         {"b", {1030}, DType::i32, -50, 50},
                         {"m", {4, 8}, DType::i32, -50, 50},
                         {"n", {8}, DType::i32, -50, 50},
                         {"f", {1030}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("sum", (x[0] + x[1]).id());
                          graph.set_output("product", (x[2] * x[3]).id());
                          graph.set_output("mixed", (cast(x[0], DType::f32) * x[4]).id());
                          graph.set_output("halved",
                                           cast(cast(x[1], DType::f32) * 0.5, DType::i32).id());
                        });
}

}  // namespace
}  // namespace mg
