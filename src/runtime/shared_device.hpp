#pragma once
// A SharedDevice on a gpu::Device made elsewhere (an app's own Vulkan device, adopted), and the
// gpu::Device of a SharedDevice: for embedding (src/capi).
#include <memory>

#include "backends/vulkan/runtime/gpu.hpp"
#include "meganeura/session.hpp"

namespace mg {

std::shared_ptr<SharedDevice> share_device(std::shared_ptr<gpu::Device> device);
gpu::Device& gpu_device(const SharedDevice& shared);

}  // namespace mg
