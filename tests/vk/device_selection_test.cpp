#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "backends/vulkan/runtime/device_features.hpp"
#include "meganeura/error.hpp"
#include "vk_test_support.hpp"

namespace mg::gpu {
namespace {

// The shared libraries mapped into this process (Linux: /proc/self/maps).
std::set<std::string> mapped_libraries() {
  std::set<std::string> libraries;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t path = line.find('/');
    if (path != std::string::npos && line.find(".so", path) != std::string::npos)
      libraries.insert(line.substr(path));
  }
  return libraries;
}

// What the process had mapped before main, before any test could open a device: the libraries
// a device loads are counted against this, so the test holds wherever it runs in the process.
const std::set<std::string> kLibrariesAtStart = mapped_libraries();

// The driver a device loads stays loaded after the device is gone: the Vulkan loader would
// unload it with the last instance, and a driver that takes static TLS (NVIDIA's) cannot be
// loaded again more than some tens of times in one process (backends/vulkan/runtime/instance.cpp).
// Libraries loaded since the process started (by this device, or by an earlier test's, then closed)
// must still be mapped once this device is closed too.
TEST(DeviceSelection, DriversStayLoadedBetweenDevices) {
  if (!std::ifstream("/proc/self/maps")) GTEST_SKIP() << "no /proc/self/maps on this system";
  std::set<std::string> during;
  {
    const std::unique_ptr<Device> device = Device::open("", false);
    during = mapped_libraries();
  }
  const std::set<std::string> after = mapped_libraries();
  int loaded = 0;
  for (const std::string& library : during) {
    if (kLibrariesAtStart.count(library) != 0) continue;
    ++loaded;
    EXPECT_EQ(after.count(library), 1u) << library << " was unloaded with the device";
  }
  EXPECT_GT(loaded, 0) << "opening a device loaded no library (the driver was loaded at start?)";
}

TEST(DeviceSelection, ListsLavapipe) {
  auto devices = list_devices();
  ASSERT_FALSE(devices.empty());
  bool found = std::any_of(devices.begin(), devices.end(), [](const DeviceInfo& d) {
    return d.name.find("llvmpipe") != std::string::npos;
  });
  EXPECT_TRUE(found);
  for (const auto& device : devices) {
    EXPECT_FALSE(describe_device(device).empty());
    EXPECT_GT(device.caps.max_storage_buffer_range, 0u);
    EXPECT_GT(device.caps.subgroup_size, 0u);
    EXPECT_FALSE(device.caps.heaps.empty());
  }
}

TEST(DeviceSelection, ByIndexAndCaseInsensitiveName) {
  auto devices = list_devices();
  EXPECT_EQ(choose_device(devices, "0"), 0u);
  uint32_t llvmpipe = choose_device(devices, "LLVMPIPE");
  EXPECT_NE(devices[llvmpipe].name.find("llvmpipe"), std::string::npos);
}

TEST(DeviceSelection, AutomaticPrefersDiscreteOverCpu) {
  std::vector<DeviceInfo> devices(3);
  devices[0].name = "cpu device";
  devices[0].kind = DeviceKind::cpu;
  devices[1].name = "laptop gpu";
  devices[1].kind = DeviceKind::integrated;
  devices[2].name = "big gpu";
  devices[2].kind = DeviceKind::discrete;
  for (uint32_t i = 0; i < 3; ++i) devices[i].index = i;
  EXPECT_EQ(choose_device(devices, "", Switches{}), 2u);
  EXPECT_EQ(
      choose_device(devices, "", Switches::from_environment({{"MEGANEURA_DEVICE", "laptop"}})), 1u);
}

TEST(DeviceSelection, BadSelectorNamesItself) {
  auto devices = list_devices();
  for (const char* selector : {"no-such-gpu", "99"}) {
    try {
      choose_device(devices, selector);
      FAIL() << "expected an error for " << selector;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(selector), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("llvmpipe"), std::string::npos) << error.what();
    }
  }
}

TEST(DeviceSelection, OpenWithValidationReportsNoMessages) {
  auto device = Device::open("llvmpipe", true);
  EXPECT_NE(device->info().name.find("llvmpipe"), std::string::npos);
  EXPECT_EQ(device->validation_message_count(), 0u);
}

}  // namespace
// MEGANEURA_KERNEL_STATS alone turns on VK_KHR_pipeline_executable_properties; without it the
// extension and its feature stay off while the rest is enabled as before.
TEST(DeviceFeatures, KernelStatisticsOnlyWhenRequested) {
  detail::DeviceFeatures supported;
  supported.known.executable_properties = true;
  supported.known.coop_matrix_nv = true;
  supported.executable_properties.pipelineExecutableInfo = VK_TRUE;
  supported.coop_matrix_nv.cooperativeMatrix = VK_TRUE;
  supported.extensions = {VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME,
                          VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME};
  const auto names = [](const detail::DeviceFeatures& features) {
    return std::vector<std::string>(features.extensions.begin(), features.extensions.end());
  };

  const detail::DeviceFeatures off = detail::features_to_enable(supported, false, false);
  EXPECT_FALSE(off.known.executable_properties);
  EXPECT_EQ(names(off), std::vector<std::string>{VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME});
  EXPECT_EQ(off.coop_matrix_nv.cooperativeMatrix, VK_TRUE);

  const detail::DeviceFeatures on = detail::features_to_enable(supported, false, true);
  EXPECT_TRUE(on.known.executable_properties);
  EXPECT_EQ(on.executable_properties.pipelineExecutableInfo, VK_TRUE);
  EXPECT_EQ(names(on), names(supported));
}

}  // namespace mg::gpu
