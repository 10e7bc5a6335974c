#pragma once
// Matmul epilogues: a pointwise DAG (bias, activation, residual add, ...) evaluated on every
// element a GEMM produces, inside the GEMM, instead of in a pointwise kernel of its own. Every
// GEMM kernel (gemm.comp, gemm_cpu.comp, the cooperative-matrix kernel) stores its output
// through `void store_c(uint z, uint m, uint n, float value)`, generated here, so the epilogue
// is independent of the kernel that computes the product.
#include <string>
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"

namespace mg::kernels {

// `dag` consumes the matmul's product as its input `product_input` (dag.inputs[product_input]
// is the matmul node); the fused launch writes dag.output instead of the product. Every value
// of the DAG has the matmul's output shape; its other inputs broadcast to it.
struct MatmulEpilogue {
  PointwiseDag dag;
  size_t product_input = 0;
};

// GLSL that defines `void store_c(uint z, uint m, uint n, float value)` for the matmul node
// `matmul` (result [batch..., M, N]; z is the flat batch index) together with the helper
// functions it calls. Without an epilogue it writes `value` to the product; with one, it
// evaluates the epilogue's DAG at (z, m, n) and writes the DAG's result, and its extra outputs
// (values the graph keeps or reads elsewhere) beside it. Appends the operands it reads and
// writes to `launch.operands`: the written result, named "c", then the epilogue's bound inputs,
// named "epilogue<k>" (uniform constants become literals and bind nothing), then the extra
// outputs, "epilogue_extra<k>". With `moved_to` (a transpose that alone reads the result,
// through reshapes: fusion.cpp's transposed stores) it writes the transpose's value instead, each
// element where the transpose moves it.
std::string matmul_store_function(const Graph& graph, ValueId matmul,
                                  const MatmulEpilogue* epilogue, Launch& launch,
                                  ValueId moved_to = kNoValue);

// How many storage buffers a GEMM launch for `epilogue` binds (a, b, the result, the
// epilogue's bound inputs and its extra outputs), to keep fusion within
// DeviceTraits::max_storage_buffers.
uint32_t matmul_epilogue_bindings(const Graph& graph, const MatmulEpilogue& epilogue);

// The launches of matmul node `matmul` with `epilogue` (where given) fused into its store, which
// writes transpose `moved_to`'s value where given (matmul.cpp).
std::vector<Launch> lower_matmul_with_epilogue(const Graph& graph, ValueId matmul,
                                               const MatmulEpilogue* epilogue, ValueId moved_to,
                                               const DeviceTraits& device, std::string label);

}  // namespace mg::kernels
