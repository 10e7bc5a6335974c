#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

namespace mg::io {

// 8-bit interleaved pixels, row-major, `channels` per pixel: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
};

// One channel of floats in [0, 1], row-major.
struct GrayImage {
  int width = 0;
  int height = 0;
  std::vector<float> pixels;
};

// Decoding goes through stb_image (Debian's libstb-dev): PNG of any colour type and bit depth,
// palette and interlaced ones included (16-bit samples keep their high byte), baseline and
// progressive JPEG (CMYK ones convert to RGB), BMP, GIF (first frame) and TGA. `channels` is
// the file's own count (a palette PNG gives 3 or 4). Every reader throws mg::Error naming the
// file when it is missing, corrupt or of a kind stb cannot decode.

// Reads a PNG; chunk CRCs are checked first, so a damaged file is an error, never garbage.
Image read_png(const std::filesystem::path& path);
// Reads a binary (P5) or ASCII (P2) PGM; samples are rescaled from maxval to 0..255.
Image read_pgm(const std::filesystem::path& path);
// Picks the format from the file's first bytes: PGM, PNG, or whatever else stb decodes.
Image read_image(const std::filesystem::path& path);

// PNG with 1, 2, 3 or 4 channels (gray, gray+alpha, RGB, RGBA), zlib-compressed.
std::vector<std::byte> encode_png(const Image& image);
// Baseline JPEG of quality 1..100 from 1 (gray) or 3 (RGB) channels. stb stores both as colour,
// so a gray image reads back as three equal channels.
std::vector<std::byte> encode_jpeg(const Image& image, int quality = 90);
// Both write atomically (atomic_file.hpp). Images of another shape throw mg::Error naming `path`.
void write_png(const std::filesystem::path& path, const Image& image);
void write_jpeg(const std::filesystem::path& path, const Image& image, int quality = 90);

// Luma (ITU-R BT.601) scaled to [0, 1]. Alpha composites over black, so transparent areas read
// as the dark background Fashion-MNIST images have.
GrayImage to_gray(const Image& image);

// Resamples each axis with area averaging when shrinking and bilinear interpolation when
// growing, e.g. a photo down to the 28x28 a Fashion-MNIST model takes.
GrayImage resize(const GrayImage& image, int width, int height);

}  // namespace mg::io
