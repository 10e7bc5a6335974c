#pragma once
#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace mg::io {

// A whole file mapped read-only into memory (mmap), so a multi-gigabyte weight file is paged in
// on demand instead of copied. The bytes stay at the same address until the object is destroyed,
// moves included, so spans into them survive moving the owner. Another process truncating the
// file while it is mapped makes reads past the new end fault: weight files are never rewritten
// in place (see atomic_file.hpp), only replaced.
class MappedFile {
 public:
  // `what` names the kind of file in errors ("safetensors file", "model folder shard").
  static MappedFile open(const std::filesystem::path& path, std::string_view what);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::filesystem::path& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mg::io
