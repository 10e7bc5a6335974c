#pragma once
// torchvision's classification transforms on decoded images, ending in a normalised float
// tensor [3, size, size] (channel-planar, as a model's NCHW input wants): Resize + CenterCrop
// for evaluation, RandomResizedCrop + RandomHorizontalFlip for training, then Normalize.
#include <array>
#include <cstdint>
#include <random>
#include <span>

#include "io/image.hpp"

namespace mg::data {

inline constexpr std::array<float, 3> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd = {0.229f, 0.224f, 0.225f};

struct ImageTransform {
  int64_t size = 224;  // side of the square output
  // Evaluation: the shorter side is resized to resize_to (the longer keeps the aspect ratio),
  // then the centre size x size is cropped (zero-padded where the image is smaller). 0 crops
  // the decoded image without resizing.
  int64_t resize_to = 256;
  // Training: a random crop of min_area..1 of the image area with aspect ratio 3/4..4/3,
  // resized to size x size, instead of resize + centre crop.
  bool random_resized_crop = false;
  double min_area = 0.08;
  bool horizontal_flip = false;  // mirrors half of the images at random
  std::array<float, 3> mean = kImageNetMean;
  std::array<float, 3> std = kImageNetStd;
};

// torchvision's ImageNet recipes: Resize(size * 256 / 224) + CenterCrop(size), and
// RandomResizedCrop(size) + RandomHorizontalFlip(); both with ImageNet's mean and std.
ImageTransform imagenet_eval_transform(int64_t size = 224);
ImageTransform imagenet_train_transform(int64_t size = 224);

// A rectangle of source pixels: columns x .. x+width-1, rows y .. y+height-1.
struct CropBox {
  int64_t x = 0;
  int64_t y = 0;
  int64_t width = 0;
  int64_t height = 0;
};

// torchvision's RandomResizedCrop.get_params for an image of width x height with area scale
// [min_area, 1] and ratio [3/4, 4/3]: ten tries at a random box, then a centred fallback.
CropBox random_resized_crop_box(int64_t width, int64_t height, double min_area,
                                std::mt19937_64& random);

// Which output pixels of a resample to compute: columns first_x .. first_x+count_x-1 and rows
// first_y .. first_y+count_y-1. Pixels outside the full output are zero (a centre crop larger
// than the image pads), so a centre crop of a resized image costs only what it keeps.
struct ResampleWindow {
  int64_t first_x = 0;
  int64_t first_y = 0;
  int64_t count_x = 0;
  int64_t count_y = 0;
};

// Resamples `box` of the first `channels` channels of `image` to out_width x out_height with
// PIL's bilinear filter (a triangle widened by the shrink factor, so shrinking averages rather
// than aliases), in floats of 0..1, and writes the window, channel-planar ([channels, count_y,
// count_x]), to `out`.
void resample(const io::Image& image, int channels, const CropBox& box, int64_t out_width,
              int64_t out_height, const ResampleWindow& window, std::span<float> out);

// Applies `transform` to an 8-bit image of 1 to 4 channels and writes [3, size, size] floats
// to `out`: gray is repeated into three channels and alpha dropped (as PIL's convert("RGB")).
// `random` drives the random crop and flip. Throws mg::Error on an empty image or a wrong `out`
// size.
void apply_transform(const io::Image& image, const ImageTransform& transform,
                     std::mt19937_64& random, std::span<float> out);

// A uniform double in [0, 1) from 53 random bits; independent of the standard library.
double uniform01(std::mt19937_64& random);

}  // namespace mg::data
