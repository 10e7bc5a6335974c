#pragma once
// Runs the `meganeura` binary as a user would, with its exit status and output.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace cli_test {

struct Result {
  int status = -1;
  std::string output;
};

// `arguments` after the binary; stderr joins stdout unless `with_stderr` is false (then it is
// dropped, for commands whose stdout is parsed).
inline Result run(const std::string& arguments, bool with_stderr = true) {
  Result result;
  const std::string command =
      std::string(MEGANEURA_BINARY) + " " + arguments + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof(buffer), pipe))
    result.output.append(buffer, read);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// An empty folder meganeura-<suite>-<name>-<pid> under the temporary directory, one a process
// since ctest runs a suite's tests side by side.
inline std::filesystem::path scratch_folder(const std::string& suite, const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("meganeura-" + suite + "-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

}  // namespace cli_test
