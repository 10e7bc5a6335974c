#include "data/fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <string>

#include "meganeura/error.hpp"

namespace mg::data {
namespace {

// idx magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the rank.
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr uint32_t kImagesMagic = 0x00000803;
// Guards against a corrupt header asking for an absurd allocation; real files are 28x28.
constexpr uint32_t kMaxSide = 4096;
// gzip (deflate) expands at most 1032-fold, so a header declaring more bytes than the compressed
// file can hold is refused before anything is allocated.
constexpr uint64_t kMaxDeflateRatio = 1032;

class GzipReader {
 public:
  explicit GzipReader(std::filesystem::path path) : path_(std::move(path)) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(path_, error)) {
      throw Error("Fashion-MNIST file " + path_.string() + " is missing");
    }
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) throw Error("cannot open Fashion-MNIST file " + path_.string());
  }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;
  ~GzipReader() { gzclose(file_); }

  void read(void* destination, size_t bytes, std::string_view what) {
    auto* out = static_cast<unsigned char*>(destination);
    while (bytes > 0) {
      // gzread takes an unsigned count; read in chunks so sizes above 4 GiB cannot wrap.
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30));
      const int got = gzread(file_, out, chunk);
      if (got < 0) {
        int code = 0;
        throw Error("Fashion-MNIST file " + path_.string() + " is corrupt while reading " +
                    std::string(what) + ": " + gzerror(file_, &code));
      }
      if (got == 0) {
        throw Error("Fashion-MNIST file " + path_.string() + " is truncated while reading " +
                    std::string(what));
      }
      out += got;
      bytes -= static_cast<size_t>(got);
    }
  }

  uint32_t read_big_endian_u32(std::string_view what) {
    std::array<unsigned char, 4> bytes{};
    read(bytes.data(), bytes.size(), what);
    return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
           uint32_t{bytes[3]};
  }

  void expect_magic(uint32_t expected, std::string_view kind) {
    const uint32_t magic = read_big_endian_u32("the magic number");
    if (magic != expected) {
      throw Error("Fashion-MNIST file " + path_.string() + " has magic number " +
                  std::to_string(magic) + ", expected " + std::to_string(expected) + " for " +
                  std::string(kind) + " (is it an idx file?)");
    }
  }

  // Extra bytes after the declared contents mean the header counts are wrong.
  void expect_end() {
    unsigned char extra = 0;
    if (gzread(file_, &extra, 1) != 0) {
      throw Error("Fashion-MNIST file " + path_.string() +
                  " has more data than its header declares");
    }
  }

  const std::filesystem::path& path() const { return path_; }

  // Throws unless the file (after the header) can hold `bytes` of `what`.
  void expect_room_for(uint64_t bytes, std::string_view what) const {
    std::error_code error;
    const uint64_t stored = std::filesystem::file_size(path_, error);
    if (!error && bytes / kMaxDeflateRatio > stored) {
      throw Error("Fashion-MNIST file " + path_.string() + " is corrupt: its header declares " +
                  std::to_string(bytes) + " bytes of " + std::string(what) + ", but the file has " +
                  std::to_string(stored) + " bytes, too few to hold them");
    }
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
};

}  // namespace

Dataset load_fashion_mnist(const std::filesystem::path& dir, std::string_view split,
                           int64_t limit) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    throw Error("Fashion-MNIST directory " + dir.string() +
                " does not exist; install it with `apt-get install dataset-fashion-mnist`");
  }
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test") {
    prefix = "t10k";
  } else {
    throw Error("unknown Fashion-MNIST split '" + std::string(split) +
                "'; use \"train\" or \"test\"");
  }

  GzipReader images(dir / (prefix + "-images-idx3-ubyte.gz"));
  GzipReader labels(dir / (prefix + "-labels-idx1-ubyte.gz"));
  images.expect_magic(kImagesMagic, "images");
  labels.expect_magic(kLabelsMagic, "labels");
  const uint32_t image_count = images.read_big_endian_u32("the image count");
  const uint32_t rows = images.read_big_endian_u32("the row count");
  const uint32_t cols = images.read_big_endian_u32("the column count");
  const uint32_t label_count = labels.read_big_endian_u32("the label count");
  if (image_count != label_count) {
    throw Error("Fashion-MNIST file " + images.path().string() + " has " +
                std::to_string(image_count) + " images but " + labels.path().string() + " has " +
                std::to_string(label_count) + " labels");
  }
  if (rows == 0 || cols == 0 || rows > kMaxSide || cols > kMaxSide) {
    throw Error("Fashion-MNIST file " + images.path().string() + " has an implausible image size " +
                std::to_string(rows) + "x" + std::to_string(cols));
  }

  if (image_count == 0) {
    throw Error("Fashion-MNIST file " + images.path().string() + " holds no images");
  }
  Dataset dataset;
  dataset.count = limit >= 0 ? std::min<int64_t>(limit, image_count) : image_count;
  images.expect_room_for(static_cast<uint64_t>(dataset.count) * rows * cols, "pixels");
  labels.expect_room_for(static_cast<uint64_t>(dataset.count), "labels");
  dataset.rows = rows;
  dataset.cols = cols;
  const size_t pixel_count = static_cast<size_t>(dataset.count) * rows * cols;

  std::vector<uint8_t> raw(std::max(pixel_count, static_cast<size_t>(dataset.count)));
  images.read(raw.data(), pixel_count, "pixels");
  dataset.images.resize(pixel_count);
  for (size_t i = 0; i < pixel_count; ++i) dataset.images[i] = raw[i] * (1.0f / 255.0f);

  labels.read(raw.data(), static_cast<size_t>(dataset.count), "labels");
  dataset.labels.resize(static_cast<size_t>(dataset.count));
  for (int64_t i = 0; i < dataset.count; ++i) {
    if (raw[i] >= kFashionMnistClasses.size()) {
      throw Error("Fashion-MNIST file " + labels.path().string() + " has label " +
                  std::to_string(raw[i]) + " at index " + std::to_string(i) + ", outside 0..9");
    }
    dataset.labels[i] = raw[i];
  }
  if (dataset.count == image_count) {
    images.expect_end();
    labels.expect_end();
  }
  return dataset;
}

}  // namespace mg::data
