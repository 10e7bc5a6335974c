#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "meganeura/error.hpp"

namespace mg::io {

MappedFile MappedFile::open(const std::filesystem::path& path, std::string_view what) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error("no " + std::string(what) + " at " + path.string());
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error("cannot open " + std::string(what) + " " + path.string() + ": " +
                std::strerror(errno));
  }
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw Error("cannot read " + std::string(what) + " " + path.string() + ": " + reason);
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(status.st_size);
  // mmap refuses a length of zero; an empty file simply has no bytes.
  if (file.size_ > 0) {
    void* address = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      throw Error("cannot map " + std::string(what) + " " + path.string() +
                  " into memory: " + reason);
    }
    file.data_ = static_cast<const std::byte*>(address);
  }
  // The mapping keeps the file's pages reachable; the descriptor is no longer needed.
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace mg::io
