#include "io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "io/atomic_file.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

// The reference implementation refuses larger headers; so do we, so that a corrupt length field
// cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  std::string_view name;
  size_t bytes;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32", 4},
                                     {DType::f16, "F16", 2},
                                     {DType::bf16, "BF16", 2},
                                     {DType::i32, "I32", 4},
                                     {DType::u32, "U32", 4}};

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::string shape_text(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Byte size of a tensor, or nullopt if a dimension is negative or the size overflows.
std::optional<uint64_t> tensor_bytes(const Shape& shape, DType dtype) {
  uint64_t bytes = safetensors_dtype_bytes(dtype);
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

// nlohmann's parse messages quote the offending input, which may hold newlines; errors must stay
// on one line.
std::string one_line(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return text;
}

struct Entry {
  std::string name;
  DType dtype;
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
        fail(" has a malformed header: metadata entry '" + key + "' is not a string");
      }
      metadata[key] = text.get<std::string>();
    }
    return metadata;
  }

  Entry entry(const std::string& name, const nlohmann::json& value) const {
    const std::string tensor = "tensor '" + name + "'";
    if (!value.is_object()) fail(" has a malformed header: " + tensor + " is not an object");
    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      fail(" has a malformed header: " + tensor + " has no dtype string");
    }
    const std::string dtype_name = dtype_it->get<std::string>();
    const std::optional<DType> dtype = dtype_from_safetensors_name(dtype_name);
    if (!dtype) {
      fail(": " + tensor + " has unsupported dtype '" + dtype_name +
           "' (supported: F32, F16, BF16, I32, U32)");
    }
    const auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) {
      fail(" has a malformed header: " + tensor + " has no shape array");
    }
    Shape shape;
    for (const nlohmann::json& dim : *shape_it) {
      if (!dim.is_number_unsigned()) {
        fail(" has a malformed header: " + tensor + " has a shape entry " + dim.dump() +
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
    const std::optional<uint64_t> expected = tensor_bytes(shape, *dtype);
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
        fail(" is truncated: tensor '" + entry.name + "' ends at byte " +
             std::to_string(entry.end) + " of the tensor data, but the file has only " +
             std::to_string(data_bytes) + " bytes of tensor data");
      }
      if (entry.begin < covered) {
        fail(" is corrupt: tensors '" + previous->name + "' and '" + entry.name +
             "' overlap in the tensor data");
      }
      if (entry.begin > covered) {
        fail(" is corrupt: " + std::to_string(entry.begin - covered) +
             " bytes of tensor data before tensor '" + entry.name + "' belong to no tensor");
      }
      covered = entry.end;
      previous = &entry;
    }
    if (covered < data_bytes) {
      fail(" is corrupt: " + std::to_string(data_bytes - covered) +
           " bytes of trailing data follow the last tensor");
    }
  }

 private:
  std::string prefix_;
};

}  // namespace

const TensorRecord* SafetensorsFile::find(std::string_view name) const {
  for (const TensorRecord& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  throw Error("dtype " + std::to_string(static_cast<int>(dtype)) + " has no safetensors name");
}

size_t safetensors_dtype_bytes(DType dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.bytes;
  }
  throw Error("dtype " + std::to_string(static_cast<int>(dtype)) + " has no safetensors name");
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file) {
  const std::string prefix = "cannot write safetensors file " + path.string() + ": ";
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  uint64_t offset = 0;
  for (const TensorRecord& tensor : file.tensors) {
    if (tensor.name.empty() || tensor.name == kMetadataKey) {
      throw Error(prefix + "invalid tensor name '" + tensor.name + "'");
    }
    if (header.contains(tensor.name)) {
      throw Error(prefix + "tensor name '" + tensor.name + "' is used twice");
    }
    const std::optional<uint64_t> expected = tensor_bytes(tensor.shape, tensor.dtype);
    if (!expected || *expected != tensor.bytes.size()) {
      throw Error(prefix + "tensor '" + tensor.name + "' has shape " + shape_text(tensor.shape) +
                  " and dtype " + std::string(safetensors_dtype_name(tensor.dtype)) + " but " +
                  std::to_string(tensor.bytes.size()) + " bytes");
    }
    header[tensor.name] = {{"dtype", safetensors_dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string header_text = header.dump();
  // Readers that map the file expect tensor data aligned to 8 bytes; the format pads with spaces.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();

  AtomicFileWriter writer(path);
  writer.write(std::as_bytes(std::span(&header_length, 1)));
  writer.write(header_text);
  for (const TensorRecord& tensor : file.tensors) writer.write(tensor.bytes);
  writer.commit();
}

SafetensorsFile read_safetensors(const std::filesystem::path& path, std::string_view what) {
  const std::vector<std::byte> bytes = read_whole_file(path, what);
  const HeaderParser parser(std::string(what) + " " + path.string());
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
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data()) + sizeof(uint64_t);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_length);
  } catch (const nlohmann::json::exception& error) {
    parser.fail(" has a malformed JSON header: " + one_line(error.what()));
  }
  if (!header.is_object()) parser.fail(" has a malformed header: it is not a JSON object");

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata = parser.metadata(value);
    } else {
      entries.push_back(parser.entry(name, value));
    }
  }
  const uint64_t data_bytes = after_length - header_length;
  parser.check_layout(entries, data_bytes);

  const std::byte* data = bytes.data() + sizeof(uint64_t) + header_length;
  file.tensors.reserve(entries.size());
  for (Entry& entry : entries) {
    file.tensors.push_back({std::move(entry.name), entry.dtype, std::move(entry.shape),
                            std::vector<std::byte>(data + entry.begin, data + entry.end)});
  }
  return file;
}

}  // namespace mg::io
