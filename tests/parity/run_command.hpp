#pragma once
// Runs a shell command (the PyTorch twins under /usr/bin/python3) and returns what it printed;
// a non-zero exit fails the calling test with the command and its output.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace mg {

inline std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot start: " << command;
    return output;
  }
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, read);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << "command failed: " << command << "\n" << output;
  return output;
}

}  // namespace mg
