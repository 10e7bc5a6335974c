#include "runtime/shared_device.hpp"

#include "meganeura/error.hpp"

namespace mg {

std::shared_ptr<SharedDevice> share_device(std::shared_ptr<gpu::Device> device) {
  return std::make_shared<SharedDevice>(std::move(device));
}

gpu::Device& gpu_device(const SharedDevice& shared) {
  return *shared.device;
}

std::shared_ptr<SharedDevice> open_shared_device(std::string_view selector, bool validation,
                                                 const std::optional<Switches>& switches) {
  return std::make_shared<SharedDevice>(
      gpu::Device::open(selector, validation, switches ? *switches : Switches::from_environment()));
}

std::shared_ptr<SharedTensors> make_shared_tensors(std::shared_ptr<SharedDevice> device) {
  if (!device) throw Error("make_shared_tensors needs an open device (open_shared_device)");
  return std::make_shared<SharedTensors>(std::move(device));
}

}  // namespace mg
