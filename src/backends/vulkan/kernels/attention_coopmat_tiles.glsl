// Shared by the cooperative-matrix attention kernels (attention.cpp puts it before them): moving
// row blocks of f32 operands into f16 tiles in shared memory. A tile row of `width` elements is
// padded by 8 halves (16 bytes: an odd stride in 16-byte units, so that the 8 rows a fragment
// load reads fall in distinct banks). A thread reads a vec4 from global memory and stores it as
// one uvec2 of 4 halves. Everything here is a macro, expanded after the kernel's extensions and
// THREADS.

// Vec4s of a block of `rows` rows, and how many each thread moves.
#define ATTENTION_VECTORS(rows, width) ((rows) * (width) / 4)
#define ATTENTION_LOADS(rows, width) ((ATTENTION_VECTORS(rows, width) + THREADS - 1) / THREADS)
// Shared-memory uvec2s (4 halves) of a tile row, padding included: one 16-byte unit of padding
// makes the stride an odd number of units.
#define ATTENTION_ROW_UVEC2S(width) ((width) / 4 + 2)

#define QUARTER_HALVES(value) \
  uvec2(packFloat2x16(f16vec2((value).xy)), packFloat2x16(f16vec2((value).zw)))

// Rows row0 .. row0 + rows - 1 of the matrix whose rows (`width` elements) start at row `base` of
// the vec4 view `source4`, into `registers` (ATTENTION_LOADS(rows, width) vec4s), consecutive
// threads on consecutive vec4s: zeros for rows from `limit` on.
#define ATTENTION_FETCH(registers, source4, base, row0, limit, rows, width, t)               \
  [[unroll]] for (uint r_ = 0; r_ < ATTENTION_LOADS(rows, width); ++r_) {                \
    uint e_ = (t) + r_ * THREADS, row_ = (row0) + e_ / ((width) / 4);                      \
    bool inside_ = row_ < (limit) && e_ < ATTENTION_VECTORS(rows, width);                  \
    registers[r_] = inside_ ? source4[((base) + row_) * ((width) / 4) + e_ % ((width) / 4)] \
                            : vec4(0.0);                                                   \
  }

// The same through a function: `load4(i)` is vec4 i of the rows.
#define ATTENTION_FETCH_BY(registers, load4, base, row0, limit, rows, width, t)          \
  [[unroll]] for (uint r_ = 0; r_ < ATTENTION_LOADS(rows, width); ++r_) {                \
    uint e_ = (t) + r_ * THREADS, row_ = (row0) + e_ / ((width) / 4);                      \
    bool inside_ = row_ < (limit) && e_ < ATTENTION_VECTORS(rows, width);                  \
    registers[r_] = inside_ ? load4(((base) + row_) * ((width) / 4) + e_ % ((width) / 4)) \
                            : vec4(0.0);                                                   \
  }

// The fetched rows, times `scale`, into the tile at uvec2 `offset` of the uvec2 array `tiles`.
#define ATTENTION_STASH(tiles, offset, registers, scale, rows, width, t)                     \
  [[unroll]] for (uint r_ = 0; r_ < ATTENTION_LOADS(rows, width); ++r_) {                \
    uint e_ = (t) + r_ * THREADS;                                                           \
    if (e_ < ATTENTION_VECTORS(rows, width))                                                \
      tiles[(offset) + (e_ / ((width) / 4)) * ATTENTION_ROW_UVEC2S(width) + e_ % ((width) / 4)] = \
          QUARTER_HALVES(registers[r_] * (scale));                                          \
  }

// The backward kernels' factor for dO (attention.cpp: SCALED_GRAD_OUT, GRAD_OUT_MAX_HEADS,
// GRADIENT_MAXIMUM, SMALLEST_MAXIMUM): GRADIENT_MAXIMUM / max |dO|. SCALED_GRAD_OUT=1: the max
// of batch entry b (and kv head kv_head where grad_out_max has one per kv head), read from
// grad_out_max; 2: the largest |dO| of the rows the workgroup reads, which the kernel finds
// itself (GRAD_OUT_SCALE is 1 until then); 0: 1. The gradients are linear in dO: the kernels
// multiply dO (and so delta) by it and divide their results by it.
#ifdef SCALED_GRAD_OUT
#define GRAD_OUT_FACTOR(largest) (float(GRADIENT_MAXIMUM) / max((largest), float(SMALLEST_MAXIMUM)))
#if SCALED_GRAD_OUT == 1
#define GRAD_OUT_SCALE(b, kv_head)                                                       \
  GRAD_OUT_FACTOR(                                                                       \
      grad_out_max[(b)*GRAD_OUT_MAX_HEADS + (GRAD_OUT_MAX_HEADS == 1u ? 0u : (kv_head))])
#else
#define GRAD_OUT_SCALE(b, kv_head) 1.0
#endif
#endif

// The largest magnitude of a vec4's elements.
#define ATTENTION_LARGEST4(value)                                          \
  max(max(abs((value).x), abs((value).y)), max(abs((value).z), abs((value).w)))

// The largest `value` of the workgroup's threads into `result`, through the shared float array
// `maxima` (one element a subgroup of 32 lanes); ends with every thread past a barrier.
#define ATTENTION_WORKGROUP_MAX(result, value, maxima, warp, lane)                              \
  {                                                                                             \
    float m_ = (value);                                                                         \
    [[unroll]] for (uint s_ = 1; s_ < 32; s_ *= 2) m_ = max(m_, subgroupShuffleXor(m_, s_));  \
    if ((lane) == 0) maxima[(warp)] = m_;                                                       \
    barrier();                                                                                  \
    result = maxima[0];                                                                         \
    [[unroll]] for (uint w_ = 1; w_ < WARPS; ++w_) result = max(result, maxima[w_]);           \
  }
