#include "io/image.hpp"

#include <algorithm>
#include <string>

#include "meganeura/error.hpp"

namespace mg::io {
namespace {

struct AxisTap {
  int index;
  float weight;
};

// For each output position, the input positions that contribute and their weights.
std::vector<std::vector<AxisTap>> axis_taps(int in_size, int out_size) {
  std::vector<std::vector<AxisTap>> taps(static_cast<size_t>(out_size));
  const double scale = static_cast<double>(in_size) / out_size;
  for (int o = 0; o < out_size; ++o) {
    if (out_size < in_size) {
      // Area: average every input cell the output cell covers, weighted by overlap.
      const double begin = o * scale, end = (o + 1) * scale;
      for (int i = static_cast<int>(begin); i < in_size && i < end; ++i) {
        const double overlap = std::min<double>(end, i + 1) - std::max<double>(begin, i);
        if (overlap > 0) taps[o].push_back({i, static_cast<float>(overlap / scale)});
      }
    } else {
      // Bilinear with pixel centres aligned.
      const double x = std::clamp((o + 0.5) * scale - 0.5, 0.0, in_size - 1.0);
      const int left = static_cast<int>(x);
      const int right = std::min(left + 1, in_size - 1);
      const auto fraction = static_cast<float>(x - left);
      taps[o].push_back({left, 1.0f - fraction});
      if (right != left) taps[o].push_back({right, fraction});
    }
  }
  return taps;
}

}  // namespace

GrayImage to_gray(const Image& image) {
  GrayImage gray{image.width, image.height, {}};
  const size_t count = static_cast<size_t>(image.width) * image.height;
  gray.pixels.resize(count);
  const bool has_alpha = image.channels == 2 || image.channels == 4;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* pixel = &image.pixels[i * image.channels];
    float luma = image.channels >= 3 ? 0.299f * pixel[0] + 0.587f * pixel[1] + 0.114f * pixel[2]
                                     : static_cast<float>(pixel[0]);
    if (has_alpha) luma *= pixel[image.channels - 1] / 255.0f;
    gray.pixels[i] = luma / 255.0f;
  }
  return gray;
}

GrayImage resize(const GrayImage& image, int width, int height) {
  if (width <= 0 || height <= 0 || image.width <= 0 || image.height <= 0) {
    throw Error("cannot resize a " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " image to " + std::to_string(width) + "x" +
                std::to_string(height));
  }
  const auto column_taps = axis_taps(image.width, width);
  const auto row_taps = axis_taps(image.height, height);
  // Horizontal pass first, then vertical: separable, so cost is linear in each axis.
  std::vector<float> wide(static_cast<size_t>(width) * image.height, 0.0f);
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < width; ++x) {
      float sum = 0;
      for (const AxisTap& tap : column_taps[x])
        sum += tap.weight * image.pixels[y * image.width + tap.index];
      wide[y * width + x] = sum;
    }
  }
  GrayImage result{width, height, std::vector<float>(static_cast<size_t>(width) * height)};
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      float sum = 0;
      for (const AxisTap& tap : row_taps[y]) sum += tap.weight * wide[tap.index * width + x];
      result.pixels[y * width + x] = std::clamp(sum, 0.0f, 1.0f);
    }
  }
  return result;
}

}  // namespace mg::io
