#include <fstream>
#include <random>

#include "backends/vulkan/runtime/cache_file.hpp"
#include "vk_test_support.hpp"

namespace mg::gpu {
namespace {

namespace fs = std::filesystem;

class PipelineCacheTest : public testing::DeviceTest {
 protected:
  std::vector<fs::path> files_in(const std::string& folder) {
    std::vector<fs::path> files;
    if (fs::exists(cache_.path() / folder))
      for (const auto& entry : fs::directory_iterator(cache_.path() / folder))
        files.push_back(entry.path());
    return files;
  }

  std::string contents(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), {}};
  }

  uint32_t build_once() {
    device_->create_pipelines(std::vector{testing::scale_add_kernel()});
    EXPECT_EQ(device_->last_compile_stats().pipelines, 1u);
    return device_->last_compile_stats().spirv_cache_hits;
  }
};

TEST_F(PipelineCacheTest, SecondBuildHitsSpirvCache) {
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(build_once(), 1u);
  EXPECT_EQ(files_in("spirv").size(), 1u);
  EXPECT_EQ(files_in("pipelines").size(), 1u);
}

// The build's parts: SPIR-V time only for kernels compiled from source, driver time for every
// pipeline, and the slowest kernel named with a time no more than its own two parts allow; both
// kernels listed, longest first, each with its own parts, started within the build.
TEST_F(PipelineCacheTest, CompileStatsSplitSpirvAndDriverTimeAndNameTheSlowestKernel) {
  KernelSpec doubled = testing::scale_add_kernel();
  KernelSpec tripled = testing::scale_add_kernel();
  doubled.label = "scale_add doubled";
  tripled.label = "scale_add tripled";
  tripled.defines = {{"GROUP", "64"}, {"SCALE", "3.0"}};
  const std::vector<KernelSpec> specs{doubled, tripled};

  device_->create_pipelines(specs);
  const CompileStats cold = device_->last_compile_stats();
  EXPECT_EQ(cold.spirv_cache_hits, 0u);
  EXPECT_GT(cold.spirv_seconds, 0.0);
  EXPECT_GT(cold.driver_seconds, 0.0);
  EXPECT_TRUE(cold.slowest_kernel == doubled.label || cold.slowest_kernel == tripled.label)
      << cold.slowest_kernel;
  EXPECT_GT(cold.slowest_kernel_seconds, 0.0);
  EXPECT_LE(cold.slowest_kernel_seconds, cold.spirv_seconds + cold.driver_seconds);
  ASSERT_EQ(cold.slowest_kernels.size(), 2u);
  EXPECT_EQ(cold.slowest_kernels[0].label, cold.slowest_kernel);
  EXPECT_NE(cold.slowest_kernels[1].label, cold.slowest_kernel);
  double spirv = 0, driver = 0;
  for (const CompileStats::KernelTime& kernel : cold.slowest_kernels) {
    EXPECT_GT(kernel.spirv_seconds, 0.0) << kernel.label;
    EXPECT_GT(kernel.driver_seconds, 0.0) << kernel.label;
    EXPECT_GE(kernel.start_seconds, 0.0) << kernel.label;
    EXPECT_LE(kernel.start_seconds + kernel.spirv_seconds + kernel.driver_seconds, cold.seconds)
        << kernel.label;
    spirv += kernel.spirv_seconds;
    driver += kernel.driver_seconds;
  }
  EXPECT_DOUBLE_EQ(cold.slowest_kernels[0].spirv_seconds + cold.slowest_kernels[0].driver_seconds,
                   cold.slowest_kernel_seconds);
  EXPECT_GE(cold.slowest_kernel_seconds,
            cold.slowest_kernels[1].spirv_seconds + cold.slowest_kernels[1].driver_seconds);
  EXPECT_DOUBLE_EQ(spirv, cold.spirv_seconds);
  EXPECT_DOUBLE_EQ(driver, cold.driver_seconds);

  device_->create_pipelines(specs);
  const CompileStats warm = device_->last_compile_stats();
  EXPECT_EQ(warm.spirv_cache_hits, 2u);
  EXPECT_EQ(warm.spirv_seconds, 0.0);
  EXPECT_GT(warm.driver_seconds, 0.0);
  EXPECT_LE(warm.slowest_kernel_seconds, warm.driver_seconds);
}

TEST_F(PipelineCacheTest, CorruptSpirvFileIsIgnoredAndRewritten) {
  EXPECT_EQ(build_once(), 0u);
  auto files = files_in("spirv");
  ASSERT_EQ(files.size(), 1u);
  const std::string original = contents(files[0]);

  fs::resize_file(files[0], original.size() / 2);  // truncated
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(contents(files[0]), original);

  std::string flipped = original;  // same length, one payload byte changed
  flipped[flipped.size() - 7] ^= 0x5a;
  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << flipped;
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(contents(files[0]), original);

  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << "garbage";
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(build_once(), 1u);
}

// A file whose checksum matches (so written as it is read) but whose SPIR-V is truncated or
// garbage must never reach the driver, which may crash on it.
TEST_F(PipelineCacheTest, MalformedSpirvWithAValidChecksumIsRebuilt) {
  EXPECT_EQ(build_once(), 0u);
  auto files = files_in("spirv");
  ASSERT_EQ(files.size(), 1u);
  const std::string original = contents(files[0]);
  const auto payload = detail::read_cache_file(files[0]);
  ASSERT_TRUE(payload);

  const size_t half = payload->size() / 8 * 4;
  ASSERT_TRUE(detail::write_cache_file(files[0], std::span(payload->data(), half)));
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(contents(files[0]), original);

  std::vector<uint32_t> garbage(payload->size() / 4);
  std::mt19937 random(11);
  for (uint32_t& word : garbage) word = static_cast<uint32_t>(random());
  std::memcpy(garbage.data(), payload->data(), 20);  // a valid header over random instructions
  ASSERT_TRUE(detail::write_cache_file(files[0], std::as_bytes(std::span(garbage))));
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(contents(files[0]), original);
  EXPECT_EQ(build_once(), 1u);
}

TEST_F(PipelineCacheTest, CorruptPipelineBlobStillOpens) {
  build_once();
  auto blobs = files_in("pipelines");
  ASSERT_EQ(blobs.size(), 1u);
  std::string blob = contents(blobs[0]);
  blob[blob.size() / 2] ^= 0xff;
  std::ofstream(blobs[0], std::ios::binary | std::ios::trunc) << blob;
  device_.reset();
  device_ = Device::open("", true, switches());
  EXPECT_EQ(build_once(), 1u);
}

TEST_F(PipelineCacheTest, DisabledCacheWritesNothing) {
  device_.reset();
  device_ =
      Device::open("", true,
                   Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache_.path().string()},
                                               {"MEGANEURA_NO_CACHE", "1"}}));
  EXPECT_EQ(build_once(), 0u);
  EXPECT_EQ(build_once(), 0u);
  EXPECT_TRUE(files_in("spirv").empty());
}

}  // namespace
}  // namespace mg::gpu
