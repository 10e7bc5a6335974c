#pragma once
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mg::io {

// Writes a file so that readers (and a later run after a crash or kill) see either the old
// contents or the complete new ones, never a torn mix: bytes go to "<path>.tmp.<pid>", which is
// fsynced and then renamed over <path>; the directory is fsynced so the rename itself survives a
// power loss. Parent directories are created. If the writer is destroyed without commit() the
// temporary file is removed; a process killed mid-write leaves only the stale temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);
  // Makes the new contents visible at the final path. No writes are allowed afterwards.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temporary_path() const { return temporary_path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path temporary_path_;
  int fd_ = -1;
};

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// Reads a whole file. `what` describes it in errors ("checkpoint", "image"), e.g.
// "no image at photos/shirt.png".
std::vector<std::byte> read_whole_file(const std::filesystem::path& path, std::string_view what);

}  // namespace mg::io
