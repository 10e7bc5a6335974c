// Inputs and outputs bound in place to buffers of the device (as the app's imported VkBuffers are,
// docs/EMBEDDING.md): the kernels read the input through a view of it and write the output there
// with no copy, an output that views the bound input is copied from the bound buffer, and in-place
// bindings that cannot be had are refused.
#include <cstring>
#include <random>

#include "harness.hpp"
#include "runtime/shared_device.hpp"

namespace mg {
namespace {

TEST(GpuInPlaceBinding, KernelsReadAndWriteBoundBuffersWithoutCopies) {
  const std::shared_ptr<SharedDevice> shared = open_shared_device("", true);
  gpu::Device& device = gpu_device(*shared);
  Graph graph;
  Tensor x = input(graph, "x", {4, 8});
  graph.set_output("doubled", (reshape(x, {32}) * 2.0).id());
  graph.set_output("view", reshape(x, {8, 4}).id());
  graph.set_output("shifted", (x + 1.0).id());
  SessionOptions options;
  options.shared_device = shared;
  // Vulkan's minStorageBufferOffsetAlignment is at most 256.
  constexpr uint64_t kOffset = 256;
  const gpu::BufferId app_input =
      device.create_buffer(kOffset + 32 * 4, gpu::BufferUse::upload, "app input");
  const gpu::BufferId app_output =
      device.create_buffer(32 * 4, gpu::BufferUse::download, "app out");
  {
    Session session(graph, options);
    EXPECT_EQ(session.run_transfers().copies, 4u);
    EXPECT_THROW(session.bind_output("view", app_output, 0, Session::Binding::in_place), Error);
    if (device.info().caps.min_storage_buffer_offset_alignment > 4) {
      EXPECT_THROW(session.bind_input("x", app_input, 4, Session::Binding::in_place), Error);
    }
    session.bind_input("x", app_input, kOffset, Session::Binding::in_place);
    session.bind_output("doubled", app_output, 0, Session::Binding::in_place);
    EXPECT_EQ(session.run_transfers().copies, 2u);  // "view" and "shifted" to the host
    EXPECT_THROW(session.output("doubled"), Error);

    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    float* values =
        reinterpret_cast<float*>(static_cast<std::byte*>(device.mapped(app_input)) + kOffset);
    for (int i = 0; i < 32; ++i) values[i] = uniform(generator);
    session.run();
    const float* doubled = static_cast<const float*>(device.mapped(app_output));
    const std::vector<float> view = session.output("view");
    const std::vector<float> shifted = session.output("shifted");
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(doubled[i], values[i] * 2.0f) << i;
      EXPECT_EQ(view[i], values[i]) << i;
      EXPECT_EQ(shifted[i], values[i] + 1.0f) << i;
    }
    EXPECT_EQ(session.validation_messages(), 0u);
  }
  device.destroy_buffer(app_input);
  device.destroy_buffer(app_output);
}

}  // namespace
}  // namespace mg
