#pragma once
// Image classification data sets stored as torchvision's ImageFolder: one sub-folder per class
// (classes sorted by name, label = index), image files anywhere below it. Batches are decoded,
// transformed (image_transforms.hpp) and assembled by background threads, in an order and with
// random crops that depend only on the seed. docs/RESNET.md describes the rules.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "data/batcher.hpp"
#include "data/fashion_mnist.hpp"
#include "data/image_transforms.hpp"

namespace mg::data {

struct ImageFolderSample {
  std::filesystem::path path;
  int32_t label = 0;
};

class ImageFolder {
 public:
  // Scans `root`: each sub-folder (hidden ones aside) is a class, and every .jpg, .jpeg, .png,
  // .bmp and .pgm file below it (any case, sub-folders included, sorted by path) an example.
  // Empty files and class folders without images are named on stderr and skipped (an empty
  // class keeps its label, so labels follow the folder listing); files with other extensions
  // are counted in one note. Throws mg::Error when `root` is not a folder or no image is left.
  explicit ImageFolder(const std::filesystem::path& root);

  const std::filesystem::path& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<ImageFolderSample>& samples() const { return samples_; }
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }

  // The examples at `indices` (positions in samples(), each below size()) with the same root
  // and classes, in the order given: a training or held-out split. Throws mg::Error when
  // `indices` is empty or out of range.
  ImageFolder subset(std::span<const int64_t> indices) const;

 private:
  ImageFolder() = default;
  void scan();  // lists classes and samples; filesystem errors escape as filesystem_error

  std::filesystem::path root_;
  std::vector<std::string> classes_;
  std::vector<ImageFolderSample> samples_;
};

struct ImageBatcherOptions {
  int64_t batch_size = 32;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = true;  // skip each epoch's final partial batch
  ImageTransform transform;
  int workers = 0;   // decoding threads; 0 picks the hardware's thread count, at most 8
  int prefetch = 0;  // batches prepared ahead of the consumer; 0 picks twice the workers
  // The part of each batch this rank of a data-parallel run takes (batch_size stays the whole
  // batch, which the shard count must divide, with drop_last).
  Shard shard;
};

// Hands out batches of an ImageFolder, images [batch, 3, size, size] (transformed and
// normalised) and labels [batch], prepared by background threads. The order of epoch e is
// epoch_order(size, seed, e) (as Batcher's), and the random crop and flip of an example depend
// only on (seed, epoch, example), so runs and restored runs repeat exactly whatever the thread
// timing. With a shard, only that shard of each batch is decoded and handed out; the state
// (epoch, position) counts whole batches, as one process's would. A file that fails to decode is
// named on stderr once and replaced, wherever it falls, by the next example in folder order that
// decodes; next() throws mg::Error when none does.
class ImageFolderBatcher {
 public:
  // The folder must outlive the batcher. Throws mg::Error on a bad batch size or transform.
  ImageFolderBatcher(const ImageFolder& folder, ImageBatcherOptions options);
  ~ImageFolderBatcher();
  ImageFolderBatcher(const ImageFolderBatcher&) = delete;
  ImageFolderBatcher& operator=(const ImageFolderBatcher&) = delete;

  // Waits for this shard of the next batch, copies it into `images` (at least shard_size() *
  // image_floats()) and `labels` (at least shard_size()) and returns its example count (less
  // than shard_size() only for an epoch's last batch without drop_last). Rethrows a worker's
  // error.
  int64_t next(std::span<float> images, std::span<int32_t> labels);

  int64_t batch_size() const { return options_.batch_size; }
  int64_t shard_size() const { return options_.batch_size / options_.shard.count; }
  int64_t image_floats() const { return 3 * options_.transform.size * options_.transform.size; }
  int64_t batches_per_epoch() const;
  int64_t epoch() const;
  bool epoch_finished() const;  // the next call to next() starts a new epoch

  BatcherState state() const;
  // Continues from a saved state (same seed and batch size, a position on a batch boundary).
  // Throws mg::Error otherwise.
  void restore(const BatcherState& state);

 private:
  struct Batch {
    std::vector<float> images;
    std::vector<int32_t> labels;
    int64_t count = 0;
  };

  void start_workers();
  void stop_workers();
  void work();
  Batch produce(int64_t batch_index);
  std::shared_ptr<const std::vector<uint32_t>> order_of(int64_t epoch);
  // Decodes example `index`, or the next one in folder order that decodes.
  io::Image decode(int64_t index, int64_t& decoded_index);

  const ImageFolder& folder_;
  ImageBatcherOptions options_;
  int64_t consumed_ = 0;  // global index (over epochs) of the next batch next() returns

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  int64_t next_to_produce_ = 0;
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> failed_;
  std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> orders_;
  std::set<int64_t> bad_examples_;
  std::vector<std::thread> workers_;
};

// Writes a grayscale data set as an image folder under `dir`: <dir>/<class>/<index>.png, each
// image resampled to size x size (PIL's bilinear filter). `class_names` gives the folder of
// each label; names must sort in label order for the folder to read back with the same labels.
void write_image_folder(const Dataset& dataset, const std::filesystem::path& dir, int size,
                        const std::vector<std::string>& class_names);

// Folder names for Fashion-MNIST's classes that sort in label order: "0-t-shirt-top",
// "1-trouser", ..., "9-ankle-boot".
std::vector<std::string> fashion_mnist_folder_names();

// Writes Fashion-MNIST (idx files in `fashion_dir`) as <out_dir>/train and <out_dir>/test image
// folders of size x size PNGs; `limit` >= 0 keeps the first `limit` images of each split. It
// writes into "<out_dir>.partial" and renames that when done, so an interrupted run leaves no
// half folder at `out_dir`. Throws mg::Error when `out_dir` exists or on a bad size.
void write_fashion_image_folder(const std::filesystem::path& fashion_dir,
                                const std::filesystem::path& out_dir, int size, int64_t limit = -1);

}  // namespace mg::data
