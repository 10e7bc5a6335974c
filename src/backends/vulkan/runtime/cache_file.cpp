#include "backends/vulkan/runtime/cache_file.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

namespace mg::gpu::detail {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'C', 'A', 'C', 'H', 'E', '\0'};
constexpr uint32_t kFormatVersion = 1;

struct Header {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t payload_bytes;
  uint64_t payload_checksum;
};
static_assert(sizeof(Header) == 32);

std::filesystem::path temporary_path_for(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  uint64_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  return path.string() + ".tmp." + std::to_string(getpid()) + "." + std::to_string(thread) + "." +
         std::to_string(counter.fetch_add(1));
}

}  // namespace

uint64_t fnv1a64(std::span<const std::byte> bytes, uint64_t hash) {
  for (std::byte b : bytes) {
    hash ^= static_cast<uint64_t>(b);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint64_t fnv1a64(std::string_view text, uint64_t hash) {
  return fnv1a64(std::as_bytes(std::span(text.data(), text.size())), hash);
}

std::optional<std::vector<std::byte>> read_cache_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  Header header;
  if (!file.read(reinterpret_cast<char*>(&header), sizeof header)) return std::nullopt;
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0 ||
      header.format_version != kFormatVersion || header.header_bytes != sizeof(Header))
    return std::nullopt;

  // Compare with the real size before allocating, so a corrupt length cannot ask for terabytes.
  std::error_code error;
  uint64_t file_bytes = std::filesystem::file_size(path, error);
  if (error || file_bytes != sizeof(Header) + header.payload_bytes) return std::nullopt;

  std::vector<std::byte> payload(header.payload_bytes);
  if (!file.read(reinterpret_cast<char*>(payload.data()),
                 static_cast<std::streamsize>(payload.size())))
    return std::nullopt;
  if (fnv1a64(payload) != header.payload_checksum) return std::nullopt;
  return payload;
}

bool write_cache_file(const std::filesystem::path& path, std::span<const std::byte> payload) {
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  if (error) return false;

  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.format_version = kFormatVersion;
  header.header_bytes = sizeof(Header);
  header.payload_bytes = payload.size();
  header.payload_checksum = fnv1a64(payload);

  const std::filesystem::path temporary = temporary_path_for(path);
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(&header), sizeof header);
    file.write(reinterpret_cast<const char*>(payload.data()),
               static_cast<std::streamsize>(payload.size()));
    file.close();
    if (!file) {
      std::filesystem::remove(temporary, error);
      return false;
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    return false;
  }
  return true;
}

}  // namespace mg::gpu::detail
