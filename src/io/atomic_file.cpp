#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "meganeura/error.hpp"

namespace mg::io {
namespace {

std::string system_error_text() {
  return std::strerror(errno);
}

// Without this a rename can be lost on power failure even though the file data was synced.
void fsync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // Some filesystems refuse to open directories; the rename still happened.
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  const std::filesystem::path parent = path_.parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      throw Error("cannot create directory " + parent.string() + " for " + path_.string() + ": " +
                  error.message());
    }
  }
  temporary_path_ = path_;
  temporary_path_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error("cannot write " + path_.string() + ": opening " + temporary_path_.string() +
                " failed: " + system_error_text());
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_path_.c_str());
  }
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) throw Error("cannot write " + path_.string() + ": the file was already committed");
  const auto* data = reinterpret_cast<const char*>(bytes.data());
  size_t remaining = bytes.size();
  while (remaining > 0) {
    const ssize_t written = ::write(fd_, data, remaining);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_.string() + ": " + system_error_text());
    }
    data += written;
    remaining -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::write(std::string_view text) {
  write(std::as_bytes(std::span(text.data(), text.size())));
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw Error("cannot write " + path_.string() + ": the file was already committed");
  if (::fsync(fd_) != 0) {
    throw Error("cannot write " + path_.string() + ": fsync failed: " + system_error_text());
  }
  const int close_result = ::close(fd_);
  fd_ = -1;
  if (close_result != 0) {
    ::unlink(temporary_path_.c_str());
    throw Error("cannot write " + path_.string() + ": close failed: " + system_error_text());
  }
  if (::rename(temporary_path_.c_str(), path_.c_str()) != 0) {
    const std::string reason = system_error_text();
    ::unlink(temporary_path_.c_str());
    throw Error("cannot write " + path_.string() + ": rename from " + temporary_path_.string() +
                " failed: " + reason);
  }
  fsync_directory(path_.parent_path());
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes);
  writer.commit();
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

std::vector<std::byte> read_whole_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error("no " + std::string(what) + " at " + path.string());
  }
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw Error("cannot open " + std::string(what) + " " + path.string());
  const auto size = std::filesystem::file_size(path, error);
  if (error) throw Error("cannot read " + std::string(what) + " " + path.string());
  std::vector<std::byte> bytes(size);
  stream.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (static_cast<size_t>(stream.gcount()) != size) {
    throw Error("cannot read " + std::string(what) + " " + path.string() + ": short read");
  }
  return bytes;
}

}  // namespace mg::io
