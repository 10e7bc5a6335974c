#include "io/atomic_file.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "io/safetensors.hpp"
#include "scratch_dir.hpp"
#include "tensor_samples.hpp"

namespace mg::io {
namespace {

class AtomicFileTest : public testing::ScratchDirTest {
 protected:
  // A small valid file standing in for the previous checkpoint.
  SafetensorsFile old_file() {
    std::mt19937 random(3);
    SafetensorsFile file;
    file.metadata["generation"] = "old";
    file.tensors.push_back(testing::random_tensor("w", DType::f32, {16, 16}, random));
    return file;
  }

  void expect_old_file_intact(const std::filesystem::path& file, const SafetensorsFile& old) {
    const SafetensorsFile read = read_safetensors(file);
    EXPECT_EQ(read.metadata.at("generation"), "old");
    ASSERT_EQ(read.tensors.size(), 1u);
    EXPECT_EQ(read.tensors[0].bytes, old.tensors[0].bytes);
  }
};

std::vector<std::byte> big_buffer(size_t bytes) {
  std::vector<std::byte> buffer(bytes);
  std::mt19937 random(11);
  for (auto& byte : buffer) byte = std::byte(random());
  return buffer;
}

TEST_F(AtomicFileTest, CreatesParentDirectoriesAndLeavesNoTemporaryFile) {
  const auto file = path("a/b/c/data.bin");
  write_file_atomically(file, std::string_view("hello"));
  EXPECT_EQ(testing::read_bytes(file).size(), 5u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(file.parent_path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(AtomicFileTest, AbandonedWriterRemovesItsTemporaryFile) {
  std::filesystem::path temporary;
  {
    AtomicFileWriter writer(path("data.bin"));
    writer.write(std::string_view("partial"));
    temporary = writer.temporary_path();
    EXPECT_TRUE(std::filesystem::exists(temporary));
  }
  EXPECT_FALSE(std::filesystem::exists(temporary));
  EXPECT_FALSE(std::filesystem::exists(path("data.bin")));
}

TEST_F(AtomicFileTest, WriterThatExitsMidWayLeavesOldFileIntact) {
  const auto file = path("ckpt.safetensors");
  const SafetensorsFile old = old_file();
  write_safetensors(file, old);
  const auto buffer = big_buffer(8 << 20);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    AtomicFileWriter writer(file);
    writer.write(std::span(buffer).first(buffer.size() / 2));
    ::_exit(0);  // no destructor, no commit: as if the process died here
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));

  expect_old_file_intact(file, old);
  const auto stale = path("ckpt.safetensors.tmp." + std::to_string(child));
  ASSERT_TRUE(std::filesystem::exists(stale));
  EXPECT_EQ(std::filesystem::file_size(stale), buffer.size() / 2);
}

TEST_F(AtomicFileTest, WriterKilledBySignalLeavesOldFileIntact) {
  const auto file = path("ckpt.safetensors");
  const SafetensorsFile old = old_file();
  write_safetensors(file, old);
  const auto chunk = big_buffer(1 << 20);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    AtomicFileWriter writer(file);
    for (int i = 0; i < 64; ++i) writer.write(chunk);
    ::pause();  // wait to be killed before commit
    ::_exit(1);
  }
  const auto stale = path("ckpt.safetensors.tmp." + std::to_string(child));
  for (int i = 0;
       i < 500 && !(std::filesystem::exists(stale) && std::filesystem::file_size(stale) > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  expect_old_file_intact(file, old);
}

TEST_F(AtomicFileTest, ReadWholeFileNamesMissingFile) {
  testing::expect_error([&] { read_whole_file(path("gone.bin"), "weights file"); },
                        {"no weights file at", path("gone.bin").string()});
}

}  // namespace
}  // namespace mg::io
