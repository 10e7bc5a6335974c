#include "meganeura/error.hpp"
#include "vk_test_support.hpp"

namespace mg::gpu {
namespace {

class Buffers : public testing::DeviceTest {};

TEST_F(Buffers, AbsurdSizeNamesTheSize) {
  try {
    device_->create_buffer(1ull << 50, BufferUse::device, "absurd");
    FAIL() << "expected an allocation error";
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("1125899906842624"), std::string::npos) << message;
    EXPECT_NE(message.find("absurd"), std::string::npos) << message;
  }
}

TEST_F(Buffers, WriteAndReadThroughStagingAtOffsets) {
  BufferId buffer = device_->create_buffer(4096, BufferUse::device, "data");
  std::vector<uint32_t> values(256);
  for (uint32_t i = 0; i < values.size(); ++i) values[i] = i * 2654435761u;
  device_->write_buffer(buffer, 1024, std::as_bytes(std::span(values)));
  std::vector<uint32_t> back(256);
  device_->read_buffer(buffer, 1024, std::as_writable_bytes(std::span(back)));
  EXPECT_EQ(back, values);
  EXPECT_THROW(device_->read_buffer(buffer, 4000, std::as_writable_bytes(std::span(back))), Error);
}

TEST_F(Buffers, UploadBuffersAreMappedAndDeviceBuffersAreNot) {
  BufferId upload = device_->create_buffer(64, BufferUse::upload, "upload");
  BufferId local = device_->create_buffer(64, BufferUse::device, "local");
  EXPECT_NE(device_->mapped(upload), nullptr);
  EXPECT_THROW(device_->mapped(local), Error);
  device_->destroy_buffer(local);
  EXPECT_THROW(device_->destroy_buffer(local), Error);
}

}  // namespace
}  // namespace mg::gpu
