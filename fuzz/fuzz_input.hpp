#pragma once
// What every fuzz target shares: the input written to a file (the loaders take paths, as users
// give them), and the rule a loader must keep: bad input ends in one mg::Error line, and nothing
// else escapes (another exception reads as "internal error" to a user, so it counts as a crash).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "meganeura/error.hpp"

namespace mg::fuzz {

// A folder of this process's own under /tmp (or $TMPDIR), made once.
inline const std::filesystem::path& scratch_folder() {
  static const std::filesystem::path folder = [] {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("meganeura-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path;
  }();
  return folder;
}

inline std::filesystem::path write_input(const std::string& name, const uint8_t* data,
                                         size_t size) {
  const std::filesystem::path path = scratch_folder() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs `load`; an mg::Error must be one line, any other exception aborts (a finding).
template <typename Load>
void expect_loaded_or_one_line_error(Load load) {
  try {
    load();
  } catch (const Error& error) {
    if (std::strchr(error.what(), '\n') != nullptr || std::strlen(error.what()) > 2000) {
      std::fprintf(stderr, "error message is not one short line: %s\n", error.what());
      std::abort();
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "an exception other than mg::Error escaped: %s\n", error.what());
    std::abort();
  }
}

}  // namespace mg::fuzz
