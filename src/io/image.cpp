#include "io/image.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "io/atomic_file.hpp"
#include "meganeura/error.hpp"

// stb_image_write compresses PNG data with zlib instead of its own, weaker deflate.
static unsigned char* compress_with_zlib(unsigned char* data, int length, int* out_length,
                                         int level) {
  uLongf size = compressBound(static_cast<uLong>(length));
  auto* out = static_cast<unsigned char*>(std::malloc(size));
  if (out == nullptr) return nullptr;
  if (compress2(out, &size, data, static_cast<uLong>(length), std::clamp(level, 1, 9)) != Z_OK) {
    std::free(out);
    return nullptr;
  }
  *out_length = static_cast<int>(size);
  return out;
}

// stb is compiled here alone and kept file-local (STB_*_STATIC), so no other object file can
// clash with it. Its formats are limited to those the docs promise; the size cap keeps a corrupt
// header from asking for an absurd allocation.
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_TGA
#define STBI_MAX_DIMENSIONS (1 << 15)
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#define STBIW_ZLIB_COMPRESS compress_with_zlib
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace mg::io {
namespace {

constexpr std::array<uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr uint32_t kMaxSide = 1 << 15;

uint32_t read_big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = read_whole_file(path, "image");
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  return {begin, begin + bytes.size()};
}

bool has_png_signature(const std::vector<uint8_t>& file) {
  return file.size() >= kPngSignature.size() &&
         std::equal(kPngSignature.begin(), kPngSignature.end(), file.begin());
}

// Deflate expands at most 1032-fold; a PNG whose image data cannot inflate to the pixels its
// header declares is refused before anything that size is allocated.
constexpr uint64_t kMaxDeflateRatio = 1032;
// Each 8x8 block of a JPEG's first component takes at least one bit of entropy-coded data.
constexpr uint64_t kMinJpegPixelsPerByte = 8 * 64;
// The most pixels a byte of the other formats can stand for: an LZW code of GIF (at least 3
// bits, at most 4096 pixels), a byte of a 1-bit BMP (stb_image reads no compressed BMP), a TGA
// run-length packet (a count byte and at least one pixel value for up to 128 pixels) or a
// binary PNM sample.
constexpr uint64_t kMaxGifPixelsPerByte = 4096 * 8 / 3 + 1;
constexpr uint64_t kMaxBmpPixelsPerByte = 8;
constexpr uint64_t kMaxOtherPixelsPerByte = 128;
// Decoding allocates width x height x channels bytes; larger images are refused up front.
constexpr uint64_t kMaxPixels = uint64_t{1} << 26;

struct PngHeader {
  uint64_t idat_bytes = 0;  // the compressed image data, over all IDAT chunks
};

// stb_image does not verify chunk CRCs, so a flipped bit would decode to wrong pixels; walking
// the chunks first turns damage and truncation into errors, and gives the sizes checked before
// decoding.
PngHeader check_png_chunks(const std::filesystem::path& path, const std::vector<uint8_t>& file) {
  const auto fail = [&](const std::string& problem) {
    throw Error("PNG " + path.string() + " " + problem);
  };
  if (!has_png_signature(file)) fail("is not a PNG file (bad signature)");
  size_t offset = kPngSignature.size();
  PngHeader header;
  std::string previous;
  bool idat_ended = false;
  while (true) {
    if (offset + 12 > file.size()) fail("is truncated: it ends before the IEND chunk");
    const uint32_t length = read_big_endian_u32(&file[offset]);
    if (length > file.size() - offset - 12) fail("is truncated inside a chunk");
    const uint8_t* type = &file[offset + 4];
    std::string name(type, type + 4);
    if (!std::all_of(name.begin(), name.end(), [](char c) { return std::isalpha(c) != 0; })) {
      name = "(unnamed)";
    }
    if (crc32(crc32(0, type, 4), type + 4, length) != read_big_endian_u32(type + 4 + length)) {
      fail("is corrupt: chunk " + name + " fails its CRC check");
    }
    if (previous.empty()) {
      if (name != "IHDR" || length != 13) fail("is corrupt: it does not start with a 13-byte IHDR");
    } else if (name == "IHDR") {
      fail("is corrupt: it has a second IHDR chunk");
    } else if (name == "IDAT") {
      if (idat_ended) fail("is corrupt: its IDAT chunks are not consecutive");
      header.idat_bytes += length;
    } else if (previous == "IDAT") {
      idat_ended = true;
    }
    previous = name;
    offset += 12 + length;
    if (name == "IEND") break;
  }
  if (header.idat_bytes == 0) fail("is corrupt: it has no image data (IDAT)");
  return header;
}

// Where a JPEG's start marker 0xD8 is, or none where the file is no JPEG: stb_image takes a
// JPEG to start at any run of 0xFF bytes followed by it.
std::optional<size_t> jpeg_start_marker(const std::vector<uint8_t>& file) {
  size_t at = 0;
  while (at < file.size() && file[at] == 0xFF) ++at;
  if (at >= 1 && at < file.size() && file[at] == 0xD8) return at;
  return std::nullopt;
}

// stb_image (Debian's 2022 version) writes past its Huffman tables when a table declares more
// than 256 codes; the JPEG's markers are walked as stb reads them (segments by their lengths,
// entropy-coded data up to the next marker) and every table checked first.
void check_jpeg_huffman_tables(const std::filesystem::path& path, const std::vector<uint8_t>& file,
                               size_t start_marker) {
  size_t at = start_marker + 1;
  while (at < file.size()) {
    if (file[at] != 0xFF) {
      ++at;  // entropy-coded data, or bytes stb would stop at
      continue;
    }
    while (at < file.size() && file[at] == 0xFF) ++at;
    if (at >= file.size()) return;
    const uint8_t marker = file[at++];
    // Stuffed zero, restart markers and end of image carry no segment.
    if (marker == 0x00 || (marker >= 0xD0 && marker <= 0xD9) || marker == 0x01) continue;
    if (at + 2 > file.size()) return;
    const size_t length = size_t{file[at]} << 8 | file[at + 1];
    const size_t end = std::min(file.size(), at + length);
    if (marker == 0xC4) {
      size_t table = at + 2;
      while (table < end) {
        // stb reads zeros past the end of the file: a truncated table counts what it holds.
        size_t codes = 0;
        for (size_t i = table + 1; i <= table + 16 && i < file.size(); ++i) codes += file[i];
        if (codes > 256) {
          throw Error("JPEG " + path.string() + " is corrupt: a Huffman table declares " +
                      std::to_string(codes) + " codes (at most 256)");
        }
        table += 17 + codes;
      }
    }
    at = std::max(at + 2, at + length);
  }
}

// Refuses sizes no real file of this length can hold, before stb allocates for them.
void check_declared_size(const std::filesystem::path& path, const std::vector<uint8_t>& file,
                         const std::optional<PngHeader>& png) {
  if (file.size() > static_cast<size_t>(INT_MAX)) {
    throw Error("image " + path.string() + " is larger than 2 GiB, which stb_image cannot read");
  }
  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(file.data(), static_cast<int>(file.size()), &width, &height,
                             &channels)) {
    return;  // decoding says why
  }
  const uint64_t pixels = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  const std::string size = std::to_string(width) + "x" + std::to_string(height);
  if (pixels > kMaxPixels) {
    throw Error("image " + path.string() + " declares " + size + " pixels, more than the " +
                std::to_string(kMaxPixels) + " Meganeura reads; it is corrupt or needs resizing");
  }
  if (png) {
    if (pixels * static_cast<uint64_t>(channels) > png->idat_bytes * kMaxDeflateRatio) {
      throw Error("PNG " + path.string() + " is corrupt: it declares " + size + " but holds only " +
                  std::to_string(png->idat_bytes) +
                  " bytes of compressed image data, too few for that size");
    }
    return;
  }
  const auto starts_with = [&](std::string_view magic) {
    return file.size() >= magic.size() &&
           std::equal(magic.begin(), magic.end(), file.begin(),
                      [](char a, uint8_t b) { return static_cast<uint8_t>(a) == b; });
  };
  std::string format = "image";
  uint64_t most_pixels = 0;
  if (jpeg_start_marker(file)) {
    format = "JPEG";
    most_pixels = file.size() * kMinJpegPixelsPerByte;
  } else if (starts_with("GIF8")) {
    format = "GIF";
    most_pixels = file.size() * kMaxGifPixelsPerByte;
  } else if (starts_with("BM")) {
    format = "BMP";
    most_pixels = file.size() * kMaxBmpPixelsPerByte;
  } else {
    most_pixels = file.size() * kMaxOtherPixelsPerByte;
  }
  if (pixels > most_pixels) {
    throw Error(format + " " + path.string() + " is corrupt: it declares " + size +
                " but has only " + std::to_string(file.size()) + " bytes, too few for that size");
  }
}

// `png` holds what check_png_chunks found where the file is a PNG.
Image decode_with_stb(const std::filesystem::path& path, const std::vector<uint8_t>& file,
                      const std::optional<PngHeader>& png) {
  if (const std::optional<size_t> start = jpeg_start_marker(file))
    check_jpeg_huffman_tables(path, file, *start);
  check_declared_size(path, file, png);
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(file.data(), static_cast<int>(file.size()), &width, &height, &channels,
                            0),
      stbi_image_free);
  if (!pixels) {
    const std::string reason = stbi_failure_reason();
    if (reason == "unknown image type") {
      throw Error("image " + path.string() +
                  " is neither PNG, JPEG, BMP, GIF, TGA nor PGM (P2/P5)");
    }
    throw Error("image " + path.string() + " cannot be decoded (stb_image: " + reason +
                "); the file is corrupt or of an unsupported kind");
  }
  Image image{width, height, channels, {}};
  image.pixels.assign(pixels.get(), pixels.get() + static_cast<size_t>(width) * height * channels);
  return image;
}

class PgmParser {
 public:
  PgmParser(const std::filesystem::path& path, std::vector<uint8_t> file)
      : path_(path), file_(std::move(file)) {}

  Image parse() {
    if (file_.size() < 2 || file_[0] != 'P' || (file_[1] != '2' && file_[1] != '5')) {
      fail("is not a PGM file (expected P2 or P5)");
    }
    const bool binary = file_[1] == '5';
    offset_ = 2;
    const uint32_t width = header_number("width");
    const uint32_t height = header_number("height");
    const uint32_t max_value = header_number("maximum value");
    if (width == 0 || height == 0 || width > kMaxSide || height > kMaxSide) {
      fail("has an unsupported size " + std::to_string(width) + "x" + std::to_string(height));
    }
    if (max_value == 0 || max_value > 65535) {
      fail("has invalid maximum value " + std::to_string(max_value));
    }
    Image image{static_cast<int>(width), static_cast<int>(height), 1, {}};
    const size_t count = static_cast<size_t>(width) * height;
    image.pixels.resize(count);
    if (binary) ++offset_;  // exactly one whitespace byte separates the header from the samples
    const size_t sample_bytes = max_value > 255 ? 2 : 1;
    if (binary && file_.size() - std::min(offset_, file_.size()) < count * sample_bytes) {
      fail("is truncated: " + std::to_string(width) + "x" + std::to_string(height) + " needs " +
           std::to_string(count * sample_bytes) + " bytes of samples");
    }
    for (size_t i = 0; i < count; ++i) {
      uint32_t sample = 0;
      if (!binary) {
        sample = header_number("sample");
      } else if (sample_bytes == 2) {
        sample = (uint32_t{file_[offset_ + 2 * i]} << 8) | file_[offset_ + 2 * i + 1];
      } else {
        sample = file_[offset_ + i];
      }
      if (sample > max_value) fail("has sample " + std::to_string(sample) + " above its maximum");
      image.pixels[i] = static_cast<uint8_t>((sample * 255 + max_value / 2) / max_value);
    }
    return image;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error("PGM " + path_.string() + " " + problem);
  }

  // Skips whitespace and '#' comments, then reads one decimal number.
  uint32_t header_number(const char* what) {
    while (offset_ < file_.size()) {
      if (file_[offset_] == '#') {
        while (offset_ < file_.size() && file_[offset_] != '\n') ++offset_;
      } else if (std::isspace(file_[offset_])) {
        ++offset_;
      } else {
        break;
      }
    }
    if (offset_ >= file_.size() || !std::isdigit(file_[offset_])) {
      fail(std::string("is truncated or corrupt: expected the ") + what);
    }
    uint64_t value = 0;
    while (offset_ < file_.size() && std::isdigit(file_[offset_])) {
      value = value * 10 + (file_[offset_++] - '0');
      if (value > 0xFFFFFFFFu) fail(std::string("has an out-of-range ") + what);
    }
    return static_cast<uint32_t>(value);
  }

  std::filesystem::path path_;
  std::vector<uint8_t> file_;
  size_t offset_ = 0;
};

// JPEG holds gray or RGB only; PNG also gray+alpha and RGBA.
void check_encodable(const Image& image, std::string_view format, const std::string& where) {
  const bool jpeg = format == "JPEG";
  const bool channels_fit = jpeg ? image.channels == 1 || image.channels == 3
                                 : image.channels >= 1 && image.channels <= 4;
  if (!channels_fit || image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * image.channels ||
      static_cast<uint32_t>(std::max(image.width, image.height)) > kMaxSide) {
    throw Error("cannot write " + std::string(format) + where + ": the image is " +
                std::to_string(image.width) + "x" + std::to_string(image.height) + "x" +
                std::to_string(image.channels) + " with " + std::to_string(image.pixels.size()) +
                " bytes" + (jpeg ? " (JPEG takes 1 or 3 channels)" : ""));
  }
}

void append_to_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<std::byte>*>(context);
  const auto* bytes = static_cast<const std::byte*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

}  // namespace

Image read_png(const std::filesystem::path& path) {
  const std::vector<uint8_t> file = read_bytes(path);
  const PngHeader png = check_png_chunks(path, file);
  return decode_with_stb(path, file, png);
}

Image read_pgm(const std::filesystem::path& path) {
  return PgmParser(path, read_bytes(path)).parse();
}

Image read_image(const std::filesystem::path& path) {
  std::vector<uint8_t> file = read_bytes(path);
  if (file.size() >= 2 && file[0] == 'P' && (file[1] == '2' || file[1] == '5')) {
    return PgmParser(path, std::move(file)).parse();
  }
  std::optional<PngHeader> png;
  if (has_png_signature(file)) png = check_png_chunks(path, file);
  return decode_with_stb(path, file, png);
}

std::vector<std::byte> encode_png(const Image& image) {
  check_encodable(image, "PNG", "");
  std::vector<std::byte> out;
  if (!stbi_write_png_to_func(append_to_bytes, &out, image.width, image.height, image.channels,
                              image.pixels.data(), image.width * image.channels)) {
    throw Error("cannot encode a " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " PNG: out of memory");
  }
  return out;
}

std::vector<std::byte> encode_jpeg(const Image& image, int quality) {
  check_encodable(image, "JPEG", "");
  if (quality < 1 || quality > 100) {
    throw Error("JPEG quality must be 1..100, got " + std::to_string(quality));
  }
  std::vector<std::byte> out;
  if (!stbi_write_jpg_to_func(append_to_bytes, &out, image.width, image.height, image.channels,
                              image.pixels.data(), quality)) {
    throw Error("cannot encode a " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " JPEG");
  }
  return out;
}

void write_png(const std::filesystem::path& path, const Image& image) {
  check_encodable(image, "PNG", " " + path.string());
  write_file_atomically(path, encode_png(image));
}

void write_jpeg(const std::filesystem::path& path, const Image& image, int quality) {
  check_encodable(image, "JPEG", " " + path.string());
  write_file_atomically(path, encode_jpeg(image, quality));
}

}  // namespace mg::io
