#include "data/image_folder.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "io/image.hpp"
#include "meganeura/error.hpp"

namespace mg::data {
namespace {

bool is_image_extension(const std::filesystem::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png" ||
         extension == ".bmp" || extension == ".pgm";
}

bool is_hidden(const std::filesystem::path& path) {
  return path.filename().string().starts_with(".");
}

// splitmix64's finaliser: spreads every input bit over the output.
uint64_t mix(uint64_t value) {
  value += 0x9E3779B97F4A7C15ull;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

// The generator of one example's random transform: a function of (seed, epoch, example) only.
std::mt19937_64 example_random(uint64_t seed, int64_t epoch, int64_t example) {
  return std::mt19937_64(
      mix(seed ^ mix(static_cast<uint64_t>(epoch) ^ mix(static_cast<uint64_t>(example)))));
}

void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("cannot write " + path.string() + ": " + std::strerror(errno));
}

}  // namespace

ImageFolder::ImageFolder(const std::filesystem::path& root) : root_(root) {
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) {
    throw Error("image folder " + root.string() +
                " is not a folder; it needs one sub-folder of images per class");
  }
  try {
    scan();
  } catch (const std::filesystem::filesystem_error& failure) {
    throw Error("image folder " + root.string() + " cannot be read: " + failure.what());
  }
  if (samples_.empty()) {
    throw Error("image folder " + root.string() + " has no images: it needs one sub-folder per " +
                "class holding .jpg, .jpeg, .png, .bmp or .pgm files (found " +
                std::to_string(classes_.size()) + " class folders)");
  }
}

ImageFolder ImageFolder::subset(std::span<const int64_t> indices) const {
  if (indices.empty()) throw Error("a split of image folder " + root_.string() + " is empty");
  ImageFolder part;
  part.root_ = root_;
  part.classes_ = classes_;
  for (const int64_t index : indices) {
    if (index < 0 || index >= size()) {
      throw Error("example " + std::to_string(index) + " is outside image folder " +
                  root_.string() + " (" + std::to_string(size()) + " images)");
    }
    part.samples_.push_back(samples_[static_cast<size_t>(index)]);
  }
  return part;
}

void ImageFolder::scan() {
  const std::filesystem::path& root = root_;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (entry.is_directory() && !is_hidden(entry.path())) {
      classes_.push_back(entry.path().filename().string());
    }
  }
  std::sort(classes_.begin(), classes_.end());
  int64_t other_files = 0;
  std::filesystem::path other_example;
  for (size_t label = 0; label < classes_.size(); ++label) {
    std::vector<std::filesystem::path> paths;
    const auto options = std::filesystem::directory_options::follow_directory_symlink |
                         std::filesystem::directory_options::skip_permission_denied;
    for (auto it = std::filesystem::recursive_directory_iterator(root / classes_[label], options);
         it != std::filesystem::recursive_directory_iterator(); ++it) {
      const std::filesystem::directory_entry& entry = *it;
      if (is_hidden(entry.path())) {
        if (entry.is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (entry.is_directory()) continue;
      if (!is_image_extension(entry.path())) {
        if (other_files++ == 0) other_example = entry.path();
      } else if (entry.file_size(error) == 0) {
        std::cerr << "image folder: skipping " << entry.path().string() << ": the file is empty\n";
      } else {
        paths.push_back(entry.path());
      }
    }
    if (paths.empty()) {
      std::cerr << "image folder: class " << classes_[label] << " ("
                << (root / classes_[label]).string() << ") has no images; it keeps label " << label
                << " but no examples\n";
    }
    std::sort(paths.begin(), paths.end());
    for (auto& path : paths) samples_.push_back({std::move(path), static_cast<int32_t>(label)});
  }
  if (other_files > 0) {
    std::cerr << "image folder: ignoring " << other_files
              << " files that are not .jpg, .jpeg, .png, .bmp or .pgm (such as "
              << other_example.string() << ")\n";
  }
}

ImageFolderBatcher::ImageFolderBatcher(const ImageFolder& folder, ImageBatcherOptions options)
    : folder_(folder), options_(std::move(options)) {
  if (options_.batch_size <= 0) {
    throw Error("batch size must be positive, got " + std::to_string(options_.batch_size));
  }
  if (options_.drop_last && options_.batch_size > folder.size()) {
    throw Error("batch size " + std::to_string(options_.batch_size) +
                " is larger than image folder " + folder.root().string() + " (" +
                std::to_string(folder.size()) + " images), so every batch would be dropped");
  }
  const Shard& shard = options_.shard;
  if (shard.count <= 0 || shard.index < 0 || shard.index >= shard.count)
    throw Error("shard " + std::to_string(shard.index) + " of " + std::to_string(shard.count) +
                " does not exist");
  if (shard.count > 1 && (!options_.drop_last || options_.batch_size % shard.count != 0))
    throw Error("a batch of " + std::to_string(options_.batch_size) +
                " images cannot be split into " + std::to_string(shard.count) +
                " equal shards: give a batch size they divide (and full batches only)");
  const ImageTransform& transform = options_.transform;
  if (transform.size < 1 || transform.size > 4096 || transform.resize_to < 0 ||
      transform.min_area <= 0 || transform.min_area > 1 ||
      std::any_of(transform.std.begin(), transform.std.end(), [](float s) { return s <= 0; })) {
    throw Error(
        "image transform needs a size of 1..4096, resize_to >= 0, min_area in (0, 1] "
        "and positive std; got size " +
        std::to_string(transform.size));
  }
  if (options_.workers <= 0) {
    options_.workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  if (options_.prefetch <= 0) options_.prefetch = 2 * options_.workers;
  start_workers();
}

ImageFolderBatcher::~ImageFolderBatcher() {
  stop_workers();
}

int64_t ImageFolderBatcher::batches_per_epoch() const {
  const int64_t count = folder_.size(), batch = options_.batch_size;
  return options_.drop_last ? count / batch : (count + batch - 1) / batch;
}

int64_t ImageFolderBatcher::epoch() const {
  std::lock_guard lock(mutex_);
  return consumed_ == 0 ? 0 : (consumed_ - 1) / batches_per_epoch();
}

bool ImageFolderBatcher::epoch_finished() const {
  std::lock_guard lock(mutex_);
  return consumed_ > 0 && consumed_ % batches_per_epoch() == 0;
}

BatcherState ImageFolderBatcher::state() const {
  std::lock_guard lock(mutex_);
  BatcherState state{options_.seed, options_.batch_size, 0, 0};
  if (consumed_ > 0) {
    state.epoch = (consumed_ - 1) / batches_per_epoch();
    state.position = std::min((consumed_ - state.epoch * batches_per_epoch()) * options_.batch_size,
                              folder_.size());
  }
  return state;
}

void ImageFolderBatcher::restore(const BatcherState& state) {
  if (state.seed != options_.seed || state.batch_size != options_.batch_size) {
    throw Error("cannot resume batches saved with seed " + std::to_string(state.seed) +
                " and batch size " + std::to_string(state.batch_size) + " into a run with seed " +
                std::to_string(options_.seed) + " and batch size " +
                std::to_string(options_.batch_size));
  }
  if (state.epoch < 0 || state.position < 0 || state.position > folder_.size() ||
      (state.position % options_.batch_size != 0 && state.position != folder_.size())) {
    throw Error("cannot resume image batches at epoch " + std::to_string(state.epoch) +
                " position " + std::to_string(state.position) + ": image folder " +
                folder_.root().string() + " has " + std::to_string(folder_.size()) +
                " images in batches of " + std::to_string(options_.batch_size));
  }
  stop_workers();
  const int64_t batches = (state.position + options_.batch_size - 1) / options_.batch_size;
  consumed_ = state.epoch * batches_per_epoch() + std::min(batches, batches_per_epoch());
  start_workers();
}

void ImageFolderBatcher::start_workers() {
  std::lock_guard lock(mutex_);
  stopping_ = false;
  next_to_produce_ = consumed_;
  ready_.clear();
  failed_.clear();
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { work(); });
}

void ImageFolderBatcher::stop_workers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

void ImageFolderBatcher::work() {
  while (true) {
    int64_t batch_index = 0;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock,
                    [&] { return stopping_ || next_to_produce_ < consumed_ + options_.prefetch; });
      if (stopping_) return;
      batch_index = next_to_produce_++;
    }
    try {
      Batch batch = produce(batch_index);
      std::lock_guard lock(mutex_);
      ready_.emplace(batch_index, std::move(batch));
    } catch (...) {
      std::lock_guard lock(mutex_);
      failed_.emplace(batch_index, std::current_exception());
    }
    changed_.notify_all();
  }
}

int64_t ImageFolderBatcher::next(std::span<float> images, std::span<int32_t> labels) {
  const auto batch = static_cast<size_t>(shard_size());
  if (images.size() < batch * image_floats() || labels.size() < batch) {
    throw Error("batch buffers hold " + std::to_string(images.size()) + " floats and " +
                std::to_string(labels.size()) + " labels, but a batch of " + std::to_string(batch) +
                " images needs " + std::to_string(batch * image_floats()) + " and " +
                std::to_string(batch));
  }
  Batch ready;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.count(consumed_) || failed_.count(consumed_); });
    if (const auto failed = failed_.find(consumed_); failed != failed_.end()) {
      std::rethrow_exception(failed->second);
    }
    ready = std::move(ready_.at(consumed_));
    ready_.erase(consumed_);
    ++consumed_;
  }
  changed_.notify_all();
  std::copy(ready.images.begin(), ready.images.end(), images.begin());
  std::copy(ready.labels.begin(), ready.labels.end(), labels.begin());
  return ready.count;
}

std::shared_ptr<const std::vector<uint32_t>> ImageFolderBatcher::order_of(int64_t epoch) {
  std::lock_guard lock(mutex_);
  auto& order = orders_[epoch];
  if (!order) {
    order = std::make_shared<const std::vector<uint32_t>>(
        epoch_order(folder_.size(), options_.seed, epoch, options_.shuffle));
    // Workers run at most a few batches apart, so only the last epochs' orders are kept.
    orders_.erase(orders_.begin(), orders_.lower_bound(epoch - 1));
  }
  return order;
}

io::Image ImageFolderBatcher::decode(int64_t index, int64_t& decoded_index) {
  const int64_t count = folder_.size();
  for (int64_t step = 0; step < count; ++step) {
    const int64_t candidate = (index + step) % count;
    {
      std::lock_guard lock(mutex_);
      if (bad_examples_.count(candidate)) continue;
    }
    const std::filesystem::path& path = folder_.samples()[static_cast<size_t>(candidate)].path;
    try {
      io::Image image = io::read_image(path);
      decoded_index = candidate;
      return image;
    } catch (const Error& error) {
      std::lock_guard lock(mutex_);
      if (bad_examples_.insert(candidate).second) {
        std::cerr << "image folder: skipping " << path.string() << ": " << error.what() << "\n";
      }
    }
  }
  throw Error("image folder " + folder_.root().string() + ": none of its " + std::to_string(count) +
              " images can be decoded");
}

ImageFolderBatcher::Batch ImageFolderBatcher::produce(int64_t batch_index) {
  const int64_t per_epoch = batches_per_epoch();
  const int64_t epoch = batch_index / per_epoch;
  // Shards exist only with full batches (drop_last), so only a single shard is ever short.
  const int64_t start =
      (batch_index % per_epoch) * options_.batch_size + options_.shard.index * shard_size();
  const std::shared_ptr<const std::vector<uint32_t>> order = order_of(epoch);
  Batch batch;
  batch.count = std::min(shard_size(), folder_.size() - start);
  const auto floats = static_cast<size_t>(image_floats());
  batch.images.resize(static_cast<size_t>(batch.count) * floats);
  batch.labels.resize(static_cast<size_t>(batch.count));
  for (int64_t i = 0; i < batch.count; ++i) {
    const int64_t example = (*order)[static_cast<size_t>(start + i)];
    int64_t decoded = example;
    const io::Image image = decode(example, decoded);
    std::mt19937_64 random = example_random(options_.seed, epoch, example);
    apply_transform(image, options_.transform, random,
                    std::span(batch.images).subspan(static_cast<size_t>(i) * floats, floats));
    batch.labels[static_cast<size_t>(i)] = folder_.samples()[static_cast<size_t>(decoded)].label;
  }
  return batch;
}

std::vector<std::string> fashion_mnist_folder_names() {
  std::vector<std::string> names;
  for (size_t label = 0; label < kFashionMnistClasses.size(); ++label) {
    std::string name = std::to_string(label) + "-";
    for (char c : kFashionMnistClasses[label]) {
      name += std::isalnum(static_cast<unsigned char>(c))
                  ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
                  : '-';
    }
    names.push_back(std::move(name));
  }
  return names;
}

void write_image_folder(const Dataset& dataset, const std::filesystem::path& dir, int size,
                        const std::vector<std::string>& class_names) {
  if (size < 1 || size > 4096) {
    throw Error("image folder " + dir.string() + ": image size must be 1..4096, got " +
                std::to_string(size));
  }
  for (int32_t label : dataset.labels) {
    if (label < 0 || static_cast<size_t>(label) >= class_names.size()) {
      throw Error("image folder " + dir.string() + ": label " + std::to_string(label) +
                  " has no class name (" + std::to_string(class_names.size()) + " given)");
    }
  }
  for (const std::string& name : class_names) std::filesystem::create_directories(dir / name);
  const int digits = std::max<int>(5, static_cast<int>(std::to_string(dataset.count).size()));
  const auto pixels = static_cast<size_t>(dataset.image_size());
  std::vector<float> resized(static_cast<size_t>(size) * size);
  for (int64_t i = 0; i < dataset.count; ++i) {
    io::Image source{static_cast<int>(dataset.cols), static_cast<int>(dataset.rows), 1, {}};
    source.pixels.resize(pixels);
    for (size_t k = 0; k < pixels; ++k) {
      const float value = dataset.images[static_cast<size_t>(i) * pixels + k];
      source.pixels[k] = static_cast<uint8_t>(std::lround(std::clamp(value, 0.0f, 1.0f) * 255.0f));
    }
    resample(source, 1, {0, 0, dataset.cols, dataset.rows}, size, size, {0, 0, size, size},
             resized);
    io::Image image{size, size, 1, std::vector<uint8_t>(resized.size())};
    for (size_t k = 0; k < resized.size(); ++k) {
      image.pixels[k] =
          static_cast<uint8_t>(std::lround(std::clamp(resized[k], 0.0f, 1.0f) * 255.0f));
    }
    std::string name = std::to_string(i);
    name.insert(0, static_cast<size_t>(std::max(0, digits - static_cast<int>(name.size()))), '0');
    write_bytes(dir / class_names[static_cast<size_t>(dataset.labels[static_cast<size_t>(i)])] /
                    (name + ".png"),
                io::encode_png(image));
  }
}

void write_fashion_image_folder(const std::filesystem::path& fashion_dir,
                                const std::filesystem::path& out_dir, int size, int64_t limit) {
  std::error_code error;
  if (std::filesystem::exists(out_dir, error)) {
    throw Error("image folder " + out_dir.string() +
                " already exists; remove it or choose another folder");
  }
  const Dataset train = load_fashion_mnist(fashion_dir, "train", limit);
  const Dataset test = load_fashion_mnist(fashion_dir, "test", limit);
  std::filesystem::path partial = out_dir;
  partial += ".partial";
  std::filesystem::remove_all(partial);
  const std::vector<std::string> names = fashion_mnist_folder_names();
  write_image_folder(train, partial / "train", size, names);
  write_image_folder(test, partial / "test", size, names);
  std::filesystem::rename(partial, out_dir, error);
  if (error) {
    throw Error("cannot rename " + partial.string() + " to " + out_dir.string() + ": " +
                error.message());
  }
}

}  // namespace mg::data
