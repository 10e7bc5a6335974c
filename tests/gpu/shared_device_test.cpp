// Sessions sharing one device: each computes what it computes alone, a session that ends frees
// what it created without disturbing the others, and many sessions in a row (more than the ~26
// instances NVIDIA's driver allowed one process) run on one device.
#include "harness.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;

void check_product(const std::shared_ptr<SharedDevice>& device, uint64_t seed) {
  SessionOptions options;
  options.shared_device = device;
  check_on_gpu(
      {{"a", {9, 13}}, {"b", {13, 7}}, {"bias", {7}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", gelu(matmul(x[0], x[1]) + x[2]).id());
      },
      1e-5, seed, options);
}

TEST(GpuSharedDevice, SessionsOnOneDeviceMatchTheReference) {
  const std::shared_ptr<SharedDevice> device = open_shared_device("", true);
  // A session kept alive across the others, checked again after they ended.
  Graph graph;
  Tensor x = input(graph, "x", {4, 6});
  graph.set_output("y", sum(x * x, {1}).id());
  SessionOptions options;
  options.shared_device = device;
  Session kept(graph, options);
  std::vector<float> values(24);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 2.0f;
  kept.set_input("x", values);
  const auto expected_row = [&](size_t row) {
    double total = 0;
    for (size_t j = 0; j < 6; ++j) total += double(values[row * 6 + j]) * values[row * 6 + j];
    return total;
  };

  for (uint64_t seed = 1; seed <= 40; ++seed) check_product(device, seed);

  kept.run();
  const std::vector<float> sums = kept.output("y");
  ASSERT_EQ(sums.size(), 4u);
  for (size_t row = 0; row < 4; ++row) EXPECT_NEAR(sums[row], expected_row(row), 1e-4) << row;
  EXPECT_EQ(kept.validation_messages(), 0u);
}

}  // namespace
}  // namespace mg
