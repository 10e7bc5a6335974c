#include "backends/vulkan/runtime/physical_device.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string>

#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu {
namespace detail {
namespace {

DeviceKind kind_of(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return DeviceKind::discrete;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return DeviceKind::integrated;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return DeviceKind::virtual_gpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return DeviceKind::cpu;
    default:
      return DeviceKind::other;
  }
}

ScalarType scalar_of(uint32_t component_type) {
  switch (component_type) {
    case VK_COMPONENT_TYPE_FLOAT16_NV:
      return ScalarType::f16;
    case VK_COMPONENT_TYPE_FLOAT32_NV:
      return ScalarType::f32;
    case VK_COMPONENT_TYPE_FLOAT64_NV:
      return ScalarType::f64;
    case VK_COMPONENT_TYPE_SINT8_NV:
      return ScalarType::i8;
    case VK_COMPONENT_TYPE_UINT8_NV:
      return ScalarType::u8;
    case VK_COMPONENT_TYPE_SINT32_NV:
      return ScalarType::i32;
    case VK_COMPONENT_TYPE_UINT32_NV:
      return ScalarType::u32;
    case VK_COMPONENT_TYPE_BFLOAT16_KHR:
      return ScalarType::bf16;
    default:
      return ScalarType::other;
  }
}

std::vector<std::string> extensions_of(VkPhysicalDevice device) {
  uint32_t count = 0;
  vkEnumerateDeviceExtensionProperties(device, nullptr, &count, nullptr);
  std::vector<VkExtensionProperties> properties(count);
  vkEnumerateDeviceExtensionProperties(device, nullptr, &count, properties.data());
  std::vector<std::string> names;
  for (const auto& property : properties) names.emplace_back(property.extensionName);
  return names;
}

bool has(const std::vector<std::string>& extensions, const char* name) {
  return std::find(extensions.begin(), extensions.end(), name) != extensions.end();
}

constexpr uint32_t kSubgroupScope = 3;  // VK_SCOPE_SUBGROUP_NV and VK_SCOPE_SUBGROUP_KHR

// Only subgroup-scope shapes are listed: those are what a GLSL kernel can use without
// workgroup-scope (coopmat2) support.
void read_coop_matrix_configs(VkInstance instance, VkPhysicalDevice device,
                              const DeviceFeatures& features, std::vector<CoopMatrixConfig>& out) {
  if (features.known.coop_matrix_nv && features.coop_matrix_nv.cooperativeMatrix) {
    auto query = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    uint32_t count = 0;
    if (query != nullptr && query(device, &count, nullptr) == VK_SUCCESS) {
      std::vector<VkCooperativeMatrixPropertiesNV> shapes(
          count, vk_struct<VkCooperativeMatrixPropertiesNV>(
                     VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV));
      query(device, &count, shapes.data());
      for (const auto& s : shapes)
        if (static_cast<uint32_t>(s.scope) == kSubgroupScope)
          out.push_back({s.MSize, s.NSize, s.KSize, scalar_of(s.AType), scalar_of(s.BType),
                         scalar_of(s.CType), scalar_of(s.DType), false});
    }
  }
  if (features.known.coop_matrix_khr && features.coop_matrix_khr.cooperativeMatrix) {
    auto query = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    uint32_t count = 0;
    if (query != nullptr && query(device, &count, nullptr) == VK_SUCCESS) {
      std::vector<VkCooperativeMatrixPropertiesKHR> shapes(
          count, vk_struct<VkCooperativeMatrixPropertiesKHR>(
                     VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR));
      query(device, &count, shapes.data());
      for (const auto& s : shapes)
        if (static_cast<uint32_t>(s.scope) == kSubgroupScope && !s.saturatingAccumulation)
          out.push_back({s.MSize, s.NSize, s.KSize, scalar_of(s.AType), scalar_of(s.BType),
                         scalar_of(s.CType), scalar_of(s.ResultType), true});
    }
  }
}

constexpr uint32_t kWorkgroupScope = 2;  // VK_SCOPE_WORKGROUP_KHR

// What workgroup-scope matrices allow; `properties` is VK_NV_cooperative_matrix2's limits, read
// with the other properties.
void read_workgroup_coop_matrix(VkInstance instance, VkPhysicalDevice device,
                                const DeviceFeatures& features,
                                const VkPhysicalDeviceCooperativeMatrix2PropertiesNV& properties,
                                WorkgroupCoopMatrixCaps& out) {
  if (!features.known.coop_matrix2_nv ||
      !features.coop_matrix2_nv.cooperativeMatrixWorkgroupScope ||
      !features.coop_matrix2_nv.cooperativeMatrixFlexibleDimensions)
    return;
  auto query =
      reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV>(
          vkGetInstanceProcAddr(
              instance, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"));
  uint32_t count = 0;
  if (query == nullptr || query(device, &count, nullptr) != VK_SUCCESS) return;
  std::vector<VkCooperativeMatrixFlexibleDimensionsPropertiesNV> configs(
      count, vk_struct<VkCooperativeMatrixFlexibleDimensionsPropertiesNV>(
                 VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV));
  if (query(device, &count, configs.data()) != VK_SUCCESS) return;
  for (const auto& c : configs)
    if (static_cast<uint32_t>(c.scope) == kWorkgroupScope && !c.saturatingAccumulation)
      out.configs.push_back({c.MGranularity, c.NGranularity, c.KGranularity, scalar_of(c.AType),
                             scalar_of(c.BType), scalar_of(c.CType), scalar_of(c.ResultType),
                             c.workgroupInvocations});
  out.available = !out.configs.empty();
  out.max_workgroup_invocations = properties.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize;
  out.max_dimension = properties.cooperativeMatrixFlexibleDimensionsMaxDimension;
  out.reserved_shared_memory_bytes = properties.cooperativeMatrixWorkgroupScopeReservedSharedMemory;
  out.tensor_addressing =
      out.available && features.coop_matrix2_nv.cooperativeMatrixTensorAddressing;
}

// Prefers a queue family that can also write timestamps, so profiles work.
void choose_compute_queue(VkPhysicalDevice device, PhysicalDevice& out) {
  uint32_t count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(device, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vkGetPhysicalDeviceQueueFamilyProperties(device, &count, families.data());
  uint32_t& timestamp_bits = out.timestamp_valid_bits;
  for (uint32_t i = 0; i < count; ++i) {
    if ((families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) == 0) continue;
    bool better = out.compute_queue_family == kNoQueueFamily ||
                  (timestamp_bits == 0 && families[i].timestampValidBits > 0);
    if (!better) continue;
    out.compute_queue_family = i;
    timestamp_bits = families[i].timestampValidBits;
  }
  out.info.caps.timestamps = timestamp_bits > 0 && out.limits.timestampPeriod > 0;
}

// Appends `link` to the pNext chain whose last pointer is `tail`.
template <class Link>
void chain(void**& tail, Link& link) {
  *tail = &link;
  tail = &link.pNext;
}

void read_properties(VkInstance instance, VkPhysicalDevice device,
                     const std::vector<std::string>& extensions, PhysicalDevice& out) {
  auto properties =
      vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  auto subgroup = vk_struct<VkPhysicalDeviceSubgroupProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto size_control = vk_struct<VkPhysicalDeviceSubgroupSizeControlProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES);
  auto driver = vk_struct<VkPhysicalDeviceDriverProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
  // Core in Vulkan 1.1, which every device read here has.
  auto maintenance = vk_struct<VkPhysicalDeviceMaintenance3Properties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
  // The compute unit count, where a vendor extension reports it.
  auto nv_sm = vk_struct<VkPhysicalDeviceShaderSMBuiltinsPropertiesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV);
  auto amd_core = vk_struct<VkPhysicalDeviceShaderCorePropertiesAMD>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD);
  auto amd_core2 = vk_struct<VkPhysicalDeviceShaderCoreProperties2AMD>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_2_AMD);
  auto arm_core = vk_struct<VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_BUILTINS_PROPERTIES_ARM);
  auto coop_matrix2 = vk_struct<VkPhysicalDeviceCooperativeMatrix2PropertiesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV);
  const bool driver_known = out.api_version >= VK_API_VERSION_1_2 ||
                            has(extensions, VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME);
  const bool nv = has(extensions, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
  const bool amd = has(extensions, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME);
  const bool amd2 = has(extensions, VK_AMD_SHADER_CORE_PROPERTIES_2_EXTENSION_NAME);
  const bool arm = has(extensions, VK_ARM_SHADER_CORE_BUILTINS_EXTENSION_NAME);
  void** tail = &properties.pNext;
  chain(tail, subgroup);
  chain(tail, maintenance);
  if (out.features.known.subgroup_size_control) chain(tail, size_control);
  if (driver_known) chain(tail, driver);
  if (nv) chain(tail, nv_sm);
  if (amd) chain(tail, amd_core);
  if (amd2) chain(tail, amd_core2);
  if (arm) chain(tail, arm_core);
  if (out.features.known.coop_matrix2_nv) chain(tail, coop_matrix2);
  vkGetPhysicalDeviceProperties2(device, &properties);

  const auto& p = properties.properties;
  out.limits = p.limits;
  out.info.name = p.deviceName;
  out.info.kind = kind_of(p.deviceType);
  out.info.vendor_id = p.vendorID;
  out.info.device_id = p.deviceID;
  out.info.driver_version = p.driverVersion;
  std::copy(std::begin(p.pipelineCacheUUID), std::end(p.pipelineCacheUUID),
            out.info.pipeline_cache_uuid.begin());
  if (driver_known) out.info.driver_name = driver.driverName;

  DeviceCaps& caps = out.info.caps;
  caps.api_version = out.api_version;
  caps.subgroup_size = subgroup.subgroupSize;
  if (out.features.known.subgroup_size_control &&
      out.features.subgroup_size_control.subgroupSizeControl) {
    caps.min_subgroup_size = size_control.minSubgroupSize;
    caps.max_subgroup_size = size_control.maxSubgroupSize;
  }
  caps.max_shared_memory_bytes = p.limits.maxComputeSharedMemorySize;
  caps.max_workgroup_invocations = p.limits.maxComputeWorkGroupInvocations;
  if (nv) caps.compute_units = nv_sm.shaderSMCount;
  // The active units of a harvested die where the driver says, else the full layout.
  if (amd2 && amd_core2.activeComputeUnitCount > 0)
    caps.compute_units = amd_core2.activeComputeUnitCount;
  else if (amd)
    caps.compute_units = amd_core.shaderEngineCount * amd_core.shaderArraysPerEngineCount *
                         amd_core.computeUnitsPerShaderArray;
  if (arm) caps.compute_units = arm_core.shaderCoreCount;
  std::copy_n(p.limits.maxComputeWorkGroupSize, 3, caps.max_workgroup_size.begin());
  std::copy_n(p.limits.maxComputeWorkGroupCount, 3, caps.max_workgroup_count.begin());
  caps.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  caps.max_memory_allocation_size = maintenance.maxMemoryAllocationSize;
  caps.min_storage_buffer_offset_alignment = p.limits.minStorageBufferOffsetAlignment;
  caps.max_push_constants_bytes = p.limits.maxPushConstantsSize;
  caps.max_storage_buffers_per_stage = p.limits.maxPerStageDescriptorStorageBuffers;
  caps.timestamp_period_ns = p.limits.timestampPeriod;
  read_workgroup_coop_matrix(instance, device, out.features, coop_matrix2,
                             caps.workgroup_coop_matrix);
}

void read_memory(VkPhysicalDevice device, PhysicalDevice& out) {
  vkGetPhysicalDeviceMemoryProperties(device, &out.memory);
  for (uint32_t i = 0; i < out.memory.memoryHeapCount; ++i) {
    const auto& heap = out.memory.memoryHeaps[i];
    out.info.caps.heaps.push_back({heap.size, (heap.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  }
}

}  // namespace

PhysicalDevice describe_physical_device(VkInstance instance, uint32_t instance_api_version,
                                        bool validation, VkPhysicalDevice handle, uint32_t index) {
  PhysicalDevice device;
  device.handle = handle;
  device.info.index = index;
  VkPhysicalDeviceProperties basic;
  vkGetPhysicalDeviceProperties(handle, &basic);
  device.api_version = std::min(basic.apiVersion, instance_api_version);
  if (device.api_version < VK_API_VERSION_1_1) {
    // Listed so that indices match the driver's order, but never chosen automatically.
    device.info.name = basic.deviceName;
    device.info.kind = DeviceKind::other;
    device.info.caps.api_version = device.api_version;
    return device;
  }
  auto extensions = extensions_of(handle);
  // Debian's validation layer (1.3.239) predates VK_NV_cooperative_matrix2 and reports its
  // structs in every query, so a validated instance does without it (as it does without the
  // KHR cooperative matrices, device_features.cpp).
  if (validation) std::erase(extensions, std::string(VK_NV_COOPERATIVE_MATRIX_2_EXTENSION_NAME));
  device.features = query_features(handle, device.api_version, extensions);
  read_properties(instance, handle, extensions, device);
  read_memory(handle, device);
  read_feature_caps(device);
  choose_compute_queue(handle, device);
  read_coop_matrix_configs(instance, handle, device.features, device.info.caps.coop_matrix);
  return device;
}

void read_feature_caps(PhysicalDevice& out) {
  const DeviceFeatures& f = out.features;
  DeviceCaps& caps = out.info.caps;
  caps.shader_f16 = f.known.float16_int8 && f.float16_int8.shaderFloat16;
  caps.storage_f16 = f.storage16.storageBuffer16BitAccess;
  caps.shader_bf16 = f.known.bf16 && f.bf16.shaderBFloat16Type;
  caps.coop_matrix_bf16 = caps.shader_bf16 && f.bf16.shaderBFloat16CooperativeMatrix;
  caps.float_atomic_add = f.known.atomic_float && f.atomic_float.shaderBufferFloat32AtomicAdd;
}

std::vector<PhysicalDevice> enumerate_physical_devices(const Instance& instance) {
  uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance.handle(), &count, nullptr), "listing Vulkan devices");
  std::vector<VkPhysicalDevice> handles(count);
  check(vkEnumeratePhysicalDevices(instance.handle(), &count, handles.data()),
        "listing Vulkan devices");

  std::vector<PhysicalDevice> devices;
  for (uint32_t index = 0; index < count; ++index)
    devices.push_back(describe_physical_device(instance.handle(), instance.api_version(),
                                               instance.validation(), handles[index], index));
  if (devices.empty())
    throw Error(
        "the Vulkan driver reports no device: install your GPU's Vulkan driver, or "
        "mesa-vulkan-drivers for the CPU fallback (Lavapipe)");
  return devices;
}

}  // namespace detail

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::discrete:
      return "discrete";
    case DeviceKind::integrated:
      return "integrated";
    case DeviceKind::virtual_gpu:
      return "virtual";
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::other:
      break;
  }
  return "other";
}

std::vector<DeviceInfo> list_devices() {
  detail::Instance instance(false);
  std::vector<DeviceInfo> infos;
  for (auto& device : detail::enumerate_physical_devices(instance))
    infos.push_back(std::move(device.info));
  return infos;
}

namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int preference(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::discrete:
      return 0;
    case DeviceKind::integrated:
      return 1;
    case DeviceKind::virtual_gpu:
      return 2;
    case DeviceKind::cpu:
      return 3;
    case DeviceKind::other:
      break;
  }
  return 4;
}

std::string device_list(const std::vector<DeviceInfo>& devices) {
  std::string out;
  for (const auto& d : devices)
    out += "\n  " + std::to_string(d.index) + ": " + d.name + " (" +
           std::string(device_kind_name(d.kind)) + ")";
  return out;
}

}  // namespace

uint32_t choose_device(const std::vector<DeviceInfo>& devices, std::string_view selector,
                       const Switches& switches) {
  if (devices.empty()) throw Error("no Vulkan device to choose from");
  const bool from_switches = selector.empty() && !switches.device.empty();
  if (selector.empty()) selector = switches.device;
  if (selector.empty()) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < devices.size(); ++i)
      if (preference(devices[i].kind) < preference(devices[best].kind)) best = i;
    return best;
  }
  bool is_index = std::all_of(selector.begin(), selector.end(),
                              [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (is_index) {
    unsigned long index = std::strtoul(std::string(selector).c_str(), nullptr, 10);
    if (selector.size() < 10 && index < devices.size()) return static_cast<uint32_t>(index);
  } else {
    std::string wanted = lowercase(selector);
    for (uint32_t i = 0; i < devices.size(); ++i)
      if (lowercase(devices[i].name).find(wanted) != std::string::npos) return i;
  }
  throw Error("no Vulkan device matches \"" + std::string(selector) + "\"" +
              (from_switches ? " (from MEGANEURA_DEVICE)" : "") +
              "; give an index or part of a name. Devices:" + device_list(devices));
}

std::string describe_device(const DeviceInfo& info) {
  const DeviceCaps& caps = info.caps;
  std::ostringstream line;
  line << info.index << ": " << info.name << " (" << device_kind_name(info.kind) << ") | Vulkan "
       << VK_API_VERSION_MAJOR(caps.api_version) << "." << VK_API_VERSION_MINOR(caps.api_version);
  if (!info.driver_name.empty()) line << " | " << info.driver_name;
  line << " | subgroup " << caps.subgroup_size;
  if (caps.max_subgroup_size != 0)
    line << " (" << caps.min_subgroup_size << "-" << caps.max_subgroup_size << ")";
  uint64_t device_local = 0;
  for (const auto& heap : caps.heaps)
    if (heap.device_local) device_local = std::max(device_local, heap.bytes);
  line << " | shared " << caps.max_shared_memory_bytes / 1024 << " KiB"
       << " | memory " << device_local / (1024 * 1024) << " MiB"
       << " | f16 " << (caps.shader_f16 ? "yes" : "no") << " | bf16 "
       << (caps.shader_bf16 ? "yes" : "no") << " | coopmat "
       << (caps.coop_matrix.empty() ? "none" : std::to_string(caps.coop_matrix.size()) + " shapes")
       << " | timestamps " << (caps.timestamps ? "yes" : "no");
  return line.str();
}

}  // namespace mg::gpu
