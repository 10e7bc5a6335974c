#pragma once
// The objects behind SessionOptions::shared_device and shared_tensors (meganeura/session.hpp),
// which Session reaches into, and their construction on a gpu::Device made elsewhere (an app's
// own Vulkan device, adopted: src/capi).
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backends/vulkan/runtime/gpu.hpp"
#include "meganeura/session.hpp"

namespace mg {

class SharedDevice {
 public:
  explicit SharedDevice(std::shared_ptr<gpu::Device> opened) : device(std::move(opened)) {}
  std::shared_ptr<gpu::Device> device;
};

class SharedTensors {
 public:
  explicit SharedTensors(std::shared_ptr<SharedDevice> shared) : device(std::move(shared)) {}
  ~SharedTensors() {
    for (const auto& [name, entry] : entries) device->device->destroy_buffer(entry.buffer);
  }
  SharedTensors(const SharedTensors&) = delete;
  SharedTensors& operator=(const SharedTensors&) = delete;

  struct Entry {
    TensorType type;
    gpu::BufferId buffer = 0;
  };
  std::shared_ptr<SharedDevice> device;
  std::map<std::string, Entry, std::less<>> entries;
  // Counts the changes of these tensors by runs and writes, so that a Session knows when the
  // results of its setup (derived from tensors it never changes itself) are stale, and the
  // generation at which each tensor last changed, so that it redoes only the part of its setup
  // that reads the changed ones.
  uint64_t generation = 0;
  std::map<std::string, uint64_t, std::less<>> written_at;
};

std::shared_ptr<SharedDevice> share_device(std::shared_ptr<gpu::Device> device);
gpu::Device& gpu_device(const SharedDevice& shared);

}  // namespace mg
