#pragma once
// Shared by the device tests: every test opens Lavapipe (or whatever MEGANEURA_DEVICE names)
// with validation on, uses a private cache directory (switches()), and fails on any validation
// message.
#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::gpu::testing {

// A fresh directory under the system temp dir, removed at destruction.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "meganeura-vk-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override { device_ = Device::open("", true, switches()); }
  void TearDown() override {
    EXPECT_EQ(device_->validation_message_count(), 0u);
    device_.reset();
  }

  // The environment's switches with the kernel cache in this test's directory.
  Switches switches() const {
    return Switches::from_environment(
        {{"MEGANEURA_CACHE_DIR", cache_.path().string()}, {"MEGANEURA_NO_CACHE", "0"}});
  }

  template <typename T>
  void write(BufferId buffer, const std::vector<T>& values) {
    device_->write_buffer(buffer, 0, std::as_bytes(std::span(values)));
  }
  template <typename T>
  std::vector<T> read(BufferId buffer, size_t count) {
    std::vector<T> values(count);
    device_->read_buffer(buffer, 0, std::as_writable_bytes(std::span(values)));
    return values;
  }

  TemporaryDirectory cache_;
  std::unique_ptr<Device> device_;
};

// c[i] = a[i] * SCALE + b[i] for i < count (a push constant).
inline KernelSpec scale_add_kernel() {
  KernelSpec spec;
  spec.label = "scale_add";
  spec.source = R"(layout(local_size_x = GROUP) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Push { uint count; } push;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < push.count) c[i] = a[i] * SCALE + b[i];
}
)";
  spec.defines = {{"GROUP", "64"}, {"SCALE", "2.0"}};
  spec.binding_count = 3;
  spec.push_constant_bytes = 4;
  return spec;
}

}  // namespace mg::gpu::testing
