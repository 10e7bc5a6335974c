#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "meganeura/error.hpp"

namespace mg::io::testing {

inline constexpr const char* kPython = "/usr/bin/python3";

// A fresh directory per test, removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / ("mg_io_" + std::to_string(::getpid()) + "_" +
                                                     info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path path(const std::string& name) const { return dir_ / name; }

  std::filesystem::path dir_;
};

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Runs a Python script with arguments; returns its exit status.
inline int run_python(const std::filesystem::path& script, const std::string& arguments) {
  const std::string command = std::string(kPython) + " " + script.string() + " " + arguments;
  return std::system(command.c_str());
}

// Asserts that `action` throws mg::Error whose message contains every one of `fragments`.
inline void expect_error(const std::function<void()>& action,
                         const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "expected mg::Error containing '" << fragments.front() << "'";
  } catch (const mg::Error& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message spans lines: " << message;
  }
}

}  // namespace mg::io::testing
