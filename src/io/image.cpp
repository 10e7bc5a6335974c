#include "io/image.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/atomic_file.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

constexpr std::array<uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
// Caps a corrupt header's claim so it cannot request an absurd allocation.
constexpr uint32_t kMaxSide = 1 << 15;

uint32_t read_big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

void append_big_endian_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = read_whole_file(path, "image");
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  return {begin, begin + bytes.size()};
}

// Channels of each 8-bit PNG colour type we decode; 0 for the others.
int png_channels(uint8_t color_type) {
  switch (color_type) {
    case 0:
      return 1;
    case 2:
      return 3;
    case 4:
      return 2;
    case 6:
      return 4;
    default:
      return 0;
  }
}

uint8_t png_color_type(int channels) {
  constexpr std::array<uint8_t, 5> kTypes = {0, 0, 4, 2, 6};
  return kTypes[static_cast<size_t>(channels)];
}

uint8_t paeth(int left, int up, int up_left) {
  const int estimate = left + up - up_left;
  const int to_left = std::abs(estimate - left);
  const int to_up = std::abs(estimate - up);
  const int to_up_left = std::abs(estimate - up_left);
  if (to_left <= to_up && to_left <= to_up_left) return static_cast<uint8_t>(left);
  if (to_up <= to_up_left) return static_cast<uint8_t>(up);
  return static_cast<uint8_t>(up_left);
}

class PngDecoder {
 public:
  PngDecoder(const std::filesystem::path& path, std::vector<uint8_t> file)
      : path_(path), file_(std::move(file)) {}

  Image decode() {
    if (file_.size() < kPngSignature.size() ||
        !std::equal(kPngSignature.begin(), kPngSignature.end(), file_.begin())) {
      fail("is not a PNG file (bad signature)");
    }
    std::vector<uint8_t> compressed;
    size_t offset = kPngSignature.size();
    bool have_header = false;
    while (true) {
      if (offset + 12 > file_.size()) fail("is truncated: it ends before the IEND chunk");
      const uint32_t length = read_big_endian_u32(&file_[offset]);
      const uint8_t* type = &file_[offset + 4];
      if (length > file_.size() - offset - 12) fail("is truncated inside a chunk");
      const uint8_t* data = type + 4;
      const uint32_t stored_crc = read_big_endian_u32(data + length);
      if (crc32(crc32(0, type, 4), data, length) != stored_crc) {
        fail("is corrupt: chunk " + std::string(type, type + 4) + " fails its CRC check");
      }
      const std::string name(type, type + 4);
      offset += 12 + length;
      if (!have_header && name != "IHDR") fail("is corrupt: it does not start with IHDR");
      if (name == "IHDR") {
        parse_header(data, length);
        have_header = true;
      } else if (name == "IDAT") {
        compressed.insert(compressed.end(), data, data + length);
      } else if (name == "IEND") {
        break;
      } else if (name == "PLTE") {
        fail("uses a palette, which is not supported; save it as gray or RGB");
      } else if (std::isupper(static_cast<unsigned char>(name[0]))) {
        fail("has an unknown critical chunk " + name);
      }
    }
    return unfilter(inflate_rows(compressed));
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error("PNG " + path_.string() + " " + problem);
  }

  void parse_header(const uint8_t* data, uint32_t length) {
    if (length != 13) fail("is corrupt: IHDR has " + std::to_string(length) + " bytes, not 13");
    const uint32_t width = read_big_endian_u32(data);
    const uint32_t height = read_big_endian_u32(data + 4);
    const uint8_t bit_depth = data[8], color_type = data[9], interlace = data[12];
    if (width == 0 || height == 0 || width > kMaxSide || height > kMaxSide) {
      fail("has an unsupported size " + std::to_string(width) + "x" + std::to_string(height));
    }
    if (color_type == 3) fail("uses a palette, which is not supported; save it as gray or RGB");
    if (png_channels(color_type) == 0)
      fail("has invalid colour type " + std::to_string(color_type));
    if (bit_depth != 8) {
      fail("has " + std::to_string(bit_depth) + "-bit samples; only 8-bit PNGs are supported");
    }
    if (data[10] != 0 || data[11] != 0) fail("uses an unknown compression or filter method");
    if (interlace != 0) fail("is interlaced, which is not supported; save it non-interlaced");
    image_.width = static_cast<int>(width);
    image_.height = static_cast<int>(height);
    image_.channels = png_channels(color_type);
  }

  size_t row_bytes() const { return static_cast<size_t>(image_.width) * image_.channels; }

  std::vector<uint8_t> inflate_rows(std::vector<uint8_t>& compressed) const {
    const size_t expected = (row_bytes() + 1) * image_.height;
    // One spare byte tells "exactly the expected size" apart from "more data than expected".
    std::vector<uint8_t> rows(expected + 1);
    z_stream stream{};
    if (inflateInit(&stream) != Z_OK) fail("cannot be decoded: zlib failed to start");
    stream.next_in = compressed.data();
    stream.avail_in = static_cast<uInt>(compressed.size());
    stream.next_out = rows.data();
    stream.avail_out = static_cast<uInt>(rows.size());
    const int result = inflate(&stream, Z_FINISH);
    const size_t produced = stream.total_out;
    inflateEnd(&stream);
    if (result == Z_DATA_ERROR || result == Z_NEED_DICT || result == Z_MEM_ERROR) {
      fail("is corrupt: its image data does not decompress");
    }
    if (produced != expected) {
      fail("is corrupt: its image data decompresses to " +
           std::string(result == Z_STREAM_END ? "" : "at least ") + std::to_string(produced) +
           " bytes, but " + std::to_string(image_.width) + "x" + std::to_string(image_.height) +
           " needs " + std::to_string(expected));
    }
    if (result != Z_STREAM_END) fail("is truncated: its compressed image data ends early");
    rows.pop_back();
    return rows;
  }

  Image unfilter(const std::vector<uint8_t>& rows) {
    const size_t stride = row_bytes();
    const size_t bpp = static_cast<size_t>(image_.channels);
    image_.pixels.resize(stride * image_.height);
    const std::vector<uint8_t> zero_row(stride, 0);
    for (int y = 0; y < image_.height; ++y) {
      const uint8_t filter = rows[y * (stride + 1)];
      const uint8_t* in = &rows[y * (stride + 1) + 1];
      uint8_t* out = &image_.pixels[y * stride];
      const uint8_t* up = y > 0 ? out - stride : zero_row.data();
      for (size_t x = 0; x < stride; ++x) {
        const int left = x >= bpp ? out[x - bpp] : 0;
        const int up_left = x >= bpp ? up[x - bpp] : 0;
        int predicted = 0;
        switch (filter) {
          case 0:
            predicted = 0;
            break;
          case 1:
            predicted = left;
            break;
          case 2:
            predicted = up[x];
            break;
          case 3:
            predicted = (left + up[x]) / 2;
            break;
          case 4:
            predicted = paeth(left, up[x], up_left);
            break;
          default:
            fail("is corrupt: row " + std::to_string(y) + " has unknown filter " +
                 std::to_string(filter));
        }
        out[x] = static_cast<uint8_t>(in[x] + predicted);
      }
    }
    return std::move(image_);
  }

  std::filesystem::path path_;
  std::vector<uint8_t> file_;
  Image image_;
};

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

void append_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  append_big_endian_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_offset = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0, &out[type_offset], static_cast<uInt>(out.size() - type_offset));
  append_big_endian_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

Image read_png(const std::filesystem::path& path) {
  return PngDecoder(path, read_bytes(path)).decode();
}

Image read_pgm(const std::filesystem::path& path) {
  return PgmParser(path, read_bytes(path)).parse();
}

Image read_image(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  if (bytes.size() >= 2 && bytes[0] == 'P' && (bytes[1] == '2' || bytes[1] == '5')) {
    return PgmParser(path, std::move(bytes)).parse();
  }
  if (bytes.size() >= 2 && bytes[0] == kPngSignature[0] && bytes[1] == kPngSignature[1]) {
    return PngDecoder(path, std::move(bytes)).decode();
  }
  throw Error("image " + path.string() + " is neither a PNG nor a PGM (P2/P5) file");
}

void write_png(const std::filesystem::path& path, const Image& image) {
  if (image.channels < 1 || image.channels > 4 || image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * image.channels) {
    throw Error("cannot write PNG " + path.string() + ": the image is " +
                std::to_string(image.width) + "x" + std::to_string(image.height) + "x" +
                std::to_string(image.channels) + " but has " + std::to_string(image.pixels.size()) +
                " bytes");
  }
  const size_t stride = static_cast<size_t>(image.width) * image.channels;
  std::vector<uint8_t> rows;
  rows.reserve((stride + 1) * image.height);
  for (int y = 0; y < image.height; ++y) {
    rows.push_back(0);  // filter "None"; charts are mostly flat colour and compress well anyway
    rows.insert(rows.end(), image.pixels.begin() + y * stride,
                image.pixels.begin() + (y + 1) * stride);
  }
  uLongf compressed_size = compressBound(static_cast<uLong>(rows.size()));
  std::vector<uint8_t> compressed(compressed_size);
  if (compress2(compressed.data(), &compressed_size, rows.data(), rows.size(), 6) != Z_OK) {
    throw Error("cannot write PNG " + path.string() + ": zlib compression failed");
  }
  compressed.resize(compressed_size);

  std::vector<uint8_t> header;
  append_big_endian_u32(header, static_cast<uint32_t>(image.width));
  append_big_endian_u32(header, static_cast<uint32_t>(image.height));
  header.insert(header.end(), {8, png_color_type(image.channels), 0, 0, 0});
  std::vector<uint8_t> out(kPngSignature.begin(), kPngSignature.end());
  append_chunk(out, "IHDR", header);
  append_chunk(out, "IDAT", compressed);
  append_chunk(out, "IEND", {});
  write_file_atomically(path, std::as_bytes(std::span(out)));
}

}  // namespace mg::io
