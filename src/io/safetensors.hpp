#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/atomic_file.hpp"
#include "io/mapped_file.hpp"
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

// Every element type of the safetensors format except the 8-bit floats. Meganeura computes in
// the DType ones; the others appear in PyTorch state dicts (BatchNorm's num_batches_tracked is
// I64, masks are BOOL) and are read through TensorView and tensor_as_f32 only.
enum class StoredDType : uint8_t {
  f64,
  f32,
  f16,
  bf16,
  i64,
  i32,
  i16,
  i8,
  u64,
  u32,
  u16,
  u8,
  boolean
};

std::string_view stored_dtype_name(StoredDType dtype);  // "F64", "BF16", "BOOL", ...
size_t stored_dtype_bytes(StoredDType dtype);
StoredDType stored_dtype(DType dtype);
// The DType with the same storage, or nullopt for F64, I64, I16, I8, U64, U16, U8 and BOOL.
std::optional<DType> exact_dtype(StoredDType dtype);

// The byte size of a tensor of `shape` stored as `dtype`, or nullopt if a dimension is negative or
// the size overflows.
std::optional<uint64_t> stored_tensor_bytes(const Shape& shape, StoredDType dtype);
// "[2, 3, 4]", as mg::shape_string prints it: the io layer builds and is tested without the IR
// layer that defines that one.
std::string shape_text(const Shape& shape);
// `text` with line breaks replaced by spaces: JSON parse errors quote the input, and error
// messages must stay on one line.
std::string one_line(std::string text);

// A tensor inside a memory-mapped safetensors file; `bytes` stay valid while the file (or the
// ModelFolder) that owns the mapping lives. The data may be unaligned: copy it out with memcpy,
// or convert it with tensor_as_f32 (tensor_values.hpp).
struct TensorView {
  std::string name;
  // The dtype Meganeura holds the values in: the stored one where Meganeura has it, f32 for F64
  // and i32 for the other integer types and BOOL.
  DType dtype = DType::f32;
  Shape shape;
  std::span<const std::byte> bytes;
  StoredDType stored_dtype = StoredDType::f32;  // exactly what the file holds
};

// A safetensors file mapped into memory and fully validated: header size (at most 100 MB) and
// JSON nesting (at most 128 levels, as the reference reader allows), names, dtypes, shapes, and
// data_offsets that tile the data section exactly (no overlap, hole or byte past the end).
class MappedSafetensors {
 public:
  // `what` names the kind of file in errors, e.g. "model folder shard".
  static MappedSafetensors open(const std::filesystem::path& path,
                                std::string_view what = "safetensors file");

  const std::filesystem::path& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }  // in data offset order
  // nullptr when no tensor has that name.
  const TensorView* find(std::string_view name) const;

 private:
  MappedFile file_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorView> tensors_;
};

// Where and how one tensor of a file being written is stored; its data follows the previous one's.
struct TensorLayout {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// Writes a safetensors file tensor by tensor, so that a writer holds one tensor's bytes at a
// time: the header comes from the declared layouts, then write_next() takes each tensor's bytes
// in that order, and commit() makes the file visible atomically (see atomic_file.hpp). Throws
// mg::Error if a name is empty, repeated or "__metadata__", if a byte count does not match its
// layout, or if commit() comes before every tensor was written.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path,
                    const std::map<std::string, std::string>& metadata,
                    std::vector<TensorLayout> layouts);
  void write_next(std::span<const std::byte> bytes);
  void commit();

 private:
  std::string error_prefix_;
  std::vector<TensorLayout> layouts_;
  size_t written_ = 0;
  std::optional<AtomicFileWriter> writer_;  // opened once the header is known to be valid
};

// Writes atomically (see atomic_file.hpp). Tensors are stored in the given order. Throws
// mg::Error if a name is empty, repeated or "__metadata__", or if a tensor's byte count does not
// match its shape and dtype.
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file);

// Reads and fully validates a file into memory (checkpoints; model weights are mapped instead,
// see MappedSafetensors and model_folder.hpp). Only DType dtypes are accepted. `what` names the
// kind of file in errors, e.g. "checkpoint" gives "checkpoint runs/a.safetensors is truncated:
// ...".
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 std::string_view what = "safetensors file");

}  // namespace mg::io
