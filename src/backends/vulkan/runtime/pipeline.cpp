#include "backends/vulkan/runtime/pipeline.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <numeric>
#include <string>

#include "backends/vulkan/parallel_for.hpp"
#include "backends/vulkan/runtime/shader_compiler.hpp"
#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

// Runs a Vulkan two-call enumeration: `query(&count, nullptr)`, then `query(&count, items)`.
template <typename Item, typename Query>
std::vector<Item> enumerate_items(VkStructureType type, Query query) {
  uint32_t count = 0;
  query(&count, nullptr);
  std::vector<Item> items(count, vk_struct<Item>(type));
  query(&count, items.data());
  items.resize(count);
  return items;
}

// One line per executable of `pipeline`: the driver's name for it and its statistics.
std::string statistics_of(VkDevice device, VkPipeline pipeline, const std::string& label) {
  auto get_executables = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto get_statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  if (!get_executables || !get_statistics) return "kernel '" + label + "': no statistics\n";
  auto pipeline_info = vk_struct<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
  pipeline_info.pipeline = pipeline;
  const auto executables = enumerate_items<VkPipelineExecutablePropertiesKHR>(
      VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR,
      [&](uint32_t* count, VkPipelineExecutablePropertiesKHR* items) {
        get_executables(device, &pipeline_info, count, items);
      });
  std::string text;
  for (uint32_t index = 0; index < executables.size(); ++index) {
    auto executable_info =
        vk_struct<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
    executable_info.pipeline = pipeline;
    executable_info.executableIndex = index;
    const auto statistics = enumerate_items<VkPipelineExecutableStatisticKHR>(
        VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR,
        [&](uint32_t* count, VkPipelineExecutableStatisticKHR* items) {
          get_statistics(device, &executable_info, count, items);
        });
    text += "kernel '" + label + "' (" + executables[index].name + "):";
    for (const auto& statistic : statistics) {
      text += std::string(" ") + statistic.name + " ";
      switch (statistic.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
          text += statistic.value.b32 ? "yes" : "no";
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
          text += std::to_string(statistic.value.i64);
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
          text += std::to_string(statistic.value.u64);
          break;
        default:
          text += std::to_string(statistic.value.f64);
      }
      text += ";";
    }
    text += "\n";
  }
  return text;
}

VkPipeline create_pipeline(VkDevice device, VkPipelineCache cache, const KernelSpec& spec,
                           const std::vector<uint32_t>& spirv, VkPipelineLayout layout,
                           bool capture_statistics) {
  auto module_info =
      vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  module_info.codeSize = spirv.size() * sizeof(uint32_t);
  module_info.pCode = spirv.data();
  VkShaderModule module = VK_NULL_HANDLE;
  check(vkCreateShaderModule(device, &module_info, nullptr, &module),
        "loading kernel '" + spec.label + "' into the driver");

  auto info =
      vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  info.stage = vk_struct<VkPipelineShaderStageCreateInfo>(
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = module;
  info.stage.pName = "main";
  info.layout = layout;
  if (capture_statistics) info.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkResult result = vkCreateComputePipelines(device, cache, 1, &info, nullptr, &pipeline);
  vkDestroyShaderModule(device, module, nullptr);
  check(result, "creating the pipeline of kernel '" + spec.label + "'");
  return pipeline;
}

}  // namespace

PipelineLayouts::~PipelineLayouts() {
  for (auto& [key, layout] : layouts_) {
    vkDestroyPipelineLayout(device_, layout.layout, nullptr);
    vkDestroyDescriptorSetLayout(device_, layout.set_layout, nullptr);
  }
}

PipelineLayouts::Layout PipelineLayouts::get(uint32_t binding_count, uint32_t push_constant_bytes) {
  auto key = std::make_pair(binding_count, push_constant_bytes);
  if (auto found = layouts_.find(key); found != layouts_.end()) return found->second;

  std::vector<VkDescriptorSetLayoutBinding> bindings(binding_count);
  for (uint32_t i = 0; i < binding_count; ++i)
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  auto set_info = vk_struct<VkDescriptorSetLayoutCreateInfo>(
      VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  set_info.bindingCount = binding_count;
  set_info.pBindings = bindings.data();
  Layout layout;
  check(vkCreateDescriptorSetLayout(device_, &set_info, nullptr, &layout.set_layout),
        "creating a descriptor set layout");

  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes};
  auto info = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  info.setLayoutCount = 1;
  info.pSetLayouts = &layout.set_layout;
  info.pushConstantRangeCount = push_constant_bytes > 0 ? 1 : 0;
  info.pPushConstantRanges = &push;
  VkResult result = vkCreatePipelineLayout(device_, &info, nullptr, &layout.layout);
  if (result != VK_SUCCESS) {
    vkDestroyDescriptorSetLayout(device_, layout.set_layout, nullptr);
    check(result, "creating a pipeline layout");
  }
  layouts_.emplace(key, layout);
  return layout;
}

std::vector<VkPipeline> build_pipelines(VkDevice device, PipelineCache& cache,
                                        std::span<const KernelSpec> specs,
                                        std::span<const VkPipelineLayout> layouts,
                                        PipelineBuildOptions options, CompileStats& stats) {
  auto started = std::chrono::steady_clock::now();
  std::vector<VkPipeline> pipelines(specs.size(), VK_NULL_HANDLE);
  std::vector<std::exception_ptr> errors(specs.size());
  std::atomic<uint32_t> cache_hits{0};

  // The longest kernels first: the build ends with its slowest compile, so that one should not
  // start last.
  std::vector<size_t> order(specs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return specs[a].source.size() > specs[b].source.size();
  });
  std::vector<double> spirv_seconds(specs.size(), 0.0), driver_seconds(specs.size(), 0.0),
      start_seconds(specs.size(), 0.0);
  const auto seconds_since = [](std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  };
  mg::vulkan::parallel_for(specs.size(), [&](size_t position) {
    const size_t i = order[position];
    start_seconds[i] = seconds_since(started);
    try {
      const auto compile = [&] {
        const auto compile_start = std::chrono::steady_clock::now();
        auto compiled =
            compile_to_spirv(specs[i], options.vulkan_api_version, options.validate_spirv);
        cache.store_spirv(specs[i], compiled);
        spirv_seconds[i] += seconds_since(compile_start);
        return compiled;
      };
      const auto create = [&](const std::vector<uint32_t>& spirv) {
        const auto create_start = std::chrono::steady_clock::now();
        pipelines[i] = create_pipeline(device, cache.handle(), specs[i], spirv, layouts[i],
                                       options.print_statistics);
        driver_seconds[i] += seconds_since(create_start);
      };
      auto spirv = cache.load_spirv(specs[i]);
      if (spirv) {
        cache_hits.fetch_add(1);
        // A cached module the driver refuses is rebuilt from source once; if the rebuilt one
        // fails too, the error is the kernel's, not the cache's.
        try {
          create(*spirv);
        } catch (const mg::Error& error) {
          std::fprintf(stderr,
                       "meganeura: the driver refused kernel cache file %s (%s); rebuilding it\n",
                       cache.describe_spirv_file(specs[i]).c_str(), error.what());
          cache_hits.fetch_sub(1);
          spirv = compile();
        }
      } else {
        spirv = compile();
      }
      if (pipelines[i] == VK_NULL_HANDLE) create(*spirv);
      if (options.print_statistics) {
        std::fputs(statistics_of(device, pipelines[i], specs[i].label).c_str(), stderr);
      }
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });

  for (auto& error : errors) {
    if (!error) continue;
    for (VkPipeline pipeline : pipelines) vkDestroyPipeline(device, pipeline, nullptr);
    std::rethrow_exception(error);
  }
  cache.save();
  stats.pipelines = static_cast<uint32_t>(specs.size());
  stats.spirv_cache_hits = cache_hits.load();
  stats.seconds = seconds_since(started);
  for (size_t i = 0; i < specs.size(); ++i) {
    stats.spirv_seconds += spirv_seconds[i];
    stats.driver_seconds += driver_seconds[i];
  }
  const auto build_seconds = [&](size_t i) { return spirv_seconds[i] + driver_seconds[i]; };
  std::vector<size_t> longest(specs.size());
  std::iota(longest.begin(), longest.end(), size_t{0});
  std::stable_sort(longest.begin(), longest.end(),
                   [&](size_t a, size_t b) { return build_seconds(a) > build_seconds(b); });
  longest.resize(std::min(longest.size(), CompileStats::kCompileTimesListed));
  for (size_t i : longest)
    stats.slowest_kernels.push_back(
        {specs[i].label, start_seconds[i], spirv_seconds[i], driver_seconds[i]});
  if (!longest.empty()) {
    stats.slowest_kernel = specs[longest[0]].label;
    stats.slowest_kernel_seconds = build_seconds(longest[0]);
  }
  return pipelines;
}

}  // namespace mg::gpu::detail
