#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace mg::gpu::detail {

// FNV-1a, 64 bits: enough to key and checksum cache files, and trivially portable.
uint64_t fnv1a64(std::span<const std::byte> bytes, uint64_t hash = 0xcbf29ce484222325ull);
uint64_t fnv1a64(std::string_view text, uint64_t hash = 0xcbf29ce484222325ull);

// A cache file is a 32-byte header (magic, format version, payload length, payload checksum)
// and the payload. Reading returns nothing for a missing, truncated or corrupt file.
std::optional<std::vector<std::byte>> read_cache_file(const std::filesystem::path& path);

// Writes through a temporary file and a rename, so concurrent processes never see half a file.
// Returns false (and leaves no temporary behind) when the file cannot be written.
bool write_cache_file(const std::filesystem::path& path, std::span<const std::byte> payload);

}  // namespace mg::gpu::detail
