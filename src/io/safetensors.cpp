#include "io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "io/atomic_file.hpp"
#include "io/json_limits.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

// The reference implementation refuses larger headers; so do we, so that a corrupt length field
// cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

// {"tensor": {"shape": [...]}}; metadata values are strings.
constexpr int kMaxHeaderNesting = 3;

struct StoredDTypeInfo {
  StoredDType dtype;
  std::string_view name;
  size_t bytes;
  DType held_as;  // see TensorView::dtype
  bool exact;     // held_as has the same storage
};
constexpr StoredDTypeInfo kStoredDTypes[] = {{StoredDType::f64, "F64", 8, DType::f32, false},
                                             {StoredDType::f32, "F32", 4, DType::f32, true},
                                             {StoredDType::f16, "F16", 2, DType::f16, true},
                                             {StoredDType::bf16, "BF16", 2, DType::bf16, true},
                                             {StoredDType::i64, "I64", 8, DType::i32, false},
                                             {StoredDType::i32, "I32", 4, DType::i32, true},
                                             {StoredDType::i16, "I16", 2, DType::i32, false},
                                             {StoredDType::i8, "I8", 1, DType::i32, false},
                                             {StoredDType::u64, "U64", 8, DType::i32, false},
                                             {StoredDType::u32, "U32", 4, DType::u32, true},
                                             {StoredDType::u16, "U16", 2, DType::i32, false},
                                             {StoredDType::u8, "U8", 1, DType::i32, false},
                                             {StoredDType::boolean, "BOOL", 1, DType::i32, false}};

const StoredDTypeInfo& dtype_info(StoredDType dtype) {
  for (const StoredDTypeInfo& entry : kStoredDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  throw Error("stored dtype " + std::to_string(static_cast<int>(dtype)) + " is unknown");
}

std::optional<StoredDType> stored_dtype_from_name(std::string_view name) {
  for (const StoredDTypeInfo& entry : kStoredDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::string stored_dtype_list(bool exact_only) {
  std::string list;
  for (const StoredDTypeInfo& entry : kStoredDTypes) {
    if (exact_only && !entry.exact) continue;
    list += (list.empty() ? "" : ", ") + std::string(entry.name);
  }
  return list;
}

struct Entry {
  std::string name;
  StoredDType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

class HeaderParser {
 public:
  explicit HeaderParser(std::string prefix) : prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& problem) const { throw Error(prefix_ + problem); }

  std::map<std::string, std::string> metadata(const nlohmann::json& value) const {
    if (!value.is_object()) fail(" has a malformed header: \"__metadata__\" is not an object");
    std::map<std::string, std::string> metadata;
    for (const auto& [key, text] : value.items()) {
      if (!text.is_string()) {
        fail(" has a malformed header: metadata entry '" + shortened(key) + "' is not a string");
      }
      metadata[key] = text.get<std::string>();
    }
    return metadata;
  }

  Entry entry(const std::string& name, const nlohmann::json& value) const {
    const std::string tensor = "tensor '" + shortened(name) + "'";
    if (!value.is_object()) fail(" has a malformed header: " + tensor + " is not an object");
    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      fail(" has a malformed header: " + tensor + " has no dtype string");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    const std::optional<StoredDType> dtype = stored_dtype_from_name(dtype_name);
    if (!dtype) {
      fail(": " + tensor + " has unsupported dtype '" + shortened(dtype_name) +
           "' (supported: " + stored_dtype_list(false) + ")");
    }
    const auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) {
      fail(" has a malformed header: " + tensor + " has no shape array");
    }
    Shape shape;
    for (const nlohmann::json& dim : *shape_it) {
      if (!dim.is_number_unsigned()) {
        fail(" has a malformed header: " + tensor + " has a shape entry " + json_excerpt(dim) +
             " that is not a non-negative integer");
      }
      shape.push_back(dim.get<int64_t>());
    }
    const auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      fail(" has a malformed header: " + tensor +
           " needs data_offsets [begin, end] of two non-negative integers");
    }
    Entry entry{name, *dtype, shape, (*offsets_it)[0].get<uint64_t>(),
                (*offsets_it)[1].get<uint64_t>()};
    if (entry.begin > entry.end) {
      fail(" has a malformed header: " + tensor + " has data_offsets " + offsets_it->dump() +
           " that end before they begin");
    }
    const std::optional<uint64_t> expected = stored_tensor_bytes(shape, *dtype);
    if (!expected) fail(" has a malformed header: " + tensor + " has an impossibly large shape");
    if (*expected != entry.end - entry.begin) {
      fail(" has a malformed header: " + tensor + " is " + dtype_name + " " + shape_text(shape) +
           " (" + std::to_string(*expected) + " bytes) but its data_offsets " + offsets_it->dump() +
           " span " + std::to_string(entry.end - entry.begin) + " bytes");
    }
    return entry;
  }

  // The format requires the tensors to tile the data section exactly: no overlaps, no holes, no
  // trailing bytes.
  void check_layout(std::vector<Entry>& entries, uint64_t data_bytes) const {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry& entry : entries) {
      if (entry.end > data_bytes) {
        fail(" is truncated: tensor '" + shortened(entry.name) + "' ends at byte " +
             std::to_string(entry.end) + " of the tensor data, but the file has only " +
             std::to_string(data_bytes) + " bytes of tensor data");
      }
      if (entry.begin < covered) {
        fail(" is corrupt: tensors '" + shortened(previous->name) + "' and '" +
             shortened(entry.name) + "' overlap in the tensor data");
      }
      if (entry.begin > covered) {
        fail(" is corrupt: " + std::to_string(entry.begin - covered) +
             " bytes of tensor data before tensor '" + shortened(entry.name) +
             "' belong to no tensor");
      }
      covered = entry.end;
      previous = &entry;
    }
    if (covered < data_bytes) {
      fail(" is corrupt: " + std::to_string(data_bytes - covered) +
           " bytes of trailing data follow the last tensor");
    }
  }

  // A header is an object of tensor objects holding shape arrays: three levels. Deeper text
  // is refused before parsing (io/json_limits.hpp says why).
  void check_nesting(std::string_view text) const {
    if (json_nesting(text, kMaxHeaderNesting) > kMaxHeaderNesting) {
      fail(" is corrupt: its JSON header nests deeper than the " +
           std::to_string(kMaxHeaderNesting) + " levels of a safetensors header");
    }
  }

 private:
  std::string prefix_;
};

struct ParsedFile {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // in data offset order
  const std::byte* data = nullptr;
};

ParsedFile parse_file(std::span<const std::byte> bytes, const HeaderParser& parser) {
  if (bytes.size() < sizeof(uint64_t)) {
    parser.fail(" is truncated: it has " + std::to_string(bytes.size()) +
                " bytes, fewer than the 8-byte header length");
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), sizeof(header_length));
  const uint64_t after_length = bytes.size() - sizeof(uint64_t);
  if (header_length > kMaxHeaderBytes) {
    parser.fail(" is corrupt: its header length field says " + std::to_string(header_length) +
                " bytes, more than the 100 MB the format allows");
  }
  if (header_length > after_length) {
    parser.fail(" is truncated: header says " + std::to_string(header_length) +
                " bytes of JSON, but only " + std::to_string(after_length) +
                " bytes follow the length field");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data()) + sizeof(uint64_t),
                                     header_length);
  parser.check_nesting(header_text);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    parser.fail(" has a malformed JSON header: " + shortened(std::string_view(error.what()), 160));
  }
  if (!header.is_object()) parser.fail(" has a malformed header: it is not a JSON object");

  ParsedFile file;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata = parser.metadata(value);
    } else {
      file.entries.push_back(parser.entry(name, value));
    }
  }
  parser.check_layout(file.entries, after_length - header_length);
  file.data = bytes.data() + sizeof(uint64_t) + header_length;
  return file;
}

}  // namespace

const TensorRecord* SafetensorsFile::find(std::string_view name) const {
  for (const TensorRecord& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::string_view stored_dtype_name(StoredDType dtype) {
  return dtype_info(dtype).name;
}

size_t stored_dtype_bytes(StoredDType dtype) {
  return dtype_info(dtype).bytes;
}

std::optional<uint64_t> stored_tensor_bytes(const Shape& shape, StoredDType dtype) {
  uint64_t bytes = stored_dtype_bytes(dtype);
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

std::string one_line(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return text;
}

std::string shape_text(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

StoredDType stored_dtype(DType dtype) {
  for (const StoredDTypeInfo& entry : kStoredDTypes) {
    if (entry.exact && entry.held_as == dtype) return entry.dtype;
  }
  throw Error("dtype " + std::to_string(static_cast<int>(dtype)) + " has no safetensors name");
}

std::optional<DType> exact_dtype(StoredDType dtype) {
  const StoredDTypeInfo& entry = dtype_info(dtype);
  if (!entry.exact) return std::nullopt;
  return entry.held_as;
}

std::string_view safetensors_dtype_name(DType dtype) {
  return stored_dtype_name(stored_dtype(dtype));
}

size_t safetensors_dtype_bytes(DType dtype) {
  return stored_dtype_bytes(stored_dtype(dtype));
}

MappedSafetensors MappedSafetensors::open(const std::filesystem::path& path,
                                          std::string_view what) {
  MappedSafetensors mapped;
  mapped.file_ = MappedFile::open(path, what);
  const HeaderParser parser(std::string(what) + " " + path.string());
  ParsedFile parsed = parse_file(mapped.file_.bytes(), parser);
  mapped.metadata_ = std::move(parsed.metadata);
  mapped.tensors_.reserve(parsed.entries.size());
  for (Entry& entry : parsed.entries) {
    mapped.tensors_.push_back(
        {std::move(entry.name), dtype_info(entry.dtype).held_as, std::move(entry.shape),
         std::span(parsed.data + entry.begin, entry.end - entry.begin), entry.dtype});
  }
  return mapped;
}

const TensorView* MappedSafetensors::find(std::string_view name) const {
  for (const TensorView& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     const std::map<std::string, std::string>& metadata,
                                     std::vector<TensorLayout> layouts)
    : error_prefix_("cannot write safetensors file " + path.string() + ": "),
      layouts_(std::move(layouts)) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const TensorLayout& layout : layouts_) {
    if (layout.name.empty() || layout.name == kMetadataKey) {
      throw Error(error_prefix_ + "invalid tensor name '" + layout.name + "'");
    }
    if (header.contains(layout.name)) {
      throw Error(error_prefix_ + "tensor name '" + layout.name + "' is used twice");
    }
    const std::optional<uint64_t> bytes =
        stored_tensor_bytes(layout.shape, stored_dtype(layout.dtype));
    if (!bytes) {
      throw Error(error_prefix_ + "tensor '" + layout.name + "' has an impossible shape " +
                  shape_text(layout.shape));
    }
    header[layout.name] = {{"dtype", safetensors_dtype_name(layout.dtype)},
                           {"shape", layout.shape},
                           {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  std::string header_text = header.dump();
  // Readers that map the file expect tensor data aligned to 8 bytes; the format pads with spaces.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();

  writer_.emplace(path);
  writer_->write(std::as_bytes(std::span(&header_length, 1)));
  writer_->write(header_text);
}

void SafetensorsWriter::write_next(std::span<const std::byte> bytes) {
  if (written_ == layouts_.size()) {
    throw Error(error_prefix_ + "more tensors written than the " + std::to_string(layouts_.size()) +
                " declared");
  }
  const TensorLayout& layout = layouts_[written_];
  const std::optional<uint64_t> expected =
      stored_tensor_bytes(layout.shape, stored_dtype(layout.dtype));
  if (*expected != bytes.size()) {
    throw Error(error_prefix_ + "tensor '" + layout.name + "' has shape " +
                shape_text(layout.shape) + " and dtype " +
                std::string(safetensors_dtype_name(layout.dtype)) + " but " +
                std::to_string(bytes.size()) + " bytes");
  }
  writer_->write(bytes);
  ++written_;
}

void SafetensorsWriter::commit() {
  if (written_ != layouts_.size()) {
    throw Error(error_prefix_ + "only " + std::to_string(written_) + " of " +
                std::to_string(layouts_.size()) + " tensors were written");
  }
  writer_->commit();
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file) {
  std::vector<TensorLayout> layouts;
  layouts.reserve(file.tensors.size());
  for (const TensorRecord& tensor : file.tensors) {
    layouts.push_back({tensor.name, tensor.dtype, tensor.shape});
  }
  SafetensorsWriter writer(path, file.metadata, std::move(layouts));
  for (const TensorRecord& tensor : file.tensors) writer.write_next(tensor.bytes);
  writer.commit();
}

SafetensorsFile read_safetensors(const std::filesystem::path& path, std::string_view what) {
  const MappedSafetensors mapped = MappedSafetensors::open(path, what);
  SafetensorsFile file;
  file.metadata = mapped.metadata();
  file.tensors.reserve(mapped.tensors().size());
  for (const TensorView& tensor : mapped.tensors()) {
    if (!exact_dtype(tensor.stored_dtype)) {
      throw Error(std::string(what) + " " + path.string() + ": tensor '" + tensor.name +
                  "' has unsupported dtype '" +
                  std::string(stored_dtype_name(tensor.stored_dtype)) +
                  "' (supported here: " + stored_dtype_list(true) + ")");
    }
    file.tensors.push_back({tensor.name, tensor.dtype, tensor.shape,
                            std::vector<std::byte>(tensor.bytes.begin(), tensor.bytes.end())});
  }
  return file;
}

}  // namespace mg::io
