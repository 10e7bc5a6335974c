#pragma once
// Small GLSL generators shared by the archetypes that compute element coordinates from a flat
// index with shapes baked in as constants.
#include <string>
#include <vector>

#include "meganeura/types.hpp"

namespace mg::kernels {

// Declares uint c0..c{rank-1} (prefix `c` by default) as the coordinates of flat index
// `flat` in `shape`.
std::string coordinates_glsl(const Shape& shape, const std::string& flat,
                             const std::string& prefix = "c");

// A reduction's rows: the kept axes of `shape` index the row (o, row-major over them, the order
// of the result) and the axes in `reduced_axes` the position within it (r, row-major over them).
// `index_function` defines `uint input_index(uint o, uint r)`, the flat index of that element;
// adjacent axes of one kind that are contiguous in memory are one axis there (fewer divisions a
// load), and neither o nor r is reduced modulo its range: callers pass o < rows and
// r < row_length.
struct RowLayout {
  int64_t rows = 1;
  int64_t row_length = 1;
  std::string index_function;
};
RowLayout row_layout(const Shape& shape, const std::vector<int64_t>& reduced_axes);

// "c0 * 12u + c1 * 4u + c2" for `shape` using the given coordinate names (row-major).
std::string flat_index_glsl(const Shape& shape, const std::vector<std::string>& coordinates);

// `uint <function>(uint i)` for a transpose by `permutation` of `input` into `output`: where it
// puts element i of its input (`forward`), or where its element i comes from in its input.
std::string transpose_index_function_glsl(const std::vector<int64_t>& permutation,
                                          const Shape& input, const Shape& output,
                                          const std::string& function, bool forward);

std::string glsl_uint(int64_t value);  // "12u"
std::string glsl_float(double value);  // a float literal that round-trips f32 ("0.5", "1e-05")

// `text` with every occurrence of `from` replaced by `to` (renaming generated functions).
std::string replace_all(std::string text, const std::string& from, const std::string& to);

// Declares `array`, an array of `vector_type` (vec4 over f32, ivec4 over i32, ...) over the
// storage buffer at `binding` (aliasing its scalar declaration), for 16-byte loads (and stores
// when `write`); the planner aligns every value to at least 256 bytes, so element 4 i starts
// vector i.
std::string vector_buffer_view(const std::string& array, size_t binding, bool write,
                               const std::string& vector_type = "vec4");

}  // namespace mg::kernels
