#pragma once
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/types.hpp"

namespace mg::io {

// One tensor as stored: raw little-endian bytes in row-major order.
struct TensorRecord {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<std::byte> bytes;
};

// The contents of a .safetensors file (https://github.com/huggingface/safetensors): a u64 LE
// header length, a JSON header mapping names to {dtype, shape, data_offsets} plus an optional
// "__metadata__" string map, then the tensor data.
struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<TensorRecord> tensors;  // in file (data offset) order

  // nullptr when no tensor has that name.
  const TensorRecord* find(std::string_view name) const;
};

// Safetensors dtype names ("F32", "F16", "BF16", "I32", "U32") for the dtypes Meganeura has.
std::string_view safetensors_dtype_name(DType dtype);
size_t safetensors_dtype_bytes(DType dtype);

// Writes atomically (see atomic_file.hpp). Tensors are stored in the given order. Throws
// mg::Error if a name is empty, repeated or "__metadata__", or if a tensor's byte count does not
// match its shape and dtype.
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file);

// Reads and fully validates a file. `what` names the kind of file in errors, e.g. "checkpoint"
// gives "checkpoint runs/a.safetensors is truncated: ...".
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 std::string_view what = "safetensors file");

}  // namespace mg::io
