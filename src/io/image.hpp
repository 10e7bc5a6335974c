#pragma once
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

// Reads an 8-bit, non-interlaced PNG (gray, gray+alpha, RGB or RGBA). Throws mg::Error naming
// the file for anything else (palette, 16-bit, interlaced) or for a corrupt file.
Image read_png(const std::filesystem::path& path);
// Reads a binary (P5) or ASCII (P2) PGM; samples are rescaled from maxval to 0..255.
Image read_pgm(const std::filesystem::path& path);
// Picks read_png or read_pgm from the file's first bytes.
Image read_image(const std::filesystem::path& path);

// Writes a PNG with 1, 2, 3 or 4 channels (gray, gray+alpha, RGB, RGBA), atomically.
void write_png(const std::filesystem::path& path, const Image& image);

// Luma (ITU-R BT.601) scaled to [0, 1]. Alpha composites over black, so transparent areas read
// as the dark background Fashion-MNIST images have.
GrayImage to_gray(const Image& image);

// Resamples each axis with area averaging when shrinking and bilinear interpolation when
// growing, e.g. a photo down to the 28x28 a Fashion-MNIST model takes.
GrayImage resize(const GrayImage& image, int width, int height);

}  // namespace mg::io
