#include "data/image_transforms.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <string>
#include <vector>

#include "meganeura/error.hpp"

namespace mg::data {
namespace {

struct Taps {
  int64_t first = 0;           // first source index
  std::vector<float> weights;  // one per source index from `first`; empty outside the output
};

// PIL's precompute_coeffs for the bilinear filter, for output indices first .. first+count-1
// of a resize of [box_start, box_start + box_size) to out_size. Taps stay inside the box, as
// torchvision crops before it resizes.
std::vector<Taps> axis_taps(int64_t box_start, int64_t box_size, int64_t out_size, int64_t first,
                            int64_t count) {
  const double scale = static_cast<double>(box_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1 before widening
  std::vector<Taps> taps(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t output = first + i;
    if (output < 0 || output >= out_size) continue;
    const double center = (static_cast<double>(output) + 0.5) * scale;  // in box coordinates
    const int64_t low = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t high = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), box_size);
    Taps& tap = taps[static_cast<size_t>(i)];
    tap.first = box_start + low;
    double total = 0;
    for (int64_t source = low; source < high; ++source) {
      const double distance = std::abs((static_cast<double>(source) - center + 0.5) / filter_scale);
      const double weight = distance < 1.0 ? 1.0 - distance : 0.0;
      tap.weights.push_back(static_cast<float>(weight));
      total += weight;
    }
    if (total > 0) {
      for (float& weight : tap.weights) weight = static_cast<float>(weight / total);
    }
  }
  return taps;
}

// Python's round() (ties to even), as torchvision's crop arithmetic uses.
int64_t round_half_even(double value) {
  const int previous = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double rounded = std::nearbyint(value);
  std::fesetround(previous);
  return static_cast<int64_t>(rounded);
}

// Integer in [0, bound], independent of the standard library's distributions.
int64_t uniform_int(std::mt19937_64& random, int64_t bound) {
  return static_cast<int64_t>(
      (static_cast<unsigned __int128>(random()) * static_cast<uint64_t>(bound + 1)) >> 64);
}

// torchvision CenterCrop's offset of a `size` crop in `extent` pixels; negative where it pads.
int64_t centre_offset(int64_t extent, int64_t size) {
  if (size > extent) return -((size - extent) / 2);
  return round_half_even(static_cast<double>(extent - size) / 2.0);
}

}  // namespace

ImageTransform imagenet_eval_transform(int64_t size) {
  ImageTransform transform;
  transform.size = size;
  transform.resize_to = size * 256 / 224;
  return transform;
}

ImageTransform imagenet_train_transform(int64_t size) {
  ImageTransform transform;
  transform.size = size;
  transform.random_resized_crop = true;
  transform.horizontal_flip = true;
  return transform;
}

double uniform01(std::mt19937_64& random) {
  return static_cast<double>(random() >> 11) * 0x1.0p-53;
}

CropBox random_resized_crop_box(int64_t width, int64_t height, double min_area,
                                std::mt19937_64& random) {
  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double log_low = std::log(3.0 / 4.0), log_high = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (min_area + (1.0 - min_area) * uniform01(random));
    const double aspect = std::exp(log_low + (log_high - log_low) * uniform01(random));
    const int64_t crop_width = round_half_even(std::sqrt(target_area * aspect));
    const int64_t crop_height = round_half_even(std::sqrt(target_area / aspect));
    if (crop_width > 0 && crop_width <= width && crop_height > 0 && crop_height <= height) {
      const int64_t top = uniform_int(random, height - crop_height);
      const int64_t left = uniform_int(random, width - crop_width);
      return {left, top, crop_width, crop_height};
    }
  }
  // Centred fallback with the aspect ratio clamped into [3/4, 4/3].
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t crop_width = width, crop_height = height;
  if (ratio < 3.0 / 4.0) {
    crop_height = round_half_even(static_cast<double>(width) / (3.0 / 4.0));
  } else if (ratio > 4.0 / 3.0) {
    crop_width = round_half_even(static_cast<double>(height) * (4.0 / 3.0));
  }
  return {(width - crop_width) / 2, (height - crop_height) / 2, crop_width, crop_height};
}

void resample(const io::Image& image, int channels, const CropBox& box, int64_t out_width,
              int64_t out_height, const ResampleWindow& window, std::span<float> out) {
  const size_t plane = static_cast<size_t>(window.count_x * window.count_y);
  if (channels < 1 || channels > image.channels || out.size() != plane * channels ||
      out_width < 1 || out_height < 1 || box.width < 1 || box.height < 1 || box.x < 0 ||
      box.y < 0 || box.x + box.width > image.width || box.y + box.height > image.height) {
    throw Error("cannot resample a " + std::to_string(image.width) + "x" +
                std::to_string(image.height) + " image's box at (" + std::to_string(box.x) + ", " +
                std::to_string(box.y) + ") of " + std::to_string(box.width) + "x" +
                std::to_string(box.height) + " to " + std::to_string(out_width) + "x" +
                std::to_string(out_height));
  }
  const std::vector<Taps> columns =
      axis_taps(box.x, box.width, out_width, window.first_x, window.count_x);
  const std::vector<Taps> rows =
      axis_taps(box.y, box.height, out_height, window.first_y, window.count_y);
  // Horizontal pass over the source rows the vertical taps read, then the vertical pass.
  int64_t row_low = image.height, row_high = 0;
  for (const Taps& tap : rows) {
    if (tap.weights.empty()) continue;
    row_low = std::min(row_low, tap.first);
    row_high = std::max(row_high, tap.first + static_cast<int64_t>(tap.weights.size()));
  }
  const int64_t row_count = std::max<int64_t>(row_high - row_low, 0);
  std::vector<float> wide(static_cast<size_t>(row_count * window.count_x * channels));
  const size_t stride = static_cast<size_t>(image.width) * image.channels;
  for (int64_t y = 0; y < row_count; ++y) {
    const uint8_t* source = image.pixels.data() + static_cast<size_t>(row_low + y) * stride;
    for (int64_t x = 0; x < window.count_x; ++x) {
      const Taps& tap = columns[static_cast<size_t>(x)];
      for (int c = 0; c < channels; ++c) {
        float sum = 0;
        for (size_t k = 0; k < tap.weights.size(); ++k) {
          sum += tap.weights[k] * source[(static_cast<size_t>(tap.first) + k) * image.channels + c];
        }
        wide[(static_cast<size_t>(c) * row_count + y) * window.count_x + x] = sum * (1.0f / 255.0f);
      }
    }
  }
  for (int c = 0; c < channels; ++c) {
    for (int64_t y = 0; y < window.count_y; ++y) {
      const Taps& tap = rows[static_cast<size_t>(y)];
      float* target = out.data() + c * plane + static_cast<size_t>(y * window.count_x);
      for (int64_t x = 0; x < window.count_x; ++x) {
        float sum = 0;
        for (size_t k = 0; k < tap.weights.size(); ++k) {
          const int64_t row = tap.first + static_cast<int64_t>(k) - row_low;
          sum += tap.weights[k] *
                 wide[(static_cast<size_t>(c) * row_count + row) * window.count_x + x];
        }
        target[x] = sum;
      }
    }
  }
}

void apply_transform(const io::Image& image, const ImageTransform& transform,
                     std::mt19937_64& random, std::span<float> out) {
  const int64_t size = transform.size;
  const size_t plane = static_cast<size_t>(size * size);
  if (size < 1 || out.size() != 3 * plane) {
    throw Error("image transform to " + std::to_string(size) + "x" + std::to_string(size) +
                " needs " + std::to_string(3 * plane) + " floats, got " +
                std::to_string(out.size()));
  }
  if (image.width < 1 || image.height < 1 || image.channels < 1 || image.channels > 4) {
    throw Error("cannot transform an empty or " + std::to_string(image.channels) +
                "-channel image");
  }
  CropBox box{0, 0, image.width, image.height};
  int64_t out_width = image.width, out_height = image.height;
  ResampleWindow window{0, 0, size, size};
  if (transform.random_resized_crop) {
    box = random_resized_crop_box(image.width, image.height, transform.min_area, random);
    out_width = out_height = size;
  } else {
    if (transform.resize_to > 0) {
      // torchvision Resize(int): the shorter side becomes resize_to, the longer one
      // int(resize_to * long / short).
      const int64_t shorter = std::min(image.width, image.height);
      const int64_t longer = std::max(image.width, image.height);
      const auto resized_longer = static_cast<int64_t>(static_cast<double>(transform.resize_to) *
                                                       longer / static_cast<double>(shorter));
      out_width = image.width <= image.height ? transform.resize_to : resized_longer;
      out_height = image.width <= image.height ? resized_longer : transform.resize_to;
    }
    window.first_x = centre_offset(out_width, size);
    window.first_y = centre_offset(out_height, size);
  }
  const int channels = image.channels >= 3 ? 3 : 1;
  resample(image, channels, box, out_width, out_height, window, out.subspan(0, plane * channels));
  if (channels == 1) {
    std::copy_n(out.begin(), plane, out.begin() + plane);
    std::copy_n(out.begin(), plane, out.begin() + 2 * plane);
  }
  if (transform.horizontal_flip && uniform01(random) < 0.5) {
    for (size_t row = 0; row < 3 * static_cast<size_t>(size); ++row) {
      std::reverse(out.begin() + row * size, out.begin() + (row + 1) * size);
    }
  }
  for (size_t c = 0; c < 3; ++c) {
    const float mean = transform.mean[c], inverse_std = 1.0f / transform.std[c];
    for (size_t i = c * plane; i < (c + 1) * plane; ++i) out[i] = (out[i] - mean) * inverse_std;
  }
}

}  // namespace mg::data
