#include <fstream>

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
