#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

namespace mg::data {

// Where Debian's dataset-fashion-mnist package installs the idx files.
inline constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

inline constexpr std::array<std::string_view, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// Labelled grayscale images.
struct Dataset {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> images;    // [count, 1, rows, cols], scaled to [0, 1]
  std::vector<int32_t> labels;  // [count], each in [0, class count)

  int64_t image_size() const { return rows * cols; }
};

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. `split` is "train" or "test";
// `limit` >= 0 keeps only the first `limit` examples (and reads no further). Throws mg::Error
// naming the file on a missing directory or file, a bad magic number, mismatched counts, a
// truncated file or an out-of-range label.
Dataset load_fashion_mnist(const std::filesystem::path& dir, std::string_view split,
                           int64_t limit = -1);

}  // namespace mg::data
